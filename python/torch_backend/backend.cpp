// The ferry backend's life and plumbing: construction, the stream contract of every op (run),
// coalescing, barrier, split, abort and shutdown. The ops themselves: collectives.cpp.
#include "backend.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "ferry/errors.hpp"

namespace ferry::torch_backend {

namespace {

TcpBootstrap::Options bootstrapOptions(std::chrono::milliseconds timeout) {
  TcpBootstrap::Options o;
  o.timeout = std::chrono::duration<double>(timeout);
  return o;
}

}  // namespace

FerryBackend::FerryBackend(const std::string& idHex, int rank, int size, int device,
                           std::chrono::milliseconds timeout)
    : FerryBackend(TcpBootstrap::create(UniqueId::fromHex(idHex), rank, size, bootstrapOptions(timeout)), device,
                   timeout) {}

FerryBackend::FerryBackend(std::shared_ptr<TcpBootstrap> bootstrap, int device, std::chrono::milliseconds timeout)
    : c10d::Backend(bootstrap->rank(), bootstrap->size()),
      device_(device),
      timeout_(timeout),
      bootstrap_(std::move(bootstrap)),
      stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device))) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  whyNotNative_ = Comm::whyNot(*bootstrap_);  // the same answer on every rank: no Comm is made anywhere
  if (!whyNotNative_.empty()) {
    gone_ = "not made: " + whyNotNative_;
    return;
  }
  try {
    comm_ = std::make_unique<Comm>(bootstrap_);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("ferry backend: making the group's Comm: ") + e.what());
  }
}

FerryBackend::~FerryBackend() = default;  // ~Comm waits for the group's queued work, bounded

c10::intrusive_ptr<c10d::Backend::Options> FerryBackend::getBackendOptions() {
  return c10::make_intrusive<Options>("ferry", timeout_);
}

Comm& FerryBackend::comm(const char* name) {
  if (!comm_)
    C10_THROW_ERROR(DistBackendError, "ferry backend: rank " + std::to_string(rank_) + ": " + name +
                                          " on a group that was " + gone_ + " (make a new process group)");
  return *comm_;
}

c10::intrusive_ptr<c10d::Work> FerryBackend::run(c10d::OpType type, const char* name, std::vector<at::Tensor>& inputs,
                                                 std::vector<at::Tensor>& outputs, Mode mode,
                                                 const std::function<void()>& body) {
  std::lock_guard lock(mu_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  comm(name);
  const auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
  // Sends and receives are grouped on one stream (a group's must share it), as every op of a
  // coalescing block: the backend's.
  const bool p2p = type == c10d::OpType::SEND || type == c10d::OpType::RECV;
  const bool onBackend = mode != Mode::Sync || coalescing_ > 0 || p2p;
  const c10::cuda::CUDAStream s = onBackend ? stream_ : current;
  if (onBackend) {
    ready_.record(current);  // the inputs are written on the caller's stream
    ready_.block(stream_);
  }
  opStream_ = s.stream();
  kept_.clear();
  try {
    c10::cuda::CUDAStreamGuard onStream(s);
    body();
  } catch (const Error& e) {
    kept_.clear();
    C10_THROW_ERROR(DistBackendError, e.what());
  }
  if (onBackend) {
    // The caching allocator must not reuse these tensors' memory before the op is done on stream_.
    for (auto* list : {&inputs, &outputs, &kept_})
      for (auto& t : *list)
        if (t.defined() && t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
  }
  kept_.clear();
  ++sequence_;
  auto work = c10::make_intrusive<FerryWork>(rank_, type, c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)),
                                             outputs, name, timeout_, mode == Mode::Barrier);
  if (coalescing_ > 0) {
    pending_.push_back(work);  // its sends and receives are queued at endCoalescing
  } else {
    work->recordEnd(s);
  }
  return work;
}

// A one-element all-reduce on the device, as ProcessGroupNCCL's; its wait() blocks the host.
c10::intrusive_ptr<c10d::Work> FerryBackend::barrier(const c10d::BarrierOptions& /*opts*/) {
  std::vector<at::Tensor> one{at::zeros({1}, at::TensorOptions().device(at::kCUDA, device_).dtype(at::kFloat))};
  return run(c10d::OpType::BARRIER, "barrier", one, one, Mode::Barrier, [&] {
    comm("barrier").allReduce(one[0].data_ptr(), one[0].data_ptr(), 1, DataType::Float32, ReduceOp::Sum, stream());
  });
}

void FerryBackend::startCoalescing() {
  std::lock_guard lock(mu_);
  comm("startCoalescing").groupStart();
  ++coalescing_;
}

c10::intrusive_ptr<c10d::Work> FerryBackend::endCoalescing() {
  std::lock_guard lock(mu_);
  TORCH_CHECK(coalescing_ > 0, "ferry backend: rank ", rank_, ": endCoalescing without startCoalescing");
  std::vector<at::Tensor> none;
  auto work = run(c10d::OpType::COALESCED, "endCoalescing", none, none, Mode::Async, [&] {
    --coalescing_;
    comm("endCoalescing").groupEnd();
  });
  for (auto& w : pending_) w->recordEnd(stream_);
  pending_.clear();
  return work;
}

c10::intrusive_ptr<c10d::Backend> FerryBackend::split(const c10::intrusive_ptr<c10d::Store>& /*store*/,
                                                      const std::vector<int>& ranks,
                                                      const c10::intrusive_ptr<Options>& opts) {
  std::lock_guard lock(mu_);
  comm("split");
  // Split groups do not overlap (torch checks), so the lowest rank names one group among those of
  // this call; ranks outside every group take part without a color.
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  const int color = it == ranks.end() ? -1 : *std::min_element(ranks.begin(), ranks.end());
  const int key = it == ranks.end() ? 0 : static_cast<int>(it - ranks.begin());
  std::shared_ptr<TcpBootstrap> sub;
  try {
    sub = bootstrap_->split(color, key);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("ferry backend: split: ") + e.what());
  }
  if (!sub) return nullptr;
  return c10::make_intrusive<FerryBackend>(std::move(sub), device_, opts ? opts->timeout : timeout_);
}

int64_t FerryBackend::registerTensor(const at::Tensor& tensor) {
  std::lock_guard lock(mu_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  Comm& c = comm("register_tensor");
  check(tensor, "register_tensor");
  // Registering maps memory into the peers and meets them: nothing a graph can replay.
  TORCH_CHECK(c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
              "ferry backend: rank ", rank_,
              ": register_tensor while a CUDA graph is being captured: register before the capture");
  // The whole storage: views of it (and the op's own views) then lie inside the registration.
  const auto& storage = tensor.storage();
  try {
    const BufferRegistration r = c.registerBuffer(storage.mutable_data(), storage.nbytes());
    registrations_.emplace(nextRegistration_, r);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("ferry backend: register_tensor: ") + e.what());
  }
  return nextRegistration_++;
}

void FerryBackend::deregisterTensor(int64_t id) {
  std::lock_guard lock(mu_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const auto it = registrations_.find(id);
  TORCH_CHECK(it != registrations_.end(), "ferry backend: rank ", rank_, ": deregister_tensor: no registration ",
              id, " on this group (already deregistered, or made on another group)");
  const BufferRegistration r = it->second;
  registrations_.erase(it);
  if (!comm_) return;  // aborted or shut down: the Comm and its registrations are gone
  try {
    comm_->deregisterBuffer(r);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("ferry backend: deregister_tensor: ") + e.what());
  }
}

std::shared_ptr<const SymmetricMemory> FerryBackend::beginFused(std::size_t bytes, cudaStream_t stream,
                                                                const char* name) {
  std::lock_guard lock(mu_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  Comm& c = comm(name);
  const std::string who = "ferry backend: rank " + std::to_string(rank_) + ": " + name;
  TORCH_CHECK(sumsInFloat32Here(), who, ": the pipelined form needs the group's ranks on one host");
  if (!fused_) fused_ = std::make_unique<FusedWorkspace>(device_);
  return fused_->begin(c.communicator(), bytes, stream, who);
}

void FerryBackend::endFused(cudaStream_t stream) {
  std::lock_guard lock(mu_);
  if (fused_) fused_->end(stream);
}

c10::cuda::CUDAStream FerryBackend::fusedSide(int step) {
  std::lock_guard lock(mu_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (!fused_) fused_ = std::make_unique<FusedWorkspace>(device_);
  return fused_->side(step);
}

void FerryBackend::abort() {
  std::lock_guard lock(mu_);
  if (!comm_) return;
  if (fused_) {
    try {
      fused_->abort();  // the pipelined fused ops' waits give up too, on every rank
    } catch (const std::exception& e) {
      TORCH_WARN("ferry backend: rank ", rank_, ": aborting the fused ops' workspace: ", e.what());
    }
  }
  comm_->abort();  // every rank's waits give up: destroying it below cannot hang
  comm_.reset();
  gone_ = "aborted";
}

void FerryBackend::shutdown() {
  std::lock_guard lock(mu_);
  if (!comm_) return;
  fused_.reset();  // waits for this GPU's work, which the pipelined ops' waits bound
  comm_.reset();  // waits for the group's queued work (bounded by FERRY_DEVICE_TIMEOUT)
  gone_ = "shut down";
}

}  // namespace ferry::torch_backend
