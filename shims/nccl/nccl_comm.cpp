#include "nccl_comm.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <vector>

#include "checks.hpp"
#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "results.hpp"

namespace ferry::nccl {
namespace {

// Makes the real NCCL's communicator for `c` (collective over its bootstrap): rank 0's unique id
// goes to every rank in the same exchange that tells every rank whether all of them have a real
// NCCL, so that either every rank forwards or every rank fails.
void forward(ncclComm& c, const std::string& why) {
  std::string missing;
  const RealNccl* real = realNccl(missing);
  struct Offer {
    int ready;
    ncclUniqueId id;
  };
  std::vector<Offer> offers(static_cast<std::size_t>(c.nranks));
  Offer& mine = offers[static_cast<std::size_t>(c.rank)];
  mine.ready = real != nullptr;
  if (real != nullptr && c.rank == 0 && real->getUniqueId(&mine.id) != ncclSuccess) {
    missing = "its ncclGetUniqueId failed: " + std::string(real->getLastError(nullptr));
    mine.ready = 0;
  }
  c.bootstrap->allGather(offers.data(), sizeof(Offer));
  for (int r = 0; r < c.nranks; ++r)
    if (!offers[static_cast<std::size_t>(r)].ready)
      throw ApiError{ncclInvalidUsage, "ferry does not run this communicator natively (" + why +
                                           "), and rank " + std::to_string(r) +
                                           " has no real NCCL to run it on" +
                                           (r == c.rank ? ": " + missing : std::string())};
  ncclResult_t r;
  const char* api = "ncclCommInitRank";
  if (c.config && real->commInitRankConfig != nullptr) {
    // The caller's config, but blocking: this already runs where the caller's init should (on a
    // thread of its own for a non-blocking one).
    ncclConfig_t config = *c.config;
    config.blocking = 1;
    if (!c.netName.empty()) config.netName = c.netName.c_str();
    api = "ncclCommInitRankConfig";
    r = real->commInitRankConfig(&c.real, c.nranks, offers[0].id, c.rank, &config);
  } else {
    if (c.config)
      FERRY_LOG(Warn, Nccl) << "rank " << c.rank << ": " << real->path
                            << " has no ncclCommInitRankConfig: the communicator's config is not passed on";
    r = real->commInitRank(&c.real, c.nranks, offers[0].id, c.rank);
  }
  if (r != ncclSuccess) {
    c.real = nullptr;
    throw ApiError{r, std::string("the real NCCL's ") + api + " failed: " + real->getLastError(nullptr)};
  }
  c.forwardedTo = real;
  FERRY_LOG(Warn, Nccl) << "rank " << c.rank << " of " << c.nranks << ": the communicator runs on "
                        << real->path << " (" << why << ")";
}

}  // namespace

ncclComm& usable(ncclComm_t comm, bool revokedToo) {
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
    default:
      if (comm->revoked && !revokedToo)
        throw ApiError{ncclInvalidUsage,
                       "the communicator was revoked (ncclCommRevoke): destroy it, or shrink it (ncclCommShrink)"};
      return *comm;
  }
}

ncclResult_t startInit(ncclComm* c, std::function<std::shared_ptr<TcpBootstrap>()> create) {
  auto body = [c, create = std::move(create)] {
    const ncclResult_t r = guarded("communicator init", [&] {
      if (cudaSetDevice(c->device) != cudaSuccess)
        throw ApiError{ncclUnhandledCudaError, "cannot use CUDA device " + std::to_string(c->device)};
      c->bootstrap = create();
      std::string why = Comm::whyNot(*c->bootstrap);
      if (why.empty() && env().ncclForwardAll) why = "FERRY_NCCL_FORWARD_ALL=1";
      if (why.empty())
        c->comm = std::make_unique<Comm>(c->bootstrap, c->options);
      else
        forward(*c, why);
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

}  // namespace ferry::nccl
