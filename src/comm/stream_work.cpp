#include "comm/stream_work.hpp"

#include <optional>

#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "platform/cuda_check.hpp"
#include "platform/cuda_poll.hpp"
#include "core/deadline.hpp"

namespace ferry {

namespace {

// The id of the capture `stream` takes part in, 0 when it is not capturing; nullopt when CUDA cannot
// tell (an error, cleared) or the capture was invalidated: then nothing is recorded or waited on.
std::optional<unsigned long long> captureOf(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &id) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  if (status == cudaStreamCaptureStatusNone) return 0;
  if (status == cudaStreamCaptureStatusActive) return id;
  return std::nullopt;
}

}  // namespace

StreamWork::~StreamWork() {
  for (const auto& [stream, event] : events_) (void)cudaEventDestroy(event);
  if (captured_ != nullptr) (void)cudaEventDestroy(captured_);
}

void StreamWork::orderAfterLast(cudaStream_t stream) {
  if (last_ == nullptr || last_ == stream || lastEvent_ == nullptr) return;
  if (captureOf(stream) != std::optional(lastCapture_)) return;
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(stream, lastEvent_, 0));
}

void StreamWork::note(cudaStream_t stream) {
  const std::optional<unsigned long long> capture = captureOf(stream);
  if (!capture) {
    last_ = nullptr;  // the next call cannot be ordered after this one
    return;
  }
  if (*capture != 0) {
    // Nothing of a capture runs yet: drain has nothing to wait for; only the order is recorded.
    if (captured_ == nullptr) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&captured_, cudaEventDisableTiming));
    FERRY_CUDA_CHECK(cudaEventRecord(captured_, stream));
    last_ = stream;
    lastEvent_ = captured_;
    lastCapture_ = *capture;
    return;
  }
  last_ = stream;
  lastEvent_ = nullptr;  // set below once this stream's event is recorded
  lastCapture_ = 0;
  cudaEvent_t event = nullptr;
  for (const auto& [s, e] : events_)
    if (s == stream) event = e;
  if (event == nullptr) {
    if (events_.size() == kMaxStreams) {
      if (!overflow_)
        FERRY_LOG(Info, Collectives) << "rank " << rank_ << ": calls on more than " << kMaxStreams
                                     << " streams; destroying the Comm or deregistering waits for the whole GPU";
      overflow_ = true;
      return;
    }
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events_.emplace_back(stream, event);
  }
  FERRY_CUDA_CHECK(cudaEventRecord(event, stream));
  lastEvent_ = event;
}

void StreamWork::drain(const std::string& what, std::chrono::duration<double> timeout) {
  if (overflow_) {
    FERRY_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  const auto deadline = deadlineAfter(timeout);
  for (const auto& [stream, event] : events_)
    if (!pollUntilReady([&] { return cudaEventQuery(event); }, deadline, "cudaEventQuery"))
      throw TimeoutError("rank " + std::to_string(rank_) + ": " + what + ": the Comm's work queued on GPU " +
                         std::to_string(device_) + " did not finish within " + std::to_string(timeout.count()) +
                         " s (FERRY_DEVICE_TIMEOUT); is a peer stuck, or a stream waiting on the host?");
}

}  // namespace ferry
