// A stream beside the caller's, with its fork and join events (side_stream.hpp).
#include "comm/side_stream.hpp"

#include <string>

#include "ferry/errors.hpp"
#include "platform/cuda_check.hpp"

namespace ferry {

SideStream::SideStream(int events) {
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  events_.reserve(static_cast<std::size_t>(events));
  try {
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
    for (int i = 0; i < events; ++i) {
      cudaEvent_t e = nullptr;
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
  } catch (...) {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (joined_ != nullptr) (void)cudaEventDestroy(joined_);
    (void)cudaStreamDestroy(stream_);
    throw;
  }
}

SideStream::~SideStream() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(joined_);
  (void)cudaStreamDestroy(stream_);
}

cudaEvent_t SideStream::event(int i) const {
  if (i < 0 || i >= events())
    throw Error(ErrorCode::InternalError, "SideStream: event " + std::to_string(i) + " of " + std::to_string(events()));
  return events_[static_cast<std::size_t>(i)];
}

void SideStream::record(int i, cudaStream_t on) { FERRY_CUDA_CHECK(cudaEventRecord(event(i), on)); }

void SideStream::wait(cudaStream_t waiter, int i) { FERRY_CUDA_CHECK(cudaStreamWaitEvent(waiter, event(i), 0)); }

void SideStream::join(cudaStream_t waiter) noexcept {
  if (cudaEventRecord(joined_, stream_) == cudaSuccess) (void)cudaStreamWaitEvent(waiter, joined_, 0);
  (void)cudaGetLastError();
}

}  // namespace ferry
