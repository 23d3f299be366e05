#include "fallback.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "platform/nccl_net.hpp"

namespace ferry::nccl {
namespace {

std::unique_ptr<RealNccl> load(std::string& why) {
  const std::string path = env().ncclFallback;
  if (path.empty()) {
    why = "FERRY_NCCL_FALLBACK is empty";
    return nullptr;
  }
  // Multicast off (architecture.md rule 1) and warnings on: forwarded errors pass on the message
  // ncclGetLastError returns, which NCCL keeps only when it warns.
  nccl_net::prepareEnvironment();
  std::string failed;
  std::unique_ptr<RealNccl> real = openNccl(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND, failed);
  if (!real) {
    why = failed + "; set FERRY_NCCL_FALLBACK to NVIDIA's libnccl.so.2";
    return nullptr;
  }
  if (real->getVersion == &ncclGetVersion) {
    why = path + " is ferry's own NCCL library, not NVIDIA's; point FERRY_NCCL_FALLBACK at NVIDIA's libnccl.so.2";
    dlclose(real->handle);
    return nullptr;
  }
  FERRY_LOG(Info, Nccl) << "fallback NCCL: " << path << " (version code " << real->version << ")";
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
