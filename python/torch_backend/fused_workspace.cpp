#include "fused_workspace.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
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
  // (FERRY_DEVICE_TIMEOUT), before the memory goes. (The side streams stay: see side.)
  current_.reset();
  retired_.clear();
  for (cudaEvent_t e : {eager_, captured_})
    if (e != nullptr) (void)cudaEventDestroy(e);
}

std::shared_ptr<const SymmetricMemory> FusedWorkspace::begin(Communicator& comm, std::size_t bytes,
                                                             cudaStream_t stream, const std::string& who) {
  std::lock_guard lock(mu_);
  const std::optional<unsigned long long> capture = captureOf(stream);
  if (capture == std::optional<unsigned long long>(0) && lastEager_ != nullptr && lastEager_ != stream)
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, eager_, 0));
  if (capture && *capture != 0 && lastCaptured_ != nullptr && lastCaptured_ != stream &&
      lastCapture_ == *capture)
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, captured_, 0));
  if (!current_ || current_->handle->bufferBytes() < bytes) {
    TORCH_CHECK(capture == std::optional<unsigned long long>(0), who, ": its workspace must grow to ", bytes,
                " bytes, which meets every rank and cannot be captured in a CUDA graph: run the op once "
                "with these shapes before capturing it, or set FERRY_FUSED_PIPELINE=0");
    // Half again what is asked, so that a run of growing shapes does not meet the ranks at each one.
    const std::size_t grown =
        std::max(bytes, current_ ? current_->handle->bufferBytes() + current_->handle->bufferBytes() / 2 : 0);
    try {
      auto made = std::make_shared<Held>();
      made->memory = gpuAlloc(grown);
      made->handle = SymmetricMemory::rendezvous(comm, made->memory.get(), grown);
      if (current_) retired_.push_back(std::move(current_));
      current_ = std::move(made);
    } catch (const Error& e) {
      C10_THROW_ERROR(DistBackendError, who + ": making its symmetric workspace: " + e.what());
    }
  }
  // The handle, owning its memory too (an aliasing pointer): valid for the call whatever happens
  // to the workspace meanwhile.
  return std::shared_ptr<const SymmetricMemory>(current_, current_->handle.get());
}

void FusedWorkspace::end(cudaStream_t stream) {
  std::lock_guard lock(mu_);
  const std::optional<unsigned long long> capture = captureOf(stream);
  if (!capture) return;  // (an invalidated capture: nothing to order after)
  cudaEvent_t& event = *capture != 0 ? captured_ : eager_;
  if (event == nullptr) C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(event, stream));
  if (*capture != 0) {
    lastCaptured_ = stream;
    lastCapture_ = *capture;
  } else {
    lastEager_ = stream;
  }
}

void FusedWorkspace::abort() {
  std::lock_guard lock(mu_);
  std::exception_ptr first;
  std::vector<std::shared_ptr<Held>> all(retired_);
  if (current_) all.push_back(current_);
  for (const auto& held : all) {
    try {
      held->handle->abort();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
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
