#include "nccl_comm.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <vector>

#include "checks.hpp"
#include "results.hpp"

namespace ferry::nccl {

ncclComm& usable(ncclComm_t comm) {
  checkNotNull(comm, "comm");
  if (comm->magic != ncclComm::kAlive)
    throw ApiError{ncclInvalidArgument, "comm is not a live communicator (destroyed, or never initialized?)"};
  if (comm->deferred)
    throw ApiError{ncclInvalidUsage, "the communicator's init is deferred to ncclGroupEnd; use it after the group"};
  while (comm->state.load() == ncclComm::State::Running) std::this_thread::sleep_for(std::chrono::microseconds(200));
  switch (comm->state.load()) {
    case ncclComm::State::Failed:
      throw ApiError{comm->initResult == ncclSuccess ? ncclInternalError : comm->initResult,
                     "the communicator's initialization failed: " + comm->initError};
    case ncclComm::State::Aborted: throw ApiError{ncclInvalidUsage, "the communicator was aborted"};
    default: return *comm;
  }
}

ncclResult_t startInit(ncclComm* c, std::function<std::shared_ptr<TcpBootstrap>()> create) {
  auto body = [c, create = std::move(create)] {
    const ncclResult_t r = guarded("communicator init", [&] {
      if (cudaSetDevice(c->device) != cudaSuccess)
        throw ApiError{ncclUnhandledCudaError, "cannot use CUDA device " + std::to_string(c->device)};
      c->bootstrap = create();
      c->comm = std::make_unique<Comm>(c->bootstrap, c->options);
      return ncclSuccess;
    });
    c->initResult = r;
    if (r != ncclSuccess) c->initError = lastError();
    c->state = r == ncclSuccess ? ncclComm::State::Ready : ncclComm::State::Failed;
    return r;
  };
  if (c->blocking) return body();
  c->initThread = std::thread([body] { (void)body(); });
  return ncclInProgress;
}

ncclComm_t realComm(ncclComm& c, const char* api, const RealNccl*& real) {
  std::string why;
  real = realNccl(why);
  if (real == nullptr)
    throw ApiError{ncclInvalidUsage, std::string("this call is not native in ferry, and there is no real NCCL to "
                                                 "forward it to: ") + why};
  noteForwarded(api, *real);
  std::lock_guard lock(c.mu);
  if (c.real != nullptr) return c.real;
  // Collective: every rank forwards the same call at the same point of its sequence.
  std::vector<ncclUniqueId> ids(static_cast<std::size_t>(c.nranks));
  if (c.rank == 0 && real->getUniqueId(&ids[0]) != ncclSuccess)
    throw ApiError{ncclInternalError, "the fallback NCCL's ncclGetUniqueId failed: " +
                                          std::string(real->getLastError(nullptr))};
  c.bootstrap->allGather(ids.data(), sizeof(ncclUniqueId));
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(c.device);
  const ncclResult_t r = real->commInitRank(&c.real, c.nranks, ids[0], c.rank);
  cudaSetDevice(previous);
  if (r != ncclSuccess) {
    c.real = nullptr;
    throw ApiError{r, "the fallback NCCL's ncclCommInitRank failed: " + std::string(real->getLastError(nullptr))};
  }
  return c.real;
}

}  // namespace ferry::nccl
