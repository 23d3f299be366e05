// SymmetricMemory::put's kernel (symmetric_put.hpp).
#include "channel/symmetric_put.hpp"
#include "ferry/device/copy.hpp"
#include "platform/cuda_check.hpp"

namespace ferry {
namespace {

constexpr int kPutThreads = 512;

// The whole grid copies as one set of threads; copy() keeps four 16-byte loads in flight per thread,
// so a few dozen blocks hold enough bytes in flight to fill an NVLink.
__global__ void __launch_bounds__(kPutThreads) putKernel(void* dst, const void* src, std::size_t bytes) {
  copy(dst, src, bytes, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

}  // namespace

void launchPut(void* dst, const void* src, std::size_t bytes, int blocks, cudaStream_t stream) {
  putKernel<<<static_cast<unsigned>(blocks), kPutThreads, 0, stream>>>(dst, src, bytes);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ferry
