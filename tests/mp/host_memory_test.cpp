// Registered host memory between processes on loopback: rank 0's hostAlloc memory mapped in rank
// 1 and written through a HostMemoryConnection (write, then updateAndSync), checked byte by byte
// by rank 0 with random data, random sizes (1 byte too) and unaligned offsets; N-peer setup posted
// in one batch; a freed allocation that a peer asks for; and 10,000 deserialize/release cycles on a
// peer that leave descriptors, mappings and imports where they started.
#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "ferry/communicator.hpp"
#include "ferry/memory.hpp"
#include "mp_harness.hpp"
#include "support/fd_count.hpp"
#include "support/write_rounds.hpp"
#include "memory/registered_memory_impl.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

// Mappings of hostAlloc memory (memfd "ferry-host") in this process. Only those: the sanitizers'
// allocators add mappings of their own as they go.
std::size_t mappingCount() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/memfd:ferry-host") != std::string::npos;
  return n;
}

TEST(HostMemoryConnection, WritesLandBeforeTheSignal) {
  UniqueId id = UniqueId::create();
  constexpr std::size_t kDst = (1 << 20) + 123;
  constexpr std::size_t kSrc = (1 << 20) + 77;
  constexpr int kRounds = 60;
  runRanksOk(2, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 2);
    Communicator comm(boot);
    const int peer = 1 - rank;
    auto connFuture = comm.connect(peer, Transport::HostMemory);
    // Each rank owns one flag word the other signals: rank 0's "data ready", rank 1's "checked".
    auto flag = hostCallocShared<std::uint64_t>(1);
    RegisteredMemory myFlag = comm.registerMemory(flag.get(), 8, Transport::HostMemory);
    comm.sendMemory(myFlag, peer, 1);
    auto peerFlagFuture = comm.recvMemory(peer, 1);
    std::shared_ptr<void> dst;
    RegisteredMemory dstMem;
    if (rank == 0) {
      dst = hostAlloc(kDst);
      dstMem = comm.registerMemory(dst.get(), kDst, Transport::HostMemory);
      comm.sendMemory(dstMem, 1, 2);
    }
    auto dstFuture = rank == 1 ? comm.recvMemory(0, 2) : std::shared_future<RegisteredMemory>();
    std::shared_ptr<Connection> conn = connFuture.get();
    RegisteredMemory peerFlag = peerFlagFuture.get();
    ASSERT_NE(peerFlag.data(), nullptr);
    EXPECT_FALSE(peerFlag.isLocal());
    std::uint64_t outbound = 0;
    auto sequence = writeRounds(kDst, kSrc, kRounds);

    if (rank == 1) {
      RegisteredMemory theirs = dstFuture.get();
      ASSERT_NE(theirs.data(), nullptr);
      EXPECT_EQ(theirs.size(), kDst);
      EXPECT_EQ(theirs.rank(), 0);
      // Half the rounds from ferry host memory, half from plain malloc'ed memory.
      auto ferrySrc = hostAlloc(kSrc);
      std::vector<std::byte> plainSrc(kSrc);
      RegisteredMemory srcs[2] = {comm.registerMemory(ferrySrc.get(), kSrc, Transport::HostMemory),
                                  comm.registerMemory(plainSrc.data(), kSrc, Transport::HostMemory)};
      for (int r = 0; r < kRounds; ++r) {
        RegisteredMemory& src = srcs[r % 2];
        auto* s = static_cast<std::byte*>(src.data());
        const WriteOp& op = sequence[r];
        fillRound(s, r, op);
        conn->write(theirs, op.dstOff, src, op.srcOff, op.bytes);
        conn->updateAndSync(peerFlag, 0, &outbound, r + 1);
        EXPECT_EQ(outbound, static_cast<std::uint64_t>(r + 1));
        if (r % 2 == 0)
          conn->flush(5s);
        else  // host-memory writes are complete when they return: the asynchronous flush says so
          EXPECT_TRUE(conn->flushComplete(conn->beginFlush()));
        waitWord(flag.get(), r + 1, "rank 0's check");  // rank 0 is done reading this round
      }
    } else {
      // Rank 0 keeps a shadow of what its buffer must hold and compares every byte each round.
      ShadowBuffer shadow(kDst);
      auto* d = static_cast<std::byte*>(dst.get());
      for (int r = 0; r < kRounds; ++r) {
        waitWord(flag.get(), r + 1, "rank 1's data");
        const WriteOp& op = sequence[r];
        shadow.apply(r, op);
        const std::size_t bad = shadow.firstWrong(d);
        ASSERT_EQ(bad, kDst) << "round " << r << " (" << op.bytes << " bytes at " << op.dstOff << "): byte "
                             << bad << " is wrong";
        conn->updateAndSync(peerFlag, 0, &outbound, r + 1);
      }
    }
    boot->barrier();
  });
}

// Every rank connects to and exchanges memory with every other, posting everything first and then
// getting the futures; then each writes its rank into its slot of every peer's buffer.
TEST(Communicator, BatchedSetupOfAllPeers) {
  UniqueId id = UniqueId::create();
  constexpr int n = 4;
  constexpr std::size_t kSlot = 1000;
  runRanksOk(n, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, n);
    Communicator comm(boot);
    auto buf = hostAlloc(kSlot * n);
    auto src = hostAlloc(kSlot);
    std::memset(src.get(), rank + 1, kSlot);
    RegisteredMemory mine = comm.registerMemory(buf.get(), kSlot * n, Transport::HostMemory);
    RegisteredMemory srcMem = comm.registerMemory(src.get(), kSlot, Transport::HostMemory);
    std::vector<std::shared_future<std::shared_ptr<Connection>>> conns(n);
    std::vector<std::shared_future<RegisteredMemory>> theirs(n);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      conns[peer] = comm.connect(peer, Transport::HostMemory);
      comm.sendMemory(mine, peer);
      theirs[peer] = comm.recvMemory(peer);
    }
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      auto conn = conns[peer].get();
      RegisteredMemory m = theirs[peer].get();
      ASSERT_EQ(m.rank(), peer);
      conn->write(m, kSlot * rank, srcMem, 0, kSlot);
      conn->flush();
    }
    boot->barrier();
    auto* b = static_cast<unsigned char*>(buf.get());
    for (int peer = 0; peer < n; ++peer)
      for (std::size_t i = 0; i < kSlot; ++i)
        ASSERT_EQ(b[peer * kSlot + i], peer == rank ? 0 : peer + 1)
            << "slot of rank " << peer << ", byte " << i;
    boot->barrier();
  });
}

TEST(RegisteredMemory, FreedBeforeThePeerMapsItIsAClearError) {
  UniqueId id = UniqueId::create();
  runRanksOk(2, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 2);
    Communicator comm(boot);
    if (rank == 0) {
      auto buf = hostAlloc(4096);
      comm.sendMemory(comm.registerMemory(buf.get(), 4096, Transport::HostMemory), 1);
      buf.reset();  // the registration was a temporary: the allocation is gone
      boot->barrier();
    } else {
      boot->barrier();
      try {
        comm.recvMemory(0).get();
        ADD_FAILURE() << "mapped freed memory";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::RemoteError) << e.what();
        EXPECT_NE(std::string(e.what()).find("of rank 0"), std::string::npos) << e.what();
      }
    }
    boot->barrier();
  });
}

TEST(RegisteredMemory, TenThousandPeerMappingsLeakNothing) {
  UniqueId id = UniqueId::create();
  runRanksOk(2, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 2);
    Communicator comm(boot);
    if (rank == 0) {
      // Owner side: 10,000 register/deregister cycles of fresh allocations (descriptors made and
      // the fd server offered each one), then one that the peer maps 10,000 times.
      auto cycle = [&] {
        auto buf = hostAlloc(5000);
        RegisteredMemory m = comm.registerMemory(buf.get(), 5000, Transport::HostMemory);
        (void)m.serialize();
      };
      cycle();
      std::size_t fds = steadyFdCount(), maps = mappingCount();
      for (int i = 0; i < 10000; ++i) cycle();
      EXPECT_EQ(settledFdCount(fds), fds);
      EXPECT_EQ(mappingCount(), maps);
      auto buf = hostAlloc(3 << 20);
      static_cast<char*>(buf.get())[(3 << 20) - 1] = 42;
      comm.sendMemory(comm.registerMemory(buf.get(), 3 << 20, Transport::HostMemory), 1);
      boot->barrier();  // the peer is done
    } else {
      RegisteredMemory first = comm.recvMemory(0).get();
      ASSERT_NE(first.data(), nullptr);
      std::vector<std::byte> bytes = first.serialize();
      std::size_t imports = liveImportCount();
      // While one mapping lives, deserializing again shares it.
      RegisteredMemory again = RegisteredMemory::deserialize(bytes);
      EXPECT_EQ(again.data(), first.data());
      EXPECT_EQ(liveImportCount(), imports);
      again = RegisteredMemory();
      first = RegisteredMemory();
      EXPECT_EQ(liveImportCount(), imports - 1);
      std::size_t fds = steadyFdCount(), maps = mappingCount();
      for (int i = 0; i < 10000; ++i) {
        RegisteredMemory m = RegisteredMemory::deserialize(bytes);
        ASSERT_EQ(static_cast<char*>(m.data())[(3 << 20) - 1], 42);
        if (i == 0) {
          ASSERT_EQ(mappingCount(), maps + 1);  // the count does see the mapping
        }
      }
      EXPECT_EQ(settledFdCount(fds), fds);
      EXPECT_EQ(mappingCount(), maps);
      EXPECT_EQ(liveImportCount(), imports - 1);
      boot->barrier();
    }
  });
}

}  // namespace
}  // namespace ferry::test
