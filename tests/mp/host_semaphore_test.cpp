// Host2HostSemaphore between processes over HostMemory connections: each rank writes into every
// peer's shared buffer through the connection, signals, and the peer's wait makes the data visible;
// many rounds, all pairs at once; and a wait that is never signalled ends in a TimeoutError naming
// both ranks within its bound.
#include <gtest/gtest.h>

#include <cstring>

#include "ferry/bootstrap.hpp"
#include "ferry/communicator.hpp"
#include "ferry/memory.hpp"
#include "ferry/semaphore.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

constexpr std::size_t kSlot = 4096 + 13;

std::uint8_t pattern(int rank, int round, std::size_t i) {
  return static_cast<std::uint8_t>((rank * 131 + round * 31 + i * 7) ^ (i >> 8));
}

struct HostPeers {
  std::shared_ptr<TcpBootstrap> boot;
  std::unique_ptr<Communicator> comm;
  std::shared_ptr<std::uint8_t> send, recv;
  RegisteredMemory sendMem;
  std::vector<int> peers;
  std::vector<std::shared_ptr<Connection>> conns;
  std::vector<RegisteredMemory> theirRecv;
  std::vector<std::shared_ptr<Host2HostSemaphore>> sems;

  HostPeers(const UniqueId& id, int rank, int n) {
    boot = TcpBootstrap::create(id, rank, n);
    comm = std::make_unique<Communicator>(boot);
    send = hostCallocShared<std::uint8_t>(kSlot);
    recv = hostCallocShared<std::uint8_t>(kSlot * n);
    sendMem = comm->registerMemory(send.get(), kSlot, Transport::HostMemory);
    auto recvMem = comm->registerMemory(recv.get(), kSlot * n, Transport::HostMemory);
    std::vector<std::shared_future<std::shared_ptr<Connection>>> c;
    std::vector<std::shared_future<RegisteredMemory>> m;
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      peers.push_back(p);
      c.push_back(comm->connect(p, Transport::HostMemory));
      comm->sendMemory(recvMem, p);
      m.push_back(comm->recvMemory(p));
    }
    for (std::size_t i = 0; i < peers.size(); ++i) {
      conns.push_back(c[i].get());
      theirRecv.push_back(m[i].get());
      sems.push_back(std::make_shared<Host2HostSemaphore>(*comm, conns[i]));
    }
  }
};

TEST(HostSemaphore, AllPairsManyRounds) {
  for (int n : {2, 4}) {
    UniqueId id = UniqueId::create();
    runRanksOk(n, [&](int rank) {
      HostPeers h(id, rank, n);
      for (int round = 1; round <= 200; ++round) {
        std::size_t bytes = 1 + (round * 977) % kSlot;
        for (std::size_t i = 0; i < bytes; ++i) h.send.get()[i] = pattern(rank, round, i);
        for (std::size_t i = 0; i < h.peers.size(); ++i) {
          h.conns[i]->write(h.theirRecv[i], rank * kSlot, h.sendMem, 0, bytes);
          h.sems[i]->signal();
        }
        for (std::size_t i = 0; i < h.peers.size(); ++i) {
          h.sems[i]->wait(std::chrono::seconds(20));
          int p = h.peers[i];
          const std::uint8_t* slot = h.recv.get() + p * kSlot;
          for (std::size_t b = 0; b < bytes; ++b)
            ASSERT_EQ(slot[b], pattern(p, round, b))
                << "round " << round << " from rank " << p << " byte " << b;
        }
        // The send buffer is reused next round only after every peer has read this round's data.
        for (std::size_t i = 0; i < h.peers.size(); ++i) h.sems[i]->signal();
        for (std::size_t i = 0; i < h.peers.size(); ++i) h.sems[i]->wait(std::chrono::seconds(20));
      }
      EXPECT_FALSE(h.sems[0]->poll());
      h.boot->barrier();
    });
  }
}

TEST(HostSemaphore, WaitWithoutSignalTimesOutNamingBothRanks) {
  UniqueId id = UniqueId::create();
  runRanksOk(2, [&](int rank) {
    HostPeers h(id, rank, 2);
    auto start = std::chrono::steady_clock::now();
    try {
      h.sems[0]->wait(std::chrono::milliseconds(300));
      ADD_FAILURE() << "expected TimeoutError";
    } catch (const TimeoutError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("rank " + std::to_string(rank) + ": Host2HostSemaphore::wait for rank " +
                          std::to_string(1 - rank)),
                std::string::npos)
          << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    h.boot->barrier();
  });
}

TEST(HostSemaphore, WrongConnectionKindIsAnError) {
  UniqueId id = UniqueId::create();
  runRanksOk(2, [&](int rank) {
    HostPeers h(id, rank, 2);
    try {
      MemoryDevice2DeviceSemaphore bad(*h.comm, h.conns[0]);
      ADD_FAILURE() << "expected InvalidUsage";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("needs a CudaIpc connection"), std::string::npos) << e.what();
    }
    h.boot->barrier();
  });
}

}  // namespace
}  // namespace ferry::test
