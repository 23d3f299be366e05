#include "platform/process_identity.hpp"

#include <unistd.h>

#include <cstring>
#include <mutex>

#include "core/host_id.hpp"

namespace ferry {

std::uint64_t random64() {
  wire::Secret s = randomSecret();
  std::uint64_t v = 0;
  std::memcpy(&v, s.data(), sizeof(v));
  return v;
}

ProcessIdentity processIdentity() {
  static std::mutex mutex;
  static ProcessIdentity current;
  std::lock_guard lock(mutex);
  auto pid = static_cast<std::uint32_t>(::getpid());
  if (current.pid != pid || current.token == 0) {
    current.hostHash = hostHash();
    current.token = random64() | 1;  // never 0, which means "unset"
    current.pid = pid;
  }
  return current;
}

}  // namespace ferry
