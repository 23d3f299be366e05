// A build without CUDA (FERRY_BUILD_CUDA=OFF) has no signal-pad kernels: SymmetricMemory's
// signals say so.
#include "channel/signal_pad.hpp"
#include "ferry/errors.hpp"

namespace ferry {

void launchSignal(const SignalLaunch&, cudaStream_t) {
  throw Error(ErrorCode::NotSupported, "SymmetricMemory signals: this build of ferry has no CUDA kernels");
}

}  // namespace ferry
