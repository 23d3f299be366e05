#pragma once
// Host-side helpers shared by the algorithms' launch functions.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "collectives/collective_call.hpp"
#include "collectives/device_context.hpp"
#include "ferry/errors.hpp"

namespace ferry {

// Blocks for `units` of work at about `perBlock` units each, within [lo, hi] (hi <= kMaxBlocks).
inline unsigned gridFor(std::uint64_t units, std::uint64_t perBlock, unsigned lo, unsigned hi) {
  const std::uint64_t want = (units + perBlock - 1) / perBlock;
  return static_cast<unsigned>(std::clamp<std::uint64_t>(want, lo, std::min<unsigned>(hi, kMaxBlocks)));
}

// After a launch: a launch error becomes a CudaError naming the call and the algorithm.
inline void checkLaunch(const CollectiveCall& call, const char* algorithm) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError(describe(call) + ": launching " + algorithm + " failed: " + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

// The context with the collective filled in, for timeout reports.
inline CollectiveContext forCall(CollectiveContext c, const CollectiveCall& call) {
  c.op = static_cast<int>(call.collective);
  return c;
}

}  // namespace ferry
