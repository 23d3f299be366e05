#include "platform/cuda_check.hpp"

namespace ferry::detail {

void throwCudaError(cudaError_t err, const char* call, SourceLocation where) {
  // Clear the sticky "last error" so that it does not surface again in an unrelated check.
  (void)cudaGetLastError();
  throw CudaError(
      std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")",
      static_cast<int>(err), where);
}

}  // namespace ferry::detail
