#include "work.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <thread>

namespace ferry::torch_backend {

FerryWork::FerryWork(int rank, c10d::OpType type, c10::Device device, std::vector<at::Tensor> outputs,
                     const char* op, std::chrono::milliseconds timeout, bool blocksHost)
    : c10d::Work(rank, type),
      device_(device),
      outputs_(std::move(outputs)),
      op_(op),
      timeout_(timeout),
      blocksHost_(blocksHost) {}

void FerryWork::recordEnd(const c10::cuda::CUDAStream& stream) {
  end_.record(stream);
  future_ = c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                    std::vector<c10::Device>{device_});
  // Completed "on" the stream: a then() callback or a wait on the future orders after the op.
  c10::cuda::CUDAStreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

bool FerryWork::isCompleted() { return end_.query(); }

bool FerryWork::wait(std::chrono::milliseconds timeout) {
  end_.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  if (!blocksHost_) return true;
  // A barrier: the host waits, polling (a sleeping wait could not be bounded), at most the timeout.
  const auto bound = timeout == kNoTimeout ? timeout_ : timeout;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!end_.query()) {
    if (std::chrono::steady_clock::now() > deadline)
      C10_THROW_ERROR(DistBackendError, "ferry backend: rank " + std::to_string(rank_) + ": " + op_ +
                                            " did not finish within " + std::to_string(bound.count()) +
                                            " ms (a rank that never joined it? FERRY_DEVICE_TIMEOUT bounds "
                                            "the GPU side and names the peer)");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

void FerryWork::synchronize() { wait(kNoTimeout); }

}  // namespace ferry::torch_backend
