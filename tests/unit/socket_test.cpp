// Addresses (IPv4, IPv6, names), interface matching, and blocking transfers with deadlines.
#include "core/socket.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "core/interfaces.hpp"
#include "core/serializer.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

TEST(SocketAddress, ParsesIPv4IPv6AndNames) {
  EXPECT_EQ(SocketAddress::parse("127.0.0.1:80").toString(), "127.0.0.1:80");
  EXPECT_EQ(SocketAddress::parse("[::1]:65535").toString(), "[::1]:65535");
  EXPECT_TRUE(SocketAddress::parse("localhost:1").isLoopback());
  EXPECT_EQ(SocketAddress::parse("[::1]:5").family(), AF_INET6);
  for (const char* bad : {"127.0.0.1", "::1:80", "[::1]80", "127.0.0.1:99999", ":80", "127.0.0.1:x"}) {
    EXPECT_THROW(SocketAddress::parse(bad), Error) << bad;
  }
  EXPECT_THROW(SocketAddress::parse("no.such.host.invalid:1"), Error);
}

TEST(SocketAddress, WireRoundTrip) {
  for (const char* text : {"10.1.2.3:4567", "[fd00::2]:1"}) {
    Writer w;
    SocketAddress::parse(text).serialize(w);
    ASSERT_EQ(w.size(), SocketAddress::kWireBytes);
    Reader r(w.bytes());
    EXPECT_EQ(SocketAddress::deserialize(r).toString(), text);
  }
  std::vector<std::byte> bad(SocketAddress::kWireBytes, std::byte{0});
  bad[0] = std::byte{5};
  Reader r(bad);
  EXPECT_THROW(SocketAddress::deserialize(r), Error);
}

TEST(Interfaces, MatchingRules) {
  EXPECT_TRUE(interfaceMatches("eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("ib,eth", "eth1"));
  EXPECT_FALSE(interfaceMatches("ib", "eth0"));
  EXPECT_FALSE(interfaceMatches("^docker,lo", "lo"));
  EXPECT_TRUE(interfaceMatches("^docker,lo", "eth0"));
  EXPECT_TRUE(interfaceMatches("=eth0", "eth0"));
  EXPECT_FALSE(interfaceMatches("=eth0", "eth01"));
  EXPECT_FALSE(interfaceMatches("^=eth0", "eth0"));
}

TEST(Interfaces, LoopbackIsListed) {
  bool sawLoopback = false;
  for (const auto& itf : listInterfaces()) sawLoopback |= itf.address.isLoopback();
  EXPECT_TRUE(sawLoopback);
}

TEST(Socket, TransfersAndDeadlines) {
  Socket listener = Socket::listen(SocketAddress::resolve("127.0.0.1", 0), false);
  SocketAddress at = listener.localAddress();
  Socket client = Socket::connect(at, Clock::now() + 2s);
  Socket server(::accept(listener.fd(), nullptr, nullptr));
  ASSERT_TRUE(server.valid());
  std::vector<std::byte> out(1 << 20), in(1 << 20);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 7);
  std::thread sender([&] { client.sendAll(out, Clock::now() + 5s); });
  server.recvAll(in, Clock::now() + 5s);
  sender.join();
  EXPECT_EQ(in, out);
  // Nothing more comes: the receive gives up at its deadline.
  auto start = Clock::now();
  std::byte one[1];
  EXPECT_THROW(server.recvAll(one, Clock::now() + 200ms), TimeoutError);
  EXPECT_LT(Clock::now() - start, 2s);
  // The peer closes: a RemoteError, not a hang.
  client.close();
  try {
    server.recvAll(one, Clock::now() + 2s);
    ADD_FAILURE() << "expected RemoteError";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RemoteError) << e.what();
  }
  Socket refused;
  listener.close();
  EXPECT_THROW(Socket::connect(at, Clock::now() + 1s), SysError);
}

}  // namespace
}  // namespace ferry
