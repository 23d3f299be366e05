#pragma once
// Kernels of the memory-sharing GPU tests (memory_sharing_kernels.cu), callable from host-only
// test code, and the value function that host and device agree on.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::test {

// The value element i gets from writer `seed`: host and device compute the same.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline std::uint32_t
    sharingValue(std::uint32_t seed, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(seed) << 40) ^ i;
  x *= 0x9e3779b97f4a7c15ull;
  return static_cast<std::uint32_t>(x >> 32) | 1u;  // never 0, the fill of fresh memory
}

// dst[i] = sharingValue(seed, i) for i < count, with plain stores (dst may be a peer's memory
// mapped here).
cudaError_t launchFill(std::uint32_t* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream);

}  // namespace ferry::test
