#include "fallback.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/logger.hpp"
#include "ferry/env.hpp"

namespace ferry::nccl {
namespace {

template <class F>
bool resolve(void* handle, F& f, const char* name, std::string& missing) {
  f = reinterpret_cast<F>(dlsym(handle, name));
  if (f == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return f != nullptr;
}

std::unique_ptr<RealNccl> load(std::string& why) {
  const std::string path = env().ncclFallback;
  if (path.empty()) {
    why = "FERRY_NCCL_FALLBACK is empty";
    return nullptr;
  }
  if (!nvlsAllowed()) ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // DESIGN.md rule 1, for NCCL too
  // NCCL keeps the message ncclGetLastError returns only when it logs warnings; forwarded errors
  // pass that message on. (A level the user set stays.)
  ::setenv("NCCL_DEBUG", "WARN", 0);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr) {
    const char* err = dlerror();
    why = "cannot load " + path + " (" + (err ? err : "dlopen failed") + "); set FERRY_NCCL_FALLBACK to NVIDIA's libnccl.so.2";
    return nullptr;
  }
  auto real = std::make_unique<RealNccl>();
  real->path = path;
  real->handle = handle;
  std::string missing;
  resolve(handle, real->getVersion, "ncclGetVersion", missing);
  if (real->getVersion == &ncclGetVersion) {
    why = path + " is ferry's own NCCL library, not NVIDIA's; point FERRY_NCCL_FALLBACK at NVIDIA's libnccl.so.2";
    dlclose(handle);
    return nullptr;
  }
  resolve(handle, real->getUniqueId, "ncclGetUniqueId", missing);
  resolve(handle, real->commInitRank, "ncclCommInitRank", missing);
  std::string optional;  // without it, a forwarded comm's config is not passed on (logged)
  resolve(handle, real->commInitRankConfig, "ncclCommInitRankConfig", optional);
  resolve(handle, real->commFinalize, "ncclCommFinalize", missing);
  resolve(handle, real->commDestroy, "ncclCommDestroy", missing);
  resolve(handle, real->commAbort, "ncclCommAbort", missing);
  resolve(handle, real->commGetAsyncError, "ncclCommGetAsyncError", missing);
  resolve(handle, real->getLastError, "ncclGetLastError", missing);
  resolve(handle, real->commRegister, "ncclCommRegister", missing);
  resolve(handle, real->commDeregister, "ncclCommDeregister", missing);
  resolve(handle, real->redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", missing);
  resolve(handle, real->redOpDestroy, "ncclRedOpDestroy", missing);
  resolve(handle, real->allReduce, "ncclAllReduce", missing);
  resolve(handle, real->broadcast, "ncclBroadcast", missing);
  resolve(handle, real->reduce, "ncclReduce", missing);
  resolve(handle, real->allGather, "ncclAllGather", missing);
  resolve(handle, real->reduceScatter, "ncclReduceScatter", missing);
  resolve(handle, real->send, "ncclSend", missing);
  resolve(handle, real->recv, "ncclRecv", missing);
  resolve(handle, real->groupStart, "ncclGroupStart", missing);
  resolve(handle, real->groupEnd, "ncclGroupEnd", missing);
  if (!missing.empty()) {
    why = path + " lacks " + missing;
    dlclose(handle);
    return nullptr;
  }
  int version = 0;
  real->getVersion(&version);
  FERRY_LOG(Info, Nccl) << "fallback NCCL: " << path << " (version code " << version << ")";
  return real;
}

}  // namespace

const RealNccl* realNccl(std::string& why) {
  static std::mutex mu;
  static std::unique_ptr<RealNccl> real;
  static std::string failure;
  static bool tried = false;
  std::lock_guard lock(mu);
  if (!tried) {
    tried = true;
    real = load(failure);
  }
  why = failure;
  return real.get();
}

}  // namespace ferry::nccl
