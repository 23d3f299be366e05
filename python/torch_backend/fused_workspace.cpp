#include "fused_workspace.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>

#include "ferry/errors.hpp"
#include "ferry/memory.hpp"

namespace ferry::torch_backend {

namespace {

// The id of the capture `stream` takes part in, 0 when it is not capturing; nullopt when CUDA cannot
// tell or the capture was invalidated: then the call is not ordered.
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

FusedWorkspace::~FusedWorkspace() {
  // The handles' destructors wait for this GPU's work, which the pipelined ops' waits bound
  // (FERRY_DEVICE_TIMEOUT), before the memory goes; then nothing runs on the streams.
  current_.reset();
  retired_.clear();
  for (cudaEvent_t e : {eager_, captured_})
    if (e != nullptr) (void)cudaEventDestroy(e);
  for (cudaStream_t s : sides_) (void)cudaStreamDestroy(s);
}

std::shared_ptr<const SymmetricMemory> FusedWorkspace::begin(Communicator& comm, std::size_t bytes,
                                                             cudaStream_t stream, const std::string& who) {
  std::lock_guard lock(mu_);
  const std::optional<unsigned long long> capture = captureOf(stream);
  if (last_ != nullptr && last_ != stream && lastEvent_ != nullptr && capture == std::optional(lastCapture_))
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, lastEvent_, 0));
  if (current_ && current_->bufferBytes() >= bytes) return current_;
  TORCH_CHECK(capture == std::optional<unsigned long long>(0), who, ": its workspace must grow to ", bytes,
              " bytes, which meets every rank and cannot be captured in a CUDA graph: run the op once "
              "with these shapes before capturing it, or set FERRY_FUSED_PIPELINE=0");
  // Half again what is asked, so that a run of growing shapes does not meet the ranks at each one.
  const std::size_t grown =
      std::max(bytes, current_ ? current_->bufferBytes() + current_->bufferBytes() / 2 : 0);
  try {
    std::shared_ptr<void> memory = gpuAlloc(grown);
    std::shared_ptr<const SymmetricMemory> made = SymmetricMemory::rendezvous(comm, memory.get(), grown);
    if (current_) retired_.emplace_back(std::move(memory_), std::move(current_));
    memory_ = std::move(memory);
    current_ = std::move(made);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, who + ": making its symmetric workspace: " + e.what());
  }
  return current_;
}

void FusedWorkspace::end(cudaStream_t stream) {
  std::lock_guard lock(mu_);
  const std::optional<unsigned long long> capture = captureOf(stream);
  last_ = nullptr;
  if (!capture) return;  // the next call cannot be ordered after this one
  cudaEvent_t& event = *capture != 0 ? captured_ : eager_;
  if (event == nullptr) C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(event, stream));
  last_ = stream;
  lastCapture_ = *capture;
  lastEvent_ = event;
}

void FusedWorkspace::abort() {
  std::lock_guard lock(mu_);
  if (current_) current_->abort();
  for (const auto& [memory, handle] : retired_) handle->abort();
}

c10::cuda::CUDAStream FusedWorkspace::side(int step) {
  std::lock_guard lock(mu_);
  while (static_cast<int>(sides_.size()) < step) {
    int least = 0, greatest = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    sides_.push_back(s);
  }
  return c10::cuda::getStreamFromExternal(sides_[static_cast<std::size_t>(step - 1)],
                                          static_cast<c10::DeviceIndex>(device_));
}

}  // namespace ferry::torch_backend
