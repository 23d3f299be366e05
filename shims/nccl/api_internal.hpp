#pragma once
// What the files of the exported API share (api.cpp defines these): forwarding to the real NCCL,
// init of a comm from a unique id, and the caller's config kept for a forwarded comm.
#include "fallback.hpp"
#include "nccl.h"
#include "nccl_comm.hpp"

namespace ferry::nccl {

// The real NCCL when `c` is forwarded to it, else nullptr. Inside a group of ours, a forwarded call
// joins a group of the real NCCL that closes with ours.
const RealNccl* forwarded(const ncclComm& c);
// What a forwarded call returns: its result, with the real NCCL's message for an error (ApiError).
ncclResult_t realResult(const ncclComm& c, ncclResult_t r);
// ApiError with this thread's last message unless r is ncclSuccess or ncclInProgress.
void checkReady(ncclResult_t r);
// A copy of the caller's config for a forwarded init: the fields its size covers, the rest at
// NCCL_CONFIG_INITIALIZER's values, so that it is a whole ncclConfig_t of this header.
void keepConfig(ncclComm& c, const ncclConfig_t* config);
// A new comm of `rank` in `nranks` on parent's GPU (ncclCommSplit, ncclCommShrink), its init not
// started: the config's options, or without a config the parent's options and config.
ncclComm* childComm(const ncclComm& parent, int rank, int nranks, const ncclConfig_t* config);
// ncclCommInitRank(Config)'s body, `api` naming the caller: deferred to the outermost ncclGroupEnd
// inside a group, else started (non-blocking configs return ncclInProgress).
ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& commId, int rank, const ncclConfig_t* config,
                      const char* api);

}  // namespace ferry::nccl
