// main() for multi-process tests: every rank talks over loopback only (this workplace allows no
// other traffic, and tests must not depend on the machine's interfaces).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

#include "core/socket.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
int freePort(int family) {
  SocketAddress any = SocketAddress::resolve(family == AF_INET6 ? "::1" : "127.0.0.1", 0);
  Socket s = Socket::listen(any, true);
  return s.localAddress().port();
}
}  // namespace ferry::test

int main(int argc, char** argv) {
  setenv("FERRY_SOCKET_IFNAME", "lo", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
