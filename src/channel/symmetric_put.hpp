#pragma once
// The kernel behind SymmetricMemory::put with thread blocks (symmetric_memory.hpp): SM stores, on
// the caller's stream.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry {

// The most thread blocks a put may take.
inline constexpr int kMaxPutBlocks = 1024;

// Copies `bytes` from src to dst with `blocks` blocks (1 to kMaxPutBlocks) on `stream`.
// @pre both are addresses this GPU can access (its own memory, or a peer's mapped here).
void launchPut(void* dst, const void* src, std::size_t bytes, int blocks, cudaStream_t stream);

}  // namespace ferry
