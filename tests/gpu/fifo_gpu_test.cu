// The FIFO and proxy with a real GPU: many blocks and threads push into a Gpu-memory FIFO (small,
// so back-pressure is exercised) drained by a Proxy; every trigger is checked once, in
// per-producer order, untorn; sync() from the kernel returns only after the handler ran. Then a
// microbenchmark of push-to-pickup latency (reported, never asserted) that still checks its triggers.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include "../unit/fifo_test_util.hpp"
#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/arch/timer.hpp"
#include "ferry/proxy.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

#define FIFO_GPU_CHECK(call)                                                                              \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Mapped pinned host memory that the handler writes and the kernel reads.
template <class T>
struct Mapped {
  T* host = nullptr;
  T* device = nullptr;
  explicit Mapped(std::size_t n) {
    if (cudaHostAlloc(&host, n * sizeof(T), cudaHostAllocMapped) != cudaSuccess) return;
    std::fill(host, host + n, T{});
    if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0) != cudaSuccess) device = nullptr;
  }
  ~Mapped() {
    if (host) cudaFreeHost(host);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
};

ProxyOptions gpuProxy(int size) {
  ProxyOptions o;
  o.fifo.size = size;
  o.fifo.memory = FifoMemory::Gpu;
  o.fifo.device = 0;
  o.fifo.rank = 0;
  o.fifo.timeout = 20s;  // a lost trigger traps the kernel instead of hanging the test
  return o;
}

// Each thread is one producer: it pushes `perThread` triggers; every `syncEvery`-th one it syncs and
// checks that the handler has recorded exactly that trigger as its newest.
__global__ void pushKernel(FifoDeviceHandle fifo, int perThread, int syncEvery, const int* lastHandled,
                           unsigned* early) {
  const int producer = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < perThread; ++i) {
    const std::uint64_t slot = fifo.push(testing::makeTrigger(producer, i));
    if (i % syncEvery == syncEvery - 1) {
      fifo.sync(slot);
      if (atomicLoad(&lastHandled[producer], memory_order_acquire) != i) atomicAdd(early, 1u);
    }
  }
}

TEST(FifoGpu, ManyBlocksEveryTriggerHandledOnceAndSyncMeansHandled) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  constexpr int kBlocks = 64, kThreads = 128, kPerThread = 32, kSyncEvery = 8;
  constexpr int kProducers = kBlocks * kThreads;
  FIFO_GPU_CHECK(cudaSetDevice(0));
  Mapped<int> lastHandled(kProducers);
  ASSERT_NE(lastHandled.device, nullptr);
  std::fill(lastHandled.host, lastHandled.host + kProducers, -1);
  unsigned* early = nullptr;
  FIFO_GPU_CHECK(cudaMalloc(&early, sizeof(unsigned)));
  FIFO_GPU_CHECK(cudaMemset(early, 0, sizeof(unsigned)));

  testing::TriggerChecker checker(kProducers, kPerThread);  // proxy thread only
  std::uint64_t handled = 0;
  Proxy proxy(
      [&](ProxyTrigger t) {
        if (checker.check(t))
          atomicStore(&lastHandled.host[testing::producerOf(t)], testing::seqOf(t), memory_order_release);
        ++handled;
        return ProxyHandlerResult::Continue;
      },
      gpuProxy(128));
  proxy.start();
  const auto begin = std::chrono::steady_clock::now();
  pushKernel<<<kBlocks, kThreads>>>(proxy.fifo().deviceHandle(), kPerThread, kSyncEvery, lastHandled.device,
                                    early);
  FIFO_GPU_CHECK(cudaGetLastError());
  FIFO_GPU_CHECK(cudaDeviceSynchronize());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  // Every thread's last push was synced, so every trigger has been handled; stop() joins.
  proxy.stop();
  unsigned earlyCount = 0;
  FIFO_GPU_CHECK(cudaMemcpy(&earlyCount, early, sizeof(unsigned), cudaMemcpyDeviceToHost));
  cudaFree(early);
  EXPECT_EQ(handled, std::uint64_t(kProducers) * kPerThread);
  checker.expectComplete();
  EXPECT_EQ(earlyCount, 0u) << "sync() returned before the handler ran";
  std::printf(
      "fifo throughput: %d triggers from %d blocks x %d threads through 128 slots in %.1f ms (%.2f M/s)\n",
      kProducers * kPerThread, kBlocks, kThreads, seconds * 1e3, kProducers * kPerThread / seconds / 1e6);
}

// One thread, one trigger in flight: the time from before push() to sync() returning, i.e. push,
// proxy pickup, handler, pop, and the GPU reading the new tail. It bounds push-to-pickup from above.
__global__ void latencyKernel(FifoDeviceHandle fifo, int iterations, std::uint64_t* ns) {
  for (int i = 0; i < iterations; ++i) {
    const std::uint64_t t0 = nowNs();
    fifo.sync(fifo.push(testing::makeTrigger(0, i)));
    ns[i] = nowNs() - t0;
  }
}

TEST(FifoGpu, PushToPickupLatency) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  constexpr int kWarmup = 1000, kIterations = 10000;
  FIFO_GPU_CHECK(cudaSetDevice(0));
  testing::TriggerChecker checker(1, kWarmup + kIterations);
  Proxy proxy(
      [&](ProxyTrigger t) {
        checker.check(t);
        return ProxyHandlerResult::Continue;
      },
      gpuProxy(512));
  proxy.start();
  std::uint64_t* ns = nullptr;
  FIFO_GPU_CHECK(cudaMalloc(&ns, sizeof(std::uint64_t) * (kWarmup + kIterations)));
  latencyKernel<<<1, 1>>>(proxy.fifo().deviceHandle(), kWarmup + kIterations, ns);
  FIFO_GPU_CHECK(cudaGetLastError());
  FIFO_GPU_CHECK(cudaDeviceSynchronize());
  proxy.stop();
  checker.expectComplete();  // the result is checked before the time is reported
  std::vector<std::uint64_t> host(kWarmup + kIterations);
  FIFO_GPU_CHECK(cudaMemcpy(host.data(), ns, host.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  cudaFree(ns);
  std::vector<std::uint64_t> timed(host.begin() + kWarmup, host.end());
  std::sort(timed.begin(), timed.end());
  ASSERT_GT(timed.back(), 0u);
  const double median = timed[timed.size() / 2] / 1e3, p99 = timed[timed.size() * 99 / 100] / 1e3;
  std::printf(
      "fifo push to proxy pickup: %.2f us median (p99 %.2f us; measured push -> handler -> pop -> sync "
      "return, one trigger in flight, %d iterations: an upper bound on pickup)\n",
      median, p99, kIterations);
}

}  // namespace
}  // namespace ferry
