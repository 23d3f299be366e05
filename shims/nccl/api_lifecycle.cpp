// The communicator calls of NCCL 2.27 and 2.28 beyond init, split and destroy (api.cpp):
// ncclCommInitRankScalable, ncclCommShrink, ncclCommRevoke, ncclResetDebugInit, and the device
// communicators of nccl_device.h (ncclDevCommCreate / ncclDevCommDestroy), which ferry does not
// offer: they get NCCL's answer for a communicator without symmetric device support.
#include <algorithm>
#include <cstring>
#include <vector>

#include "api_internal.hpp"
#include "checks.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "results.hpp"

#define NCCL_API extern "C" __attribute__((visibility("default")))

// nccl_device.h's types, opaque here: ferry only refuses them.
struct ncclDevCommRequirements;
struct ncclDevComm;

using namespace ferry;
using namespace ferry::nccl;

namespace {

// ncclCommShrink's messages on the parent's bootstrap: below the Communicator's tags
// (Communicator::kBootstrapTagBase), one per shrink of the comm.
constexpr int kShrinkTagBase = 1 << 29;

}  // namespace

// NCCL spreads its bootstrap over nId roots; ferry's bootstrap has one root, so every rank joins
// through the first id (made by rank 0, which reserved its port).
NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId* commIds, ncclConfig_t* config) {
  const ncclResult_t checked = guarded("ncclCommInitRankScalable", [&] {
    if (nId < 1) throw ApiError{ncclInvalidArgument, "nId " + std::to_string(nId) + " must be >= 1"};
    checkNotNull(commIds, "commIds");
    return ncclSuccess;
  });
  if (checked != ncclSuccess) return checked;
  return initRank(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}

// The ranks of comm but the excluded ones (which do not call it: they may be gone) form a new
// communicator. The lowest of them makes a fresh UniqueId and sends it to the others over the
// parent's bootstrap, point to point, so no excluded rank is waited for; then every one of them
// makes the new comm as ncclCommInitRankConfig does (natively, or forwarded to the real NCCL).
NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return guarded("ncclCommShrink", [&] {
    ncclComm& c = usable(comm, /*revokedToo=*/true);
    checkNotNull(newcomm, "newcomm");
    checkConfig(config);
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      throw ApiError{ncclInvalidArgument, "shrinkFlags " + std::to_string(shrinkFlags) +
                                              " is neither NCCL_SHRINK_DEFAULT nor NCCL_SHRINK_ABORT"};
    if (excludeRanksCount < 0 || excludeRanksCount >= c.nranks)
      throw ApiError{ncclInvalidArgument, "excludeRanksCount " + std::to_string(excludeRanksCount) +
                                              " must be in [0, " + std::to_string(c.nranks) + ")"};
    if (excludeRanksCount > 0) checkNotNull(excludeRanksList, "excludeRanksList");
    std::vector<bool> excluded(static_cast<std::size_t>(c.nranks), false);
    for (int i = 0; i < excludeRanksCount; ++i) {
      const int r = excludeRanksList[i];
      checkRankIn(r, c.nranks, "excludeRanksList entry");
      if (excluded[static_cast<std::size_t>(r)])
        throw ApiError{ncclInvalidArgument, "rank " + std::to_string(r) + " is listed twice in excludeRanksList"};
      if (r == c.rank)
        throw ApiError{ncclInvalidUsage, "rank " + std::to_string(r) +
                                             " is in excludeRanksList: excluded ranks must not call ncclCommShrink"};
      excluded[static_cast<std::size_t>(r)] = true;
    }
    std::vector<int> survivors;
    for (int r = 0; r < c.nranks; ++r)
      if (!excluded[static_cast<std::size_t>(r)]) survivors.push_back(r);
    const int newRank = static_cast<int>(std::find(survivors.begin(), survivors.end(), c.rank) - survivors.begin());
    const int newSize = static_cast<int>(survivors.size());

    if (shrinkFlags == NCCL_SHRINK_ABORT) {
      // The parent's work stops on every rank first, as NCCL's abort-then-shrink.
      if (c.comm) c.comm->abort();
      if (c.real != nullptr && c.forwardedTo->commRevoke != nullptr) (void)c.forwardedTo->commRevoke(c.real, 0);
      c.revoked = true;  // the parent is left to be destroyed
    }
    const int tag = kShrinkTagBase + c.shrinks++;
    UniqueId id;
    if (newRank == 0) {
      id = UniqueId::create();
      for (int i = 1; i < newSize; ++i) c.bootstrap->send(id.bytes.data(), UniqueId::kBytes, survivors[i], tag);
    } else {
      c.bootstrap->recv(id.bytes.data(), UniqueId::kBytes, survivors[0], tag);
    }
    ncclComm* n = childComm(c, newRank, newSize, config);
    *newcomm = n;
    const ncclResult_t r = startInit(n, [id, newRank, newSize] { return TcpBootstrap::create(id, newRank, newSize); });
    checkReady(r);
    return r;
  });
}

// Stops the comm's work on every rank (ferry's abort flag: every kernel's waits give up) and leaves
// the comm only to be destroyed or shrunk.
NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guarded("ncclCommRevoke", [&] {
    ncclComm& c = usable(comm, /*revokedToo=*/true);
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      throw ApiError{ncclInvalidArgument, "revokeFlags " + std::to_string(revokeFlags) + " must be 0"};
    if (const RealNccl* real = forwarded(c)) {
      if (real->commRevoke == nullptr)
        throw ApiError{ncclInvalidUsage, "the real NCCL (" + real->path + ") has no ncclCommRevoke"};
      realResult(c, real->commRevoke(c.real, revokeFlags));
    } else {
      c.comm->abort();
    }
    c.revoked = true;
    return ncclSuccess;
  });
}

// NCCL re-reads its debug settings; ferry's log settings (FERRY_LOG_LEVEL) are read when used.
NCCL_API void ncclResetDebugInit(void) {}

NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements* /*reqs*/,
                                        ncclDevComm* /*outDevComm*/) {
  return guarded("ncclDevCommCreate", [&]() -> ncclResult_t {
    (void)usable(comm);
    throw ApiError{ncclInvalidUsage,
                   "this communicator has no symmetric device support: ferry does not offer NCCL's device "
                   "communicators (nccl_device.h); ferry's own device API is its channels (docs/nccl.md)"};
  });
}

NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm* /*devComm*/) {
  return guarded("ncclDevCommDestroy", [&]() -> ncclResult_t {
    (void)usable(comm);
    throw ApiError{ncclInvalidUsage, "no device communicator of this communicator exists (ncclDevCommCreate "
                                     "is refused: ferry does not offer them)"};
  });
}
