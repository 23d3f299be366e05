#pragma once
// Host-side helpers shared by the algorithms' launch functions.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <cstdint>
#include <utility>

#include "kernels/collective_call.hpp"
#include "kernels/device_context.hpp"
#include "kernels/reduce_ops.hpp"
#include "ferry/errors.hpp"

namespace ferry {

// Blocks for `units` of work at about `perBlock` units each, within [lo, hi] (hi <= kMaxBlocks).
inline unsigned gridFor(std::uint64_t units, std::uint64_t perBlock, unsigned lo, unsigned hi) {
  const std::uint64_t want = (units + perBlock - 1) / perBlock;
  return static_cast<unsigned>(std::clamp<std::uint64_t>(want, lo, std::min<unsigned>(hi, kMaxBlocks)));
}

// The same within the Comm's bounds (CommOptions): [lo, hi] narrowed to [minBlocks, maxBlocks],
// the maximum winning where they conflict.
inline unsigned gridFor(const CollectiveContext& c, std::uint64_t units, std::uint64_t perBlock, unsigned lo,
                        unsigned hi) {
  const auto cap = static_cast<unsigned>(std::max(1, c.maxBlocks));
  hi = std::min(hi, cap);
  lo = std::min(std::max(lo, static_cast<unsigned>(std::max(1, c.minBlocks))), hi);
  return gridFor(units, perBlock, lo, hi);
}

// Launches `kernel` on `stream`; early: with programmatic dependent launch
// (CollectiveContext::earlyLaunch), so that its blocks take their SMs while the kernel before it
// still runs and start the moment it ends; the kernel must call awaitPreviousKernel
// (device_context.hpp) before its first access to memory. Any error is left for the caller.
template <class... Params, class... Args>
void launchMaybeEarly(bool early, void (*kernel)(Params...), unsigned grid, unsigned threads,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (early) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Launches a collective kernel, one whose blocks begin with beginCall or beginDirect, on `stream`,
// early or not (launchMaybeEarly). Any error is left for checkLaunch.
template <class... Params, class... Args>
void launchCollective(bool early, void (*kernel)(Params...), unsigned grid, unsigned threads,
                      cudaStream_t stream, Args&&... args) {
  // Block b counts calls in CallState::calls[b] (device_context.hpp, loadCallsDone).
  if (grid > static_cast<unsigned>(kMaxBlocks))
    throw Error(ErrorCode::InternalError, "a collective kernel of " + std::to_string(grid) + " blocks: at most " +
                                         std::to_string(kMaxBlocks) + " count calls (report this as a bug)");
  launchMaybeEarly(early, kernel, grid, threads, stream, std::forward<Args>(args)...);
}

// After a launch: a launch error becomes a CudaError naming the call and the algorithm.
inline void checkLaunch(const CollectiveCall& call, const char* algorithm) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError(describe(call) + ": launching " + algorithm + " failed: " + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

// Loads `kernel` into the current context now. CUDA loads kernels lazily by default: the first
// launch of a kernel loads it, and loading waits for the kernels running on the device; if one of
// them is a ferry kernel waiting for a peer whose progress needs this launch (a second call queued
// behind a hung one, an abort), that is a deadlock until FERRY_DEVICE_TIMEOUT.
template <class Kernel>
void preloadKernel(Kernel* kernel) {
  cudaFuncAttributes attributes{};
  (void)cudaFuncGetAttributes(&attributes, kernel);
}

// f.template operator()<T, Op>() for every data type and reduce op (dispatchTypeOp's pairs).
template <class F>
void forEveryTypeOp(F&& f) {
  for (int t = 0; t < kDataTypeCount; ++t)
    for (int o = 0; o < kReduceOpCount; ++o) dispatchTypeOp(static_cast<DataType>(t), static_cast<ReduceOp>(o), f);
}

// f.template operator()<T, Op, Wide>() for the call's type and op, Wide where the call sums in
// float32 (CollectiveCall::sumsInFloat32, so kWideSum<T, Op> holds): for the kernels of the
// algorithms that run such calls (Algorithm::sumsInFloat32; WordAccumulator).
template <class F>
void dispatchAccumulation(const CollectiveCall& call, F&& f) {
  dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
    if constexpr (kWideSum<T, Op>) {
      if (call.sumsInFloat32()) return f.template operator()<T, Op, true>();
    }
    return f.template operator()<T, Op, false>();
  });
}

// f.template operator()<T, Op, Wide>() for every instance dispatchAccumulation may call.
template <class F>
void forEveryAccumulation(F&& f) {
  forEveryTypeOp([&]<class T, ReduceOp Op>() {
    f.template operator()<T, Op, false>();
    if constexpr (kWideSum<T, Op>) f.template operator()<T, Op, true>();
  });
}

// The digest of what every rank's call must agree on (device_context.hpp, startWord): the
// collective, the count, the type, the op and root where the collective has them, and float32
// accumulation where it applies. A
// mismatch shows unless the digests collide (one chance in 2^24).
inline std::uint64_t callShape(const CollectiveCall& call) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the fields, then a final mix
  const auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  };
  mix(static_cast<std::uint64_t>(call.collective));
  mix(call.count);
  mix(static_cast<std::uint64_t>(call.type));
  mix(call.reduces() ? static_cast<std::uint64_t>(call.op) : 0);
  mix(call.rooted() ? static_cast<std::uint64_t>(call.root) : 0);
  if (call.sumsInFloat32()) mix(0xacc);  // ranks that accumulate differently would round differently
  return (h ^ h >> 29) & kShapeMask;
}

// The context for one call: the collective (for timeout reports) and the call's shape.
inline CollectiveContext forCall(CollectiveContext c, const CollectiveCall& call) {
  c.op = static_cast<int>(call.collective);
  c.shape = callShape(call);
  c.count = call.count;
  return c;
}

}  // namespace ferry
