// A stranger on the bootstrap port must not hurt the job: a wrong secret, garbage, a length header
// of 2^62 bytes, a stalled handshake, a join after init and a flood of connections are each
// rejected with a log line, the root's memory does not grow, and the real ranks finish correctly.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "core/bootstrap_wire.hpp"
#include "core/handshake.hpp"
#include "core/host_id.hpp"
#include "core/logger.hpp"
#include "core/socket.hpp"
#include "core/unique_id.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/errors.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using Seconds = std::chrono::duration<double>;

constexpr int kRanks = 4;
constexpr int kFlood = 100;
constexpr int kExpectedRejections = 5 + kFlood;

long maxRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void sendRaw(const SocketAddress& to, std::span<const std::byte> bytes, bool linger = false) {
  Socket s = Socket::connect(to, Clock::now() + 5s);
  s.sendAll(bytes, Clock::now() + 5s);
  if (linger) std::this_thread::sleep_for(200ms);
}

// How many rejected connections a log line stands for: 1 for "rejected a connection ...", plus the
// N of "(and N more rejected before it ...)"; N for "rejected N more connection(s) ..."; else 0.
int rejectionsIn(std::string_view line) {
  const auto numberAfter = [&](std::string_view marker) {
    const auto at = line.find(marker);
    return at == std::string_view::npos ? 0 : std::atoi(std::string(line.substr(at + marker.size())).c_str());
  };
  if (line.find("rejected a connection") != std::string_view::npos) return 1 + numberAfter("(and ");
  if (line.find("more connection(s) since the last such line") != std::string_view::npos) return numberAfter(": rejected ");
  return 0;
}

// A hello from "rank 1" to the root (as a real joining rank would send it).
wire::Hello helloAsRank1(wire::HelloKind kind, const SocketAddress& root) {
  wire::Hello h;
  h.kind = kind;
  h.rank = 1;
  h.worldSize = kRanks;
  h.target = 0;
  h.listen = root;
  return h;
}

void rogue(const UniqueId& id, const std::string& readyFile, const std::string& doneFile) {
  SocketAddress root = decodeUniqueId(id).root;
  const wire::Secret secret = decodeUniqueId(id).secret;
  std::mt19937 rng(7);
  // 1. A well-formed handshake with a wrong secret: the root's challenge does not check out here,
  //    and the proof never comes.
  {
    Socket s = Socket::connect(root, Clock::now() + 5s);
    EXPECT_THROW(handshake::connectHandshake(s, helloAsRank1(wire::HelloKind::Join, root), randomSecret(),
                                             Clock::now() + 5s, "rogue"),
                 Error);
  }
  // 2. Garbage.
  std::vector<std::byte> garbage(4096);
  for (auto& b : garbage) b = static_cast<std::byte>(rng());
  sendRaw(root, garbage, true);
  // 3. A frame header announcing 2^62 bytes, padded to the size of a hello.
  auto header = wire::encodeFrameHeader({wire::FrameKind::User, 0, 1ull << 62});
  std::vector<std::byte> huge(header.begin(), header.end());
  huge.resize(wire::kHelloBytes);
  sendRaw(root, huge, true);
  // 4. Half a hello, then silence: dropped at the handshake bound.
  Socket stalled = Socket::connect(root, Clock::now() + 5s);
  stalled.sendAll(std::span(garbage).first(10), Clock::now() + 5s);
  // 5. A flood of connections that never speak.
  std::vector<Socket> flood;
  for (int i = 0; i < kFlood; ++i) flood.push_back(Socket::connect(root, Clock::now() + 5s));
  // 6. After init: a join with the right secret for a rank that is taken.
  while (!std::ifstream(readyFile)) std::this_thread::sleep_for(20ms);
  {
    Socket s = Socket::connect(root, Clock::now() + 5s);
    handshake::connectHandshake(s, helloAsRank1(wire::HelloKind::Join, root), secret, Clock::now() + 5s, "rogue");
    std::this_thread::sleep_for(200ms);
  }
  // 7. With the secret (a rank gone rogue, say), as rank 1: a header announcing 1 GiB, then
  //    silence. The root must not allocate the gigabyte for bytes that never come (RSS below).
  Socket announcing = Socket::connect(root, Clock::now() + 5s);
  handshake::connectHandshake(announcing, helloAsRank1(wire::HelloKind::Connect, root), secret, Clock::now() + 5s,
                              "rogue");
  announcing.sendAll(wire::encodeFrameHeader({wire::FrameKind::User, 0, 1ull << 30}), Clock::now() + 5s);
  std::this_thread::sleep_for(3s);  // keep the stalled and flooding sockets open past the bound
  // Closing `announcing` mid-message would make the root take rank 1 for gone (it proved the
  // secret): held until the ranks are done.
  while (!std::ifstream(doneFile)) std::this_thread::sleep_for(20ms);
}

TEST(BootstrapSecurity, RogueClientsAreRejectedAndRanksFinish) {
  UniqueId id = UniqueId::create();
  std::string readyFile = "/tmp/ferry_rogue_ready_" + std::to_string(getpid());
  std::string doneFile = "/tmp/ferry_rogue_done_" + std::to_string(getpid());
  std::remove(readyFile.c_str());
  std::remove(doneFile.c_str());
  TcpBootstrap::Options o;
  o.timeout = Seconds(30.0);
  o.handshakeTimeout = Seconds(1.0);
  runRanksOk(kRanks + 1,
             [&](int rank) {
               if (rank == kRanks) return rogue(id, readyFile, doneFile);
               std::atomic<int> rejections{0};
               // Rejections are logged one line a second at most, each line counting those it stands for.
               std::atomic<int> lines{0};
               if (rank == 0)
                 log::setSinkForTesting([&](std::string_view line) {
                   const int stands = rejectionsIn(line);
                   if (stands == 0) return;
                   rejections += stands;
                   if (lines++ < 6) std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
                 });
               long rssBefore = maxRssKiB();
               auto boot = TcpBootstrap::create(id, rank, kRanks, o);
               if (rank == 0) std::ofstream(readyFile) << "ready";
               for (int round = 0; round < 20; ++round) {
                 std::vector<int> all(kRanks, -1);
                 all[rank] = rank * 100 + round;
                 boot->allGather(all.data(), sizeof(int));
                 for (int r = 0; r < kRanks; ++r) ASSERT_EQ(all[r], r * 100 + round);
                 std::this_thread::sleep_for(50ms);
               }
               if (rank == 0) {
                 auto deadline = Clock::now() + 20s;
                 while (rejections < kExpectedRejections && Clock::now() < deadline)
                   std::this_thread::sleep_for(20ms);
                 EXPECT_GE(rejections.load(), kExpectedRejections);
                 EXPECT_LE(lines.load(), 12) << "one line a second at most, however many connections came";
                 // Nothing the rogue sent made the root allocate: the 2^62 header least of all.
                 EXPECT_LT(maxRssKiB() - rssBefore, 64 * 1024)
                     << "root RSS grew by " << (maxRssKiB() - rssBefore) << " KiB";
                 log::setSinkForTesting(nullptr);
               }
               boot->barrier();
               if (rank == 0) std::ofstream(doneFile) << "done";
             },
             {.limit = std::chrono::seconds(90)});
  std::remove(readyFile.c_str());
  std::remove(doneFile.c_str());
}

// 200 connections to the root's port that never speak, held open while a 4-rank job joins: the
// ranks still get in (idle connections are dropped to make room, not the newcomers) and run.
TEST(BootstrapSecurity, IdleConnectionsDoNotKeepRanksOut) {
  UniqueId id = UniqueId::create();
  const SocketAddress root = decodeUniqueId(id).root;
  std::string readyFile = "/tmp/ferry_idle_ready_" + std::to_string(getpid());
  std::string doneFile = "/tmp/ferry_idle_done_" + std::to_string(getpid());
  std::remove(readyFile.c_str());
  std::remove(doneFile.c_str());
  TcpBootstrap::Options o;
  o.timeout = Seconds(30.0);
  o.handshakeTimeout = Seconds(20.0);  // the idle connections outlive the whole join
  runRanksOk(kRanks + 1,
             [&](int rank) {
               if (rank == kRanks) {  // the attacker: connects first, holds everything open
                 std::vector<Socket> idle;
                 for (int tries = 0; idle.empty() && tries < 500; ++tries) {
                   try {
                     idle.push_back(Socket::connect(root, Clock::now() + 1s));
                   } catch (const std::exception&) {
                     std::this_thread::sleep_for(10ms);  // the root is not listening yet
                   }
                 }
                 for (int i = 1; i < 200; ++i) idle.push_back(Socket::connect(root, Clock::now() + 5s));
                 std::ofstream(readyFile) << "ready";
                 while (!std::ifstream(doneFile)) std::this_thread::sleep_for(20ms);
                 return;
               }
               if (rank != 0)
                 while (!std::ifstream(readyFile)) std::this_thread::sleep_for(20ms);
               auto boot = TcpBootstrap::create(id, rank, kRanks, o);
               for (int round = 0; round < 5; ++round) {
                 std::vector<int> all(kRanks, -1);
                 all[rank] = rank + round;
                 boot->allGather(all.data(), sizeof(int));
                 for (int r = 0; r < kRanks; ++r) ASSERT_EQ(all[r], r + round);
               }
               boot->barrier();
               if (rank == 0) std::ofstream(doneFile) << "done";
             },
             {.limit = std::chrono::seconds(60)});
  std::remove(readyFile.c_str());
  std::remove(doneFile.c_str());
}

}  // namespace
}  // namespace ferry::test
