// A build without CUDA (FERRY_BUILD_CUDA=OFF) has no put kernel: SymmetricMemory::put with blocks
// says so.
#include "channel/symmetric_put.hpp"
#include "ferry/errors.hpp"

namespace ferry {

void launchPut(void*, const void*, std::size_t, int, cudaStream_t) {
  throw Error(ErrorCode::NotSupported,
              "SymmetricMemory put by thread blocks: this build of ferry has no CUDA kernels");
}

}  // namespace ferry
