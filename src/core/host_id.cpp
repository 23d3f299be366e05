#include "core/host_id.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "core/handshake.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry {

std::uint64_t fnv1a(std::string_view data, std::uint64_t seed) {
  std::uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t hostHash() {
  const std::string& id = env().hostId;
  if (!id.empty()) return fnv1a(id);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string bootId;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
  return fnv1a(std::string(host) + "/" + bootId);
}

wire::Secret randomSecret() {
  wire::Secret s{};
  std::size_t got = 0;
  while (got < s.size()) {
    ssize_t n = ::getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SysError("getrandom for the bootstrap secret", errno);
    got += static_cast<std::size_t>(n);
  }
  return s;
}

wire::Secret derivedSecret(std::string_view text) { return handshake::secretFromText(text); }

bool secretsEqual(const wire::Secret& a, const wire::Secret& b) {
  unsigned diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace ferry
