#pragma once
// FERRY_CUDA_CHECK(call) throws CudaError naming the call, the CUDA error and file:line.
//   FERRY_CUDA_CHECK(cudaMalloc(&ptr, bytes));
#include <cuda_runtime_api.h>

#include <string>

#include "ferry/errors.hpp"

namespace ferry::detail {
[[noreturn]] void throwCudaError(cudaError_t err, const char* call, SourceLocation where);
}  // namespace ferry::detail

#define FERRY_CUDA_CHECK(call)                                                                \
  do {                                                                                        \
    cudaError_t ferry_err_ = (call);                                                          \
    if (ferry_err_ != cudaSuccess)                                                            \
      ::ferry::detail::throwCudaError(ferry_err_, #call, ::ferry::SourceLocation::current()); \
  } while (0)
