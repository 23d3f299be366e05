// Multi-process tests of TcpBootstrap on loopback: 2, 4 and 8 ranks, every operation with random
// sizes, split, and the failure paths (a rank that never joins, a root that never starts, a rank
// that stops or exits mid-job).
#include "ferry/bootstrap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "core/bootstrap_env.hpp"
#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using Seconds = std::chrono::duration<double>;

// The byte at `index` of what `rank` contributes in round `round`: every rank can check every
// other rank's data without receiving a reference.
std::byte pattern(int rank, int round, std::size_t index) {
  std::uint64_t x =
      (static_cast<std::uint64_t>(rank) << 40) ^ (static_cast<std::uint64_t>(round) << 32) ^ index;
  x *= 0x9e3779b97f4a7c15ull;
  return static_cast<std::byte>(x >> 56);
}

void fill(std::byte* out, std::size_t n, int rank, int round) {
  for (std::size_t i = 0; i < n; ++i) out[i] = pattern(rank, round, i);
}

// Index of the first wrong byte, or n.
std::size_t firstMismatch(const std::byte* in, std::size_t n, int rank, int round) {
  for (std::size_t i = 0; i < n; ++i)
    if (in[i] != pattern(rank, round, i)) return i;
  return n;
}

// Sizes every rank agrees on (same seed): 0, 1, odd, 16 MiB, and random ones up to 16 MiB.
std::vector<std::size_t> payloadSizes(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::size_t> sizes = {0, 1, 4097, 16u << 20};
  std::uniform_int_distribution<int> log2(0, 24);
  for (int i = 0; i < 4; ++i) {
    std::size_t upper = std::size_t{1} << log2(rng);
    sizes.push_back(std::uniform_int_distribution<std::size_t>(0, upper)(rng));
  }
  std::shuffle(sizes.begin(), sizes.end(), rng);
  return sizes;
}

void exerciseAllOperations(Bootstrap& boot) {
  const int rank = boot.rank();
  const int n = boot.size();
  boot.barrier();
  // allGather with random sizes from 0 to 16 MiB.
  auto sizes = payloadSizes(1234);
  for (int round = 0; round < static_cast<int>(sizes.size()); ++round) {
    std::size_t bytes = sizes[round];
    std::vector<std::byte> all(bytes * n, std::byte{0xAA});
    fill(all.data() + bytes * rank, bytes, rank, round);
    boot.allGather(all.data(), bytes);
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(firstMismatch(all.data() + bytes * r, bytes, r, round), bytes)
          << "allGather round " << round << " (" << bytes << " bytes): slot of rank " << r << " is wrong";
  }
  // send/recv: every ordered pair, random sizes, tags that differ per round, received out of order.
  std::mt19937 rng(99 + rank);
  for (int round = 0; round < 3; ++round) {
    auto sizeFor = [&](int src, int dst) {
      std::mt19937 pairRng(static_cast<std::uint32_t>(src * 1000 + dst * 10 + round));
      return std::uniform_int_distribution<std::size_t>(0, round == 0 ? 64 : (4u << 20))(pairRng);
    };
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      std::vector<std::byte> out(sizeFor(rank, peer));
      fill(out.data(), out.size(), rank, 100 + round);
      boot.send(out.data(), out.size(), peer, round);
    }
    std::vector<int> peers;
    for (int peer = 0; peer < n; ++peer)
      if (peer != rank) peers.push_back(peer);
    std::shuffle(peers.begin(), peers.end(), rng);
    for (int peer : peers) {
      std::size_t bytes = sizeFor(peer, rank);
      if (round == 2) {
        auto in = boot.recv(peer, round);  // the any-size form
        ASSERT_EQ(in.size(), bytes);
        ASSERT_EQ(firstMismatch(in.data(), bytes, peer, 100 + round), bytes) << "from rank " << peer;
      } else {
        std::vector<std::byte> in(bytes);
        boot.recv(in.data(), bytes, peer, round);
        ASSERT_EQ(firstMismatch(in.data(), bytes, peer, 100 + round), bytes) << "from rank " << peer;
      }
    }
  }
  boot.barrier();
}

class BootstrapWorld : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapWorld, AllOperationsWithUniqueId) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, n);
    EXPECT_EQ(boot->rank(), rank);
    EXPECT_EQ(boot->size(), n);
    // One host: every rank shares it.
    EXPECT_EQ(boot->localSize(), n);
    EXPECT_EQ(boot->localRank(), rank);
    EXPECT_EQ(boot->numNodes(), 1);
    EXPECT_TRUE(boot->sameHost((rank + 1) % n));
    exerciseAllOperations(*boot);
  });
}

TEST_P(BootstrapWorld, SplitIntoGroups) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, n);
    // Two groups by parity, ordered by descending rank; the last rank sits out.
    int color = rank == n - 1 && n > 2 ? -1 : rank % 2;
    auto child = boot->split(color, -rank);
    if (color < 0) {
      EXPECT_EQ(child, nullptr);
      boot->barrier();
      return;
    }
    ASSERT_NE(child, nullptr);
    std::vector<int> members;
    for (int r = 0; r < n; ++r)
      if (r % 2 == color && !(r == n - 1 && n > 2)) members.push_back(r);
    std::reverse(members.begin(), members.end());
    ASSERT_EQ(child->size(), static_cast<int>(members.size()));
    int expectRank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    EXPECT_EQ(child->rank(), expectRank);
    // The group works without its parent.
    boot->barrier();
    boot.reset();
    std::vector<int> parentRanks(static_cast<std::size_t>(child->size()));
    parentRanks[child->rank()] = rank;
    child->allGather(parentRanks.data(), sizeof(int));
    EXPECT_EQ(parentRanks, members);
    if (child->size() > 1) exerciseAllOperations(*child);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapWorld, ::testing::Values(2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(Bootstrap, HostPortIPv4AndIPv6) {
  for (std::string host : {"127.0.0.1", "[::1]"}) {
    SCOPED_TRACE(host);
    std::string root = host + ":" + std::to_string(freePort(host[0] == '[' ? AF_INET6 : AF_INET));
    runRanksOk(3, [&](int rank) {
      // Without FERRY_BOOTSTRAP_SECRET, each process warns once that anyone reaching the port can join.
      std::atomic<int> warnings{0};
      log::setSinkForTesting([&](std::string_view line) {
        if (line.find("without FERRY_BOOTSTRAP_SECRET") != std::string_view::npos) ++warnings;
      });
      auto boot = TcpBootstrap::create(root, rank, 3);
      log::setSinkForTesting(nullptr);
      if (std::getenv("FERRY_BOOTSTRAP_SECRET") == nullptr) {
        EXPECT_EQ(warnings.load(), 1);
      }
      EXPECT_EQ(boot->listenAddress().front() == '[', host[0] == '[');
      exerciseAllOperations(*boot);
    });
  }
}

TEST(Bootstrap, FromTorchrunVariables) {
  const int n = 3;
  int masterPort = freePort(AF_INET) - 1;  // fromEnvironment uses MASTER_PORT + 1
  runRanksOk(n, [&](int rank) {
    std::map<std::string, std::string> vars = {{"MASTER_ADDR", "127.0.0.1"},
                                               {"MASTER_PORT", std::to_string(masterPort)},
                                               {"RANK", std::to_string(rank)},
                                               {"WORLD_SIZE", std::to_string(n)},
                                               {"LOCAL_RANK", std::to_string(rank)}};
    Env e = Env::parse([&](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
    auto boot = createFromEnv(e, {});
    EXPECT_EQ(boot->rank(), rank);
    EXPECT_EQ(boot->size(), n);
    boot->barrier();
  });
  Env empty = Env::parse([](const char*) -> const char* { return nullptr; });
  try {
    createFromEnv(empty, {});
    FAIL() << "expected InvalidUsage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
}

// Expects `call` to throw an Error of `code` whose message contains every one of `words`, within
// `bound` seconds.
template <class F>
void expectError(F&& call, ErrorCode code, std::vector<std::string> words, Seconds bound) {
  auto start = std::chrono::steady_clock::now();
  try {
    call();
    ADD_FAILURE() << "expected " << toString(code) << ", but the call succeeded";
  } catch (const Error& e) {
    Seconds took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    EXPECT_LE(took.count(), bound.count()) << e.what();
    std::fprintf(stderr, "(expected) %s\n", e.what());
  }
}

// A timeout too large for the clock ("practically forever") saturates: every wait waits, none
// fails at once with its deadline wrapped into the past (issue: 1e10 s made every wait time out).
TEST(Bootstrap, HugeTimeoutMeansForever) {
  UniqueId id = UniqueId::create();
  TcpBootstrap::Options o;
  o.timeout = Seconds(1e10);
  o.handshakeTimeout = Seconds(1e300);
  runRanksOk(3, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 3, o);
    std::vector<int> all(3, -1);
    all[static_cast<std::size_t>(rank)] = rank * 7;
    boot->allGather(all.data(), sizeof(int));
    for (int r = 0; r < 3; ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], r * 7);
    boot->barrier();
  });
}

TEST(BootstrapFailure, RankThatNeverJoinsIsNamed) {
  UniqueId id = UniqueId::create();
  TcpBootstrap::Options o;
  o.timeout = Seconds(2.0);
  runRanksOk(4,
             [&](int rank) {
               expectError([&] { TcpBootstrap::create(id, rank, 4, o); }, ErrorCode::Timeout,
                           {"rank " + std::to_string(rank), "ranks 3 never joined"},
                           Seconds(2.0 + 1.0 + 1.5));
             },
             {.skip = {3}});
}

TEST(BootstrapFailure, RootThatNeverStartsIsNamed) {
  std::string root = "127.0.0.1:" + std::to_string(freePort(AF_INET));
  TcpBootstrap::Options o;
  o.timeout = Seconds(1.5);
  runRanksOk(3,
             [&](int rank) {
               expectError([&] { TcpBootstrap::create(root, rank, 3, o); }, ErrorCode::Timeout,
                           {"could not reach the root (rank 0)", root}, Seconds(1.5 + 1.5));
             },
             {.skip = {0}});
}

TEST(BootstrapFailure, RankThatStopsCallingIsNamedAtTheBarrier) {
  UniqueId id = UniqueId::create();
  TcpBootstrap::Options o;
  o.timeout = Seconds(2.0);
  runRanksOk(4, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 4, o);
    boot->barrier();
    if (rank == 2) {
      std::this_thread::sleep_for(3500ms);  // alive, but late for the barrier
      return;
    }
    expectError([&] { boot->barrier(); }, ErrorCode::Timeout, {"barrier", "nothing arrived from ranks 2 "},
                Seconds(2.0 + 1.5));
  });
}

TEST(BootstrapFailure, RankThatExitsIsNamedAtOnce) {
  UniqueId id = UniqueId::create();
  TcpBootstrap::Options o;
  o.timeout = Seconds(30.0);
  runRanksOk(4, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 4, o);
    boot->barrier();        // every pair is connected now
    if (rank == 2) return;  // exits: its connections close
    // Well before the 30 s bound: the closed connections fail the operation at once.
    expectError([&] { boot->allGather(nullptr, 0); }, ErrorCode::RemoteError, {"rank 2"}, Seconds(10.0));
    // Stay connected a while: a survivor that exits now could be noticed by a slower survivor
    // before rank 2 is, and be named instead.
    std::this_thread::sleep_for(1s);
  });
}

// A rank that hangs (stopped here) still accepts TCP connections in its kernel, but never answers
// a handshake. A rank that connects to it first must not hold up its part for the other ranks:
// they must name the hung rank only, not the ranks that were connecting to it.
TEST(BootstrapFailure, AHungRankIsNamedAloneAndDoesNotHoldUpTheOthers) {
  UniqueId id = UniqueId::create();
  const std::string pidFile = "/tmp/ferry_hung_rank_" + std::to_string(getpid());
  std::remove(pidFile.c_str());
  TcpBootstrap::Options o;
  o.timeout = Seconds(6.0);
  o.handshakeTimeout = Seconds(1.0);
  runRanksOk(4, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 4, o);
    if (rank == 3) {  // hangs after init, before any pair but (3, 0) is connected
      std::ofstream(pidFile) << getpid();
      ::raise(SIGSTOP);
      return;
    }
    while (!std::ifstream(pidFile)) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(200ms);  // the file is written just before the stop
    int value = rank;
    std::vector<int> all(4, -1);
    all[rank] = value;
    if (rank == 0) {  // its link to rank 3 exists: it waits for everyone until the bound
      expectError([&] { boot->allGather(all.data(), sizeof(int)); }, ErrorCode::Timeout,
                  {"nothing arrived from ranks 3 ("}, Seconds(6.0 + 3.0));
      EXPECT_EQ(all[1], 1);
      EXPECT_EQ(all[2], 2);
      pid_t hung = 0;
      std::ifstream(pidFile) >> hung;
      ::kill(hung, SIGCONT);
    } else {  // ranks 1 and 2 connect to rank 3: bounded by the handshake timeout, then sent on
      expectError([&] { boot->allGather(all.data(), sizeof(int)); }, ErrorCode::Timeout,
                  {"rank 3", "FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT"}, Seconds(1.0 + 3.0));
    }
  });
  std::remove(pidFile.c_str());
}

// When a rank fails and a second one stops after it, a rank waiting on the second still names the
// first: every rank gone by the time it reports.
TEST(BootstrapFailure, ASecondFailureDoesNotHideTheFirst) {
  UniqueId id = UniqueId::create();
  TcpBootstrap::Options o;
  o.timeout = Seconds(20.0);
  runRanksOk(4, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 4, o);
    boot->barrier();  // every pair is connected now
    if (rank == 1) _exit(0);  // fails first: its connections close, nothing is flushed
    if (rank == 2) {          // stops a moment later, because of it
      std::this_thread::sleep_for(200ms);
      _exit(0);
    }
    if (rank == 0) {
      char byte = 0;
      expectError([&] { boot->recv(&byte, 1, 2, 5); }, ErrorCode::RemoteError,
                  {"rank 2 is gone", "also gone: rank 1"}, Seconds(10.0));
    }
    std::this_thread::sleep_for(1s);
  });
}

TEST(BootstrapFailure, BadArguments) {
  UniqueId id = UniqueId::create();
  expectError([&] { TcpBootstrap::create(id, 4, 4); }, ErrorCode::InvalidUsage, {"rank 4", "out of range"},
              Seconds(1));
  expectError([&] { TcpBootstrap::create(id, 0, 0); }, ErrorCode::InvalidUsage, {"world size 0"}, Seconds(1));
  expectError([&] { TcpBootstrap::create("no-port-here", 0, 2); }, ErrorCode::InvalidUsage, {"host:port"},
              Seconds(1));
  UniqueId garbage;
  expectError([&] { TcpBootstrap::create(garbage, 1, 2); }, ErrorCode::InvalidUsage, {"UniqueId"},
              Seconds(1));
  runRanksOk(2, [&](int rank) {
    auto boot = TcpBootstrap::create(id, rank, 2);
    expectError([&] { boot->send("x", 1, rank, 0); }, ErrorCode::InvalidUsage, {"not another rank"},
                Seconds(1));
    expectError([&] { boot->send("x", 1, 7, 0); }, ErrorCode::InvalidUsage, {"peer 7"}, Seconds(1));
    expectError([&] { boot->send(nullptr, 4, 1 - rank, 0); }, ErrorCode::InvalidUsage, {"null"}, Seconds(1));
    // Sizes that do not match are an error on the receiver, not a silent truncation.
    int value = rank;
    boot->send(&value, sizeof(value), 1 - rank, 5);
    char small[2];
    expectError([&] { boot->recv(small, sizeof(small), 1 - rank, 5); }, ErrorCode::InvalidUsage,
                {"expected 2 bytes, got 4"}, Seconds(5));
    std::vector<char> all(2 * (rank + 1));  // ranks disagree on the size
    expectError([&] { boot->allGather(all.data(), rank + 1); }, ErrorCode::InvalidUsage, {"same size"},
                Seconds(5));
  });
}

TEST(Bootstrap, UniqueIdHexRoundTrip) {
  UniqueId id = UniqueId::create();
  UniqueId back = UniqueId::fromHex(id.toHex());
  EXPECT_EQ(id.bytes, back.bytes);
  EXPECT_NE(id.rootAddress().find("127.0.0.1:"), std::string::npos) << id.rootAddress();
  expectError([] { UniqueId::fromHex("zz"); }, ErrorCode::InvalidUsage, {"digits"}, Seconds(1));
}

}  // namespace
}  // namespace ferry::test
