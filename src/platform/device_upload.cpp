// Host bytes to device memory, done when the call returns (device_upload.hpp).
#include "platform/device_upload.hpp"

#include <cuda_runtime_api.h>

#include "platform/cuda_check.hpp"

namespace ferry {

void uploadNow(void* dst, const void* src, std::size_t bytes) {
  FERRY_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void zeroNow(void* dst, std::size_t bytes) {
  FERRY_CUDA_CHECK(cudaMemset(dst, 0, bytes));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

}  // namespace ferry
