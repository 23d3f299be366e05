#pragma once
// The real NCCL that communicators ferry cannot run natively are forwarded to (FERRY_NCCL_FALLBACK,
// default libnccl.so.2): those whose ranks span hosts, or all of them with FERRY_NCCL_FORWARD_ALL=1. It is
// loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so its own calls resolve inside it, never to ferry's
// exports; a file that turns out to be ferry's shim is refused. NVLink multicast stays off in it unless ferry
// allows it (DESIGN.md rule 1).
#include <memory>
#include <string>

#include "nccl.h"

namespace ferry::nccl {

struct RealNccl {
  ncclResult_t (*getVersion)(int*) = nullptr;
  ncclResult_t (*getUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*commInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int,
                                     ncclConfig_t*) = nullptr;  // optional
  ncclResult_t (*commFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*getLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*commRegister)(ncclComm_t, void*, size_t, void**) = nullptr;
  ncclResult_t (*commDeregister)(ncclComm_t, void*) = nullptr;
  ncclResult_t (*redOpCreatePreMulSum)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t) = nullptr;
  ncclResult_t (*redOpDestroy)(ncclRedOp_t, ncclComm_t) = nullptr;
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t) = nullptr;
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  std::string path;
  void* handle = nullptr;
};

// The process's real NCCL, loaded on first use; nullptr (and `why`) when there is none.
const RealNccl* realNccl(std::string& why);

}  // namespace ferry::nccl
