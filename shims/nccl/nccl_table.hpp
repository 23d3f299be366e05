#pragma once
// NVIDIA's NCCL, opened at run time (dlopen) and resolved into one table of function pointers: the
// one place ferry names NCCL's symbols. The NCCL library forwards to it (fallback.hpp), and
// ferry-bench times it beside ferry (tools/ferry-bench/nccl_library.hpp).
//
//   std::string why;
//   std::unique_ptr<NcclTable> nccl = openNccl("libnccl.so.2", RTLD_NOW | RTLD_LOCAL, why);
//   if (!nccl) ... why names the file and the missing symbols
//   nccl->allReduce(send, recv, count, ncclBfloat16, ncclSum, comm, stream);
#include <memory>
#include <string>

#include "nccl.h"

namespace ferry::nccl {

struct NcclTable {
  ncclResult_t (*getVersion)(int*) = nullptr;
  ncclResult_t (*getUniqueId)(ncclUniqueId*) = nullptr;
  const char* (*getErrorString)(ncclResult_t) = nullptr;
  const char* (*getLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*commInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;  // optional
  ncclResult_t (*commFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*commRegister)(ncclComm_t, void*, size_t, void**) = nullptr;
  ncclResult_t (*commDeregister)(ncclComm_t, void*) = nullptr;
  ncclResult_t (*redOpCreatePreMulSum)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t) = nullptr;
  ncclResult_t (*redOpDestroy)(ncclRedOp_t, ncclComm_t) = nullptr;
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  // Optional (newer NCCLs): nullptr where the library lacks them.
  ncclResult_t (*commWindowRegister)(ncclComm_t, void*, size_t, ncclWindow_t*, int) = nullptr;
  ncclResult_t (*commWindowDeregister)(ncclComm_t, ncclWindow_t) = nullptr;
  ncclResult_t (*commShrink)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) = nullptr;
  ncclResult_t (*commRevoke)(ncclComm_t, int) = nullptr;
  ncclResult_t (*groupSimulateEnd)(ncclSimInfo_t*) = nullptr;
  ncclResult_t (*memAlloc)(void**, size_t) = nullptr;
  ncclResult_t (*memFree)(void*) = nullptr;

  std::string path;
  void* handle = nullptr;  // stays open: NCCL's own threads may run its code until the process ends
  int version = 0;         // ncclGetVersion's code, e.g. 22809
};

// Opens `path` with dlopen(flags) and resolves every symbol above (commInitRankConfig and the
// optional ones may be missing). nullptr, with `why` naming the file and what it lacks, when it cannot.
std::unique_ptr<NcclTable> openNccl(const std::string& path, int flags, std::string& why);

}  // namespace ferry::nccl
