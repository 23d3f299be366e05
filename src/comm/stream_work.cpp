#include "comm/stream_work.hpp"

#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "platform/cuda_check.hpp"
#include "platform/cuda_poll.hpp"
#include "core/deadline.hpp"

namespace ferry {

StreamWork::~StreamWork() {
  for (const auto& [stream, event] : events_) (void)cudaEventDestroy(event);
}

void StreamWork::note(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (capture != cudaStreamCaptureStatusNone) return;
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
