// Functions of NCCL 2.29 and 2.30 beyond the 2.28 API this library implements (include/nccl.h),
// exported so that programs built against a newer NCCL load with it preloaded (PyTorch 2.15 imports
// them all). ncclGetVersion still says 2.28.9, so such programs do not reach for them unless they
// call them outright; each is refused with ncclInvalidUsage and a message saying what ferry does
// not offer, as NCCL answers for a feature a communicator lacks. Window pointers: api_windows.cpp.
#include <cstdint>
#include <string>
#include <string_view>

#include "api_internal.hpp"
#include "checks.hpp"
#include "results.hpp"

#define NCCL_API extern "C" __attribute__((visibility("default")))

// NCCL 2.30's types of these calls, as its nccl.h lays them out.
typedef int ncclCommMemStat_t;
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

using namespace ferry::nccl;

namespace {

// The refusal of `api` on comm (checked first, so a bad comm is ncclInvalidArgument as everywhere).
ncclResult_t notOffered(const char* api, ncclComm_t comm, const char* what) {
  return guarded(api, [&]() -> ncclResult_t {
    if (comm != nullptr || std::string_view(api) != "ncclCommGrow") (void)usable(comm);
    throw ApiError{ncclInvalidUsage, std::string("ferry does not offer ") + what + " (NCCL 2.29/2.30; this library "
                                                                                    "implements NCCL 2.28's API)"};
  });
}

}  // namespace

NCCL_API ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* /*uniqueId*/) {
  return notOffered("ncclCommGetUniqueId", comm, "growing a communicator (ncclCommGrow)");
}

NCCL_API ncclResult_t ncclCommGrow(ncclComm_t comm, int /*nRanks*/, const ncclUniqueId* /*uniqueId*/, int /*rank*/,
                                   ncclComm_t* /*newcomm*/, ncclConfig_t* /*config*/) {
  return notOffered("ncclCommGrow", comm, "growing a communicator: make a new one (ncclCommInitRank)");
}

NCCL_API ncclResult_t ncclCommSuspend(ncclComm_t comm, int /*flags*/) {
  return notOffered("ncclCommSuspend", comm, "suspending a communicator: its memory lives as long as it does");
}

NCCL_API ncclResult_t ncclCommResume(ncclComm_t comm) {
  return notOffered("ncclCommResume", comm, "suspending and resuming a communicator");
}

NCCL_API ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t /*stat*/, std::uint64_t* /*value*/) {
  return notOffered("ncclCommMemStats", comm, "communicator memory statistics");
}

NCCL_API ncclResult_t ncclPutSignal(const void* /*localbuff*/, size_t /*count*/, ncclDataType_t /*datatype*/,
                                    int /*peer*/, ncclWindow_t /*peerWin*/, size_t /*peerWinOffset*/, int /*sigIdx*/,
                                    int /*ctx*/, unsigned int /*flags*/, ncclComm_t comm, cudaStream_t /*stream*/) {
  return notOffered("ncclPutSignal", comm, "one-sided puts through the NCCL API: ferry's PortChannel and "
                                           "MemoryChannel put and signal (docs/architecture.md)");
}

NCCL_API ncclResult_t ncclSignal(int /*peer*/, int /*sigIdx*/, int /*ctx*/, unsigned int /*flags*/, ncclComm_t comm,
                                 cudaStream_t /*stream*/) {
  return notOffered("ncclSignal", comm, "signals through the NCCL API: ferry's channels signal and wait");
}

NCCL_API ncclResult_t ncclWaitSignal(int /*nDesc*/, ncclWaitSignalDesc_t* /*signalDescs*/, ncclComm_t comm,
                                     cudaStream_t /*stream*/) {
  return notOffered("ncclWaitSignal", comm, "signals through the NCCL API: ferry's channels signal and wait");
}
