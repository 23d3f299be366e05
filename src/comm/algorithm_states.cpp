#include "comm/algorithm_states.hpp"

#include <cuda_runtime_api.h>

#include "platform/cuda_check.hpp"
#include "platform/device_upload.hpp"

namespace ferry {

void AlgorithmStates::Free::operator()(void* p) const { cudaFree(p); }  // at teardown: nothing to report to

void AlgorithmStates::reserve(const Algorithm& algorithm) {
  const std::size_t bytes = algorithm.deviceStateBytes();
  if (bytes == 0 || states_.count(&algorithm) != 0) return;
  void* p = nullptr;
  FERRY_CUDA_CHECK(cudaMalloc(&p, bytes));
  std::unique_ptr<void, Free> owned(p);
  zeroNow(p, bytes);  // zero before any kernel of the Comm runs, on any stream
  states_.emplace(&algorithm, std::move(owned));
}

void* AlgorithmStates::of(const Algorithm& algorithm) const {
  const auto it = states_.find(&algorithm);
  return it == states_.end() ? nullptr : it->second.get();
}

}  // namespace ferry
