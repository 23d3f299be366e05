// SymmetricMemory's signal-pad kernels (signal_pad.hpp, semantics in symmetric_memory.hpp).
#include "channel/signal_pad.hpp"
#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/timeout.hpp"
#include "platform/cuda_check.hpp"

namespace ferry {
namespace {

// Slot [channel * worldSize + src] of rank dst's pad: "src signalled dst on channel".
__device__ std::uint32_t* slot(const SignalLaunch& s, int dst, int src) {
  return s.pads[dst] + static_cast<std::size_t>(s.channel) * s.worldSize + src;
}

__device__ void put(const SignalLaunch& s, int dst) {
  // Everything this stream wrote before, this kernel's predecessors included, reaches dst before
  // the flag: a system-scope fence, then the flag with release order.
  atomicFence(memory_order_seq_cst);
  std::uint32_t* flag = slot(s, dst, s.rank);
  // A slot still at 1 is dst's previous signal, not yet consumed: wait for its waitSignal.
  spinUntil([&] { return atomicCompareExchange<std::uint32_t>(flag, 0u, 1u, memory_order_release); },
            WaitContext{s.rank, dst, s.timeoutNs, s.abortFlag}, "SymmetricMemory put_signal (detail: channel)",
            static_cast<std::uint64_t>(s.channel));
}

__device__ void wait(const SignalLaunch& s, int src) {
  std::uint32_t* flag = slot(s, s.rank, src);
  spinUntil([&] { return atomicCompareExchange<std::uint32_t>(flag, 1u, 0u, memory_order_acquire); },
            WaitContext{s.rank, src, s.timeoutNs, s.abortFlag}, "SymmetricMemory wait_signal (detail: channel)",
            static_cast<std::uint64_t>(s.channel));
}

__global__ void signalKernel(SignalLaunch s) {
  const int t = static_cast<int>(threadIdx.x);
  switch (s.op) {
    case SignalOp::Put:
      if (t == 0) put(s, s.peer);
      break;
    case SignalOp::Wait:
      if (t == 0) wait(s, s.peer);
      break;
    case SignalOp::Barrier:
      // Thread t serves rank t: all puts go out before any thread waits on its own pad.
      if (t < s.worldSize && t != s.rank) put(s, t);
      __syncthreads();
      if (t < s.worldSize && t != s.rank) wait(s, t);
      break;
  }
}

}  // namespace

void launchSignal(const SignalLaunch& launch, cudaStream_t stream) {
  const unsigned threads =
      launch.op == SignalOp::Barrier ? static_cast<unsigned>((launch.worldSize + 31) / 32 * 32) : 32u;
  signalKernel<<<1, threads, 0, stream>>>(launch);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ferry
