#include "core/interfaces.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry {

std::vector<NetInterface> listInterfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw SysError("getifaddrs", errno);
  std::vector<NetInterface> out;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    SocketAddress addr(it->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (addr.isLinkLocal()) continue;  // would need a scope id on every peer
    addr.setPort(0);
    out.push_back({it->ifa_name, addr});
  }
  ::freeifaddrs(list);
  return out;
}

bool interfaceMatches(const std::string& spec, const std::string& name) {
  std::string s = spec;
  bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  bool exact = !s.empty() && s[0] == '=';
  if (exact) s.erase(0, 1);
  std::stringstream ss(s);
  std::string item;
  bool listed = false;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (exact ? name == item : name.rfind(item, 0) == 0) listed = true;
  }
  return exclude ? !listed : listed;
}

namespace {

bool familyAllowed(const SocketAddress& a, const std::string& family) {
  if (family == "AF_INET") return a.family() == AF_INET;
  if (family == "AF_INET6") return a.family() == AF_INET6;
  return true;
}

// The local address the OS would use to reach `remote` (a UDP connect sends nothing).
std::optional<SocketAddress> routeTo(const SocketAddress& remote) {
  Socket s(::socket(remote.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid() || ::connect(s.fd(), remote.sa(), remote.length()) != 0) return std::nullopt;
  SocketAddress local = s.localAddress();
  local.setPort(0);
  return local;
}

}  // namespace

SocketAddress chooseLocalAddress(const std::optional<SocketAddress>& towards) {
  const Env& e = env();
  auto interfaces = listInterfaces();
  std::string family = e.socketFamily;
  if (towards && family.empty()) family = towards->family() == AF_INET6 ? "AF_INET6" : "AF_INET";

  if (!e.socketIfname.empty()) {
    for (const auto& itf : interfaces)
      if (interfaceMatches(e.socketIfname, itf.name) && familyAllowed(itf.address, family))
        return itf.address;
    std::string names;
    for (const auto& itf : interfaces)
      names += (names.empty() ? "" : ", ") + itf.name + "=" + itf.address.host();
    throw Error(ErrorCode::InvalidUsage, "FERRY_SOCKET_IFNAME='" + e.socketIfname + "'" +
                                             (family.empty() ? "" : " with family " + family) +
                                             " matches no interface that is up; interfaces: " + names);
  }
  if (towards) {
    if (auto routed = routeTo(*towards)) return *routed;
    throw Error(ErrorCode::InvalidUsage, "no route to the root at " + towards->toString() +
                                             "; set FERRY_SOCKET_IFNAME to the interface to use");
  }
  // The root without FERRY_SOCKET_IFNAME: prefer IPv4 unless told otherwise, and loopback last.
  for (bool loopback : {false, true})
    for (const char* fam : {"AF_INET", "AF_INET6"})
      for (const auto& itf : interfaces)
        if (itf.address.isLoopback() == loopback && familyAllowed(itf.address, fam) &&
            familyAllowed(itf.address, family))
          return itf.address;
  throw Error(ErrorCode::InvalidUsage,
              "no network interface is up" + (family.empty() ? std::string() : " with family " + family));
}

}  // namespace ferry
