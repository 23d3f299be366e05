#include "memory_sharing_kernels.hpp"

namespace ferry::test {
namespace {

__global__ void fillKernel(std::uint32_t* dst, std::size_t count, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = sharingValue(seed, i);
}

}  // namespace

cudaError_t launchFill(std::uint32_t* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream) {
  fillKernel<<<128, 256, 0, stream>>>(dst, count, seed);
  return cudaGetLastError();
}

}  // namespace ferry::test
