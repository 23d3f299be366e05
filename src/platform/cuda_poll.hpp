#pragma once
// Waiting on the host for GPU work to complete (a stream or an event), bounded, without burning a
// core: the one poll loop the connections and the Comm share.
//
//   if (!pollUntilReady([&] { return cudaEventQuery(e); }, deadlineAfter(timeout), "cudaEventQuery"))
//     throw TimeoutError(...);   // the caller names the rank, the peer and what it waited for
#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "platform/cuda_check.hpp"

namespace ferry {

// Polls `query` until it answers something other than cudaErrorNotReady: true for cudaSuccess,
// a CudaError for any other answer, false once `deadline` has passed. Spins briefly (completions
// usually come within microseconds), then yields, then sleeps 50 us between polls.
template <class Query>
bool pollUntilReady(Query query, std::chrono::steady_clock::time_point deadline, const char* call) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    const cudaError_t err = query();
    if (err == cudaSuccess) return true;
    if (err != cudaErrorNotReady) detail::throwCudaError(err, call, SourceLocation::current());
    if (Clock::now() >= deadline) return false;
    if (spins < 1000) continue;
    if (Clock::now() - start < std::chrono::milliseconds(10))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace ferry
