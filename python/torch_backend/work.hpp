#pragma once
// One op of the ferry backend, as torch sees it (c10d::Work): an event recorded after the op on the
// stream it ran on. wait() orders the caller's current stream after that event, without blocking
// the host (ProcessGroupNCCL's contract), except for a barrier, whose wait() blocks the host until
// the op is done, bounded by the timeout. The work keeps the op's tensors alive until it goes.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace ferry::torch_backend {

class FerryWork : public c10d::Work {
 public:
  // `op` (a string literal) names the call in the timeout message, built only then.
  FerryWork(int rank, c10d::OpType type, c10::Device device, std::vector<at::Tensor> outputs, const char* op,
            std::chrono::milliseconds timeout, bool blocksHost);

  // Records the end event on `stream` (after the op) and completes the future there.
  void recordEnd(const c10::cuda::CUDAStream& stream);

  bool isCompleted() override;
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::Device device_;
  std::vector<at::Tensor> outputs_;
  const char* op_;
  std::chrono::milliseconds timeout_;
  bool blocksHost_;
  at::cuda::CUDAEvent end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace ferry::torch_backend
