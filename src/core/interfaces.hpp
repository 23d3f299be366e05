#pragma once
// Which local address the bootstrap listens on.
#include <optional>
#include <string>
#include <vector>

#include "core/socket.hpp"

namespace ferry {

struct NetInterface {
  std::string name;
  SocketAddress address;  // port 0
};

// The interfaces that are up and have an address, in the order the OS lists them.
std::vector<NetInterface> listInterfaces();

// FERRY_SOCKET_IFNAME syntax: comma-separated name prefixes; a leading ^ excludes the listed
// prefixes instead; a leading = (after the optional ^) makes the names exact.
bool interfaceMatches(const std::string& spec, const std::string& name);

// The address to listen on (port 0). With `towards` (the root's address): the interface named by
// FERRY_SOCKET_IFNAME, else the one the OS routes to the root through. Without it (the root
// itself): FERRY_SOCKET_IFNAME, else the first non-loopback interface, else loopback.
// FERRY_SOCKET_FAMILY restricts the family. Throws InvalidUsage when nothing matches.
SocketAddress chooseLocalAddress(const std::optional<SocketAddress>& towards);

}  // namespace ferry
