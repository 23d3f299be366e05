#include "transport/pinned_staging.hpp"

#include "platform/cuda_check.hpp"

namespace ferry {

PinnedStaging::PinnedStaging(std::size_t bytesEach) : bytes_(bytesEach) {
  try {
    for (int i = 0; i < 2; ++i) {
      void* p = nullptr;
      FERRY_CUDA_CHECK(cudaHostAlloc(&p, bytes_, cudaHostAllocPortable));
      buffers_[static_cast<std::size_t>(i)] = static_cast<std::byte*>(p);
      FERRY_CUDA_CHECK(
          cudaEventCreateWithFlags(&events_[static_cast<std::size_t>(i)], cudaEventDisableTiming));
    }
  } catch (...) {
    release();
    throw;
  }
}

PinnedStaging::~PinnedStaging() { release(); }

void PinnedStaging::release() noexcept {
  for (std::size_t i = 0; i < 2; ++i) {
    if (events_[i] != nullptr) (void)cudaEventDestroy(events_[i]);
    if (buffers_[i] != nullptr) (void)cudaFreeHost(buffers_[i]);
    events_[i] = nullptr;
    buffers_[i] = nullptr;
  }
}

void PinnedStaging::recordAfter(int i, cudaStream_t stream) {
  FERRY_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(i)], stream));
  marked_[static_cast<std::size_t>(i)] = true;
}

void PinnedStaging::waitFor(int i) {
  if (!marked_[static_cast<std::size_t>(i)]) return;
  FERRY_CUDA_CHECK(cudaEventSynchronize(events_[static_cast<std::size_t>(i)]));
  marked_[static_cast<std::size_t>(i)] = false;
}

}  // namespace ferry
