// Ethernet connections between processes on loopback (transport/ethernet_connection.hpp): writes
// of random sizes (1 byte too) at unaligned offsets land byte for byte before the word that
// follows them, flush confirms, and what a peer cannot be allowed to do is refused: memory not
// registered for Ethernet or out of range (by the sender, before anything is sent), and memory the
// owner no longer has (by the owner's receiver, whose reason reaches the sender's flush); a
// stranger on a listener is turned away, and a peer that never comes is a timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "ferry/bootstrap.hpp"
#include "ferry/communicator.hpp"
#include "ferry/errors.hpp"
#include "core/socket.hpp"
#include "mp_harness.hpp"
#include "support/write_rounds.hpp"
#include "transport/ethernet_connection.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

// Read once per process, before the ranks fork: the connections listen on loopback, with 4 lanes
// (writes from 1 MiB up are cut across them: the second round of every test is one such write).
const bool kEnvironmentSet = [] {
  ::setenv("FERRY_SOCKET_IFNAME", "lo", 1);
  ::setenv("FERRY_ETHERNET_LANES", "4", 1);
  return true;
}();

template <class F>
void expectError(ErrorCode code, const std::string& text, F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying '" << text << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(EthernetConnection, WritesLandBeforeTheSignal) {
  ASSERT_TRUE(kEnvironmentSet);
  UniqueId id = UniqueId::create();
  constexpr std::size_t kDst = (1 << 20) + 123;
  constexpr std::size_t kSrc = (1 << 20) + 77;
  constexpr int kRounds = 60;
  runRanksOk(2, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 2);
    Communicator comm(boot);
    const int peer = 1 - rank;
    auto connFuture = comm.connect(peer, Transport::Ethernet);
    std::vector<std::uint64_t> flag(1, 0);  // the word the peer signals
    RegisteredMemory myFlag = comm.registerMemory(flag.data(), 8, Transport::Ethernet);
    comm.sendMemory(myFlag, peer, 1);
    RegisteredMemory peerFlag = comm.recvMemory(peer, 1).get();
    EXPECT_EQ(peerFlag.data(), nullptr);  // not mapped: the bytes travel
    std::vector<std::byte> dst(kDst, std::byte{0});
    RegisteredMemory dstMem;
    if (rank == 0) {
      dstMem = comm.registerMemory(dst.data(), kDst, Transport::Ethernet);
      comm.sendMemory(dstMem, 1, 2);
    }
    std::shared_ptr<Connection> conn = connFuture.get();
    EXPECT_EQ(conn->transport(), Transport::Ethernet);
    std::uint64_t outbound = 0;
    const auto sequence = writeRounds(kDst, kSrc, kRounds);
    if (rank == 1) {
      RegisteredMemory theirs = comm.recvMemory(0, 2).get();
      EXPECT_EQ(theirs.size(), kDst);
      std::vector<std::byte> src(kSrc);
      RegisteredMemory srcMem = comm.registerMemory(src.data(), kSrc, Transport::Ethernet);
      for (int r = 0; r < kRounds; ++r) {
        const WriteOp& op = sequence[r];
        fillRound(src.data(), r, op);
        // Registered source and unregistered pointer, by turns.
        if (r % 2 == 0)
          conn->write(theirs, op.dstOff, srcMem, op.srcOff, op.bytes);
        else
          conn->write(theirs, op.dstOff, src.data() + op.srcOff, op.bytes);
        conn->updateAndSync(peerFlag, 0, &outbound, r + 1);
        if (r % 3 == 0) {
          conn->flush(10s);
        } else {
          const std::uint64_t ticket = conn->beginFlush();
          auto deadline = std::chrono::steady_clock::now() + 10s;
          while (!conn->flushComplete(ticket)) ASSERT_LT(std::chrono::steady_clock::now(), deadline);
        }
        waitWord(flag.data(), r + 1, "rank 0's check");  // rank 0 is done reading this round
      }
    } else {
      ShadowBuffer shadow(kDst);
      for (int r = 0; r < kRounds; ++r) {
        waitWord(flag.data(), r + 1, "rank 1's data");
        const WriteOp& op = sequence[r];
        shadow.apply(r, op);
        const std::size_t bad = shadow.firstWrong(dst.data());
        ASSERT_EQ(bad, kDst) << "round " << r << " (" << op.bytes << " bytes at " << op.dstOff << "): byte "
                             << bad << " is wrong";
        conn->updateAndSync(peerFlag, 0, &outbound, r + 1);
        conn->flush(10s);
      }
    }
    boot->barrier();
  });
}

TEST(EthernetConnection, WhatAPeerMayNotWriteIsRefused) {
  UniqueId id = UniqueId::create();
  runRanksOk(2, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 2);
    Communicator comm(boot);
    const int peer = 1 - rank;
    auto connFuture = comm.connect(peer, Transport::Ethernet);
    std::vector<std::byte> mapped(256), gone(256);
    if (rank == 0) {
      comm.sendMemory(comm.registerMemory(mapped.data(), mapped.size(), Transport::HostMemory), 1, 1);
      RegisteredMemory goneMem = comm.registerMemory(gone.data(), gone.size(), Transport::Ethernet);
      comm.sendMemory(goneMem, 1, 2);
      boot->barrier();  // rank 1 has both descriptors
    }  // goneMem deregistered here
    std::shared_ptr<Connection> conn = connFuture.get();
    if (rank == 1) {
      RegisteredMemory hostOnly = comm.recvMemory(0, 1).get();
      RegisteredMemory goneMem = comm.recvMemory(0, 2).get();
      boot->barrier();
      boot->barrier();  // rank 0 dropped its registration
      std::vector<std::byte> src(512);
      // Checked here, before anything is sent.
      expectError(ErrorCode::InvalidUsage, "not for Ethernet", [&] { conn->write(hostOnly, 0, src.data(), 8); });
      expectError(ErrorCode::InvalidUsage, "outside its 256-byte registration",
                  [&] { conn->write(goneMem, 200, src.data(), 100); });
      std::uint64_t word = 0;
      expectError(ErrorCode::InvalidUsage, "not 8-byte aligned", [&] { conn->updateAndSync(goneMem, 4, &word, 1); });
      // A write into this rank's own memory is a copy here.
      std::vector<std::byte> own(64, std::byte{0});
      RegisteredMemory ownMem = comm.registerMemory(own.data(), own.size(), Transport::Ethernet);
      for (std::size_t i = 0; i < 16; ++i) src[i] = std::byte(i + 1);
      conn->write(ownMem, 8, src.data(), 16);
      EXPECT_EQ(own[8], std::byte{1});
      EXPECT_EQ(own[23], std::byte{16});
      EXPECT_EQ(own[24], std::byte{0});
      // Refused by rank 0's receiver: the registration is gone there.
      conn->write(goneMem, 0, src.data(), 16);
      expectError(ErrorCode::RemoteError, "refused a write", [&] { conn->flush(10s); });
      // The connection is closed after a refusal: what follows is an error at once, not a timeout.
      const auto start = Clock::now();
      expectError(ErrorCode::RemoteError, "", [&] {
        conn->write(goneMem, 0, src.data(), 16);
        conn->flush(10s);
      });
      EXPECT_LT(Clock::now() - start, 5s);
    } else {
      boot->barrier();
    }
    boot->barrier();
  });
}

// The setup itself, both ends in this process: a stranger on a listener (garbage, then silence) is
// turned away while the real peer still gets in on each of its 3 lanes; a peer that never comes is
// a timeout naming it.
TEST(EthernetConnection, StrangersAreTurnedAwayAndAbsentPeersTimeOut) {
  auto a = EthernetConnection::Endpoint::open();
  auto b = EthernetConnection::Endpoint::open();
  const SocketAddress aAddress = a.address, bAddress = b.address;
  const auto aKey = a.key, bKey = b.key;
  const auto deadline = Clock::now() + 10s;
  Socket garbage = Socket::connect(aAddress, deadline);
  const std::vector<std::byte> junk(32, std::byte{0x5a});
  garbage.sendAll(junk, deadline);
  Socket silent = Socket::connect(aAddress, deadline);
  std::vector<Socket> crowd;  // more silent strangers than a listener keeps
  for (int i = 0; i < 80; ++i) crowd.push_back(Socket::connect(aAddress, deadline));
  std::shared_ptr<EthernetConnection> fromA, fromB;
  const auto setup = Clock::now();
  std::thread other([&] { fromB = EthernetConnection::establish(1, 0, std::move(b), aAddress, aKey, 3, 20s); });
  fromA = EthernetConnection::establish(0, 1, std::move(a), bAddress, bKey, 3, 20s);
  other.join();
  ASSERT_TRUE(fromA && fromB);
  EXPECT_LT(Clock::now() - setup, 3s) << "the strangers held the real peer up";
  EXPECT_EQ(fromA->remoteRank(), 1);
  EXPECT_EQ(fromB->remoteRank(), 0);
  EXPECT_EQ(fromA->lanes(), 3);

  auto lonely = EthernetConnection::Endpoint::open();
  auto absent = EthernetConnection::Endpoint::open();  // listens, but its rank never sets up
  const auto start = Clock::now();
  expectError(ErrorCode::Timeout, "rank 3 did not connect", [&] {
    EthernetConnection::establish(2, 3, std::move(lonely), absent.address, absent.key, 1, 1s);
  });
  EXPECT_LT(Clock::now() - start, 5s);
}

}  // namespace
}  // namespace ferry::test
