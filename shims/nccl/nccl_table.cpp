#include "nccl_table.hpp"

#include <dlfcn.h>

namespace ferry::nccl {
namespace {

template <class F>
void resolve(void* handle, F& f, const char* name, std::string& missing) {
  f = reinterpret_cast<F>(dlsym(handle, name));
  if (f == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
}

}  // namespace

std::unique_ptr<NcclTable> openNccl(const std::string& path, int flags, std::string& why) {
  void* handle = dlopen(path.c_str(), flags);
  if (handle == nullptr) {
    const char* err = dlerror();
    why = "cannot load " + path + " (" + (err ? err : "dlopen failed") + ")";
    return nullptr;
  }
  auto t = std::make_unique<NcclTable>();
  t->path = path;
  t->handle = handle;
  std::string missing, optional;
  resolve(handle, t->getVersion, "ncclGetVersion", missing);
  resolve(handle, t->getUniqueId, "ncclGetUniqueId", missing);
  resolve(handle, t->getErrorString, "ncclGetErrorString", missing);
  resolve(handle, t->getLastError, "ncclGetLastError", missing);
  resolve(handle, t->commInitRank, "ncclCommInitRank", missing);
  resolve(handle, t->commInitRankConfig, "ncclCommInitRankConfig", optional);
  resolve(handle, t->commFinalize, "ncclCommFinalize", missing);
  resolve(handle, t->commDestroy, "ncclCommDestroy", missing);
  resolve(handle, t->commAbort, "ncclCommAbort", missing);
  resolve(handle, t->commGetAsyncError, "ncclCommGetAsyncError", missing);
  resolve(handle, t->commRegister, "ncclCommRegister", missing);
  resolve(handle, t->commDeregister, "ncclCommDeregister", missing);
  resolve(handle, t->redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", missing);
  resolve(handle, t->redOpDestroy, "ncclRedOpDestroy", missing);
  resolve(handle, t->allReduce, "ncclAllReduce", missing);
  resolve(handle, t->broadcast, "ncclBroadcast", missing);
  resolve(handle, t->reduce, "ncclReduce", missing);
  resolve(handle, t->allGather, "ncclAllGather", missing);
  resolve(handle, t->reduceScatter, "ncclReduceScatter", missing);
  resolve(handle, t->send, "ncclSend", missing);
  resolve(handle, t->recv, "ncclRecv", missing);
  resolve(handle, t->groupStart, "ncclGroupStart", missing);
  resolve(handle, t->groupEnd, "ncclGroupEnd", missing);
  resolve(handle, t->commWindowRegister, "ncclCommWindowRegister", optional);
  resolve(handle, t->commWindowDeregister, "ncclCommWindowDeregister", optional);
  resolve(handle, t->commShrink, "ncclCommShrink", optional);
  resolve(handle, t->commRevoke, "ncclCommRevoke", optional);
  resolve(handle, t->groupSimulateEnd, "ncclGroupSimulateEnd", optional);
  resolve(handle, t->memAlloc, "ncclMemAlloc", optional);
  resolve(handle, t->memFree, "ncclMemFree", optional);
  if (!missing.empty()) {
    why = path + " lacks " + missing;
    dlclose(handle);
    return nullptr;
  }
  t->getVersion(&t->version);
  return t;
}

}  // namespace ferry::nccl
