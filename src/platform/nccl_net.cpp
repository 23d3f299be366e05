#include "platform/nccl_net.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/logger.hpp"
#include "ferry/env.hpp"

namespace ferry::nccl_net {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;  // AddressSanitizer refuses RTLD_DEEPBIND (its interceptors would be skipped)
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

template <class Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

// The file a function of this process lives in ("" when dladdr cannot say).
std::string fileOf(const void* function) {
  Dl_info info{};
  if (dladdr(function, &info) == 0 || info.dli_fname == nullptr) return {};
  return info.dli_fname;
}

std::unique_ptr<Library> open(std::string& why) {
  const std::string path = env().ncclFallback;
  if (path.empty()) {
    why = "FERRY_NCCL_FALLBACK is empty: no NCCL to open";
    return nullptr;
  }
  prepareEnvironment();
  if (!env().hostId.empty()) ::setenv("NCCL_HOSTID", env().hostId.c_str(), 0);
  // DEEPBIND: NCCL's calls of its own functions resolve inside it, never to a preloaded
  // libferry_nccl.so's functions of the same names.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
  if (handle == nullptr) {
    const char* err = dlerror();
    why = "dlopen(" + path + ") failed: " + (err ? err : "unknown error") +
          "; set FERRY_NCCL_FALLBACK to NVIDIA's libnccl.so.2";
    return nullptr;
  }
  auto nccl = std::make_unique<Library>();
  std::string missing;
  resolve(handle, "ncclGetVersion", nccl->getVersion, missing);
  resolve(handle, "ncclGetUniqueId", nccl->getUniqueId, missing);
  resolve(handle, "ncclGetErrorString", nccl->getErrorString, missing);
  resolve(handle, "ncclGetLastError", nccl->getLastError, missing);
  resolve(handle, "ncclCommInitRank", nccl->commInitRank, missing);
  resolve(handle, "ncclCommDestroy", nccl->commDestroy, missing);
  resolve(handle, "ncclCommAbort", nccl->commAbort, missing);
  resolve(handle, "ncclCommGetAsyncError", nccl->commGetAsyncError, missing);
  resolve(handle, "ncclSend", nccl->send, missing);
  resolve(handle, "ncclRecv", nccl->recv, missing);
  resolve(handle, "ncclGroupStart", nccl->groupStart, missing);
  resolve(handle, "ncclGroupEnd", nccl->groupEnd, missing);
  if (!missing.empty()) {
    why = path + " lacks " + missing + " (is it NVIDIA's libnccl.so.2, 2.19 or newer?)";
    return nullptr;  // (the handle stays open: closing a half-loaded NCCL gains nothing)
  }
  // libferry_nccl.so holds this very code: its ncclGetVersion in the same file means the path
  // named ferry's own library, whose Comm across hosts would come back here.
  const std::string self = fileOf(reinterpret_cast<const void*>(&library));
  if (!self.empty() && fileOf(reinterpret_cast<const void*>(nccl->getVersion)) == self) {
    why = path + " is ferry's own NCCL library, not NVIDIA's; point FERRY_NCCL_FALLBACK at NVIDIA's libnccl.so.2";
    return nullptr;
  }
  nccl->path = path;
  if (nccl->getVersion(&nccl->version) != kSuccess) nccl->version = 0;
  FERRY_LOG(Info, Transport) << "NCCL for the network across hosts: " << path << " (version code " << nccl->version
                             << ")";
  return nccl;
}

}  // namespace

const Library* library(std::string& why) {
  static std::mutex mu;
  static std::unique_ptr<Library> nccl;
  static std::string failure;
  static bool tried = false;
  std::lock_guard lock(mu);
  if (!tried) {
    tried = true;
    nccl = open(failure);
  }
  why = failure;
  return nccl.get();
}

void prepareEnvironment() {
  if (!nvlsAllowed()) ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  ::setenv("NCCL_DEBUG", "WARN", 0);
}

std::string describe(const Library& nccl, Comm comm, const std::string& what, int result) {
  std::string text = "NCCL " + std::to_string(nccl.version) + " (" + nccl.path + "): " + what + ": " +
                     nccl.getErrorString(result);
  const char* last = comm != nullptr ? nccl.getLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

}  // namespace ferry::nccl_net
