// A Comm across hosts (FERRY_MULTI_HOST; comm/comm_across_hosts.cpp) on one machine: each rank gets
// a host identity of its own choosing (FERRY_HOSTID, set before anything in the process reads the
// environment: hence a binary of its own), so ranks of one "host" share CUDA IPC and the "hosts"
// talk over Ethernet on loopback. 2 hosts x 2 ranks and 2 hosts x 1 rank: every collective of every
// data type x reduce op x placement, at sizes below the ranks of a host, odd, and of many partner
// rounds, every element against the host reference (sums in another order than rank order: floats
// within rounding, integers exact); every collective at 256 MiB; the last host going away mid-run;
// hosts of different sizes and hosts whose ranks interleave; PreMulSum ops; and bad calls refused
// with an error in world ranks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "call_check.hpp"
#include "common/collective_data.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "gpu_ranks.hpp"
#include "gpu_test_process.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

using tools::CallShape;

// n ranks on `hosts` hosts (consecutive ranks share one, as many on each; or rank r on host
// hostOf[r]), each on its GPU (shared where allowed).
// partnerNet: FERRY_PARTNER_NET (nccl: NCCL's socket transport on loopback, the hosts NCCL sees
// being ferry's).
template <class Body>
void runAcrossHosts(int n, int hosts, Body&& body, std::vector<int> hostOf = {},
                    const char* partnerScratch = "device", const char* partnerNet = "ferry") {
  const std::string root = "127.0.0.1:" + std::to_string(freePort(AF_INET));
  runRanksOk(n, [&](int rank) {
    setenv("FERRY_PARTNER_SCRATCH", partnerScratch, 1);
    setenv("FERRY_PARTNER_NET", partnerNet, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    const int h = hostOf.empty() ? rank / (n / hosts) : hostOf[static_cast<std::size_t>(rank)];
    const std::string host = "across-hosts-" + std::to_string(h);
    setenv("FERRY_HOSTID", host.c_str(), 1);
    setenv("FERRY_MULTI_HOST", "1", 1);
    setenv("FERRY_BOOTSTRAP_SECRET", "comm-across-hosts-test", 1);
    setenv("FERRY_SCRATCH_BYTES", "1M", 1);  // partner slots of 256 KiB: large calls take many rounds
    ASSERT_EQ(env().hostId, host) << "the environment was parsed before the fork";
    cudaSetDevice(rankDevice(rank));
    auto boot = TcpBootstrap::create(root, rank, n);
    ASSERT_EQ(boot->numNodes(), hosts);
    body(rank, boot);
  }, RankOptions{.limit = std::chrono::seconds(600)});
}

// One call of shape `s` checked element by element; false once any rank has failed (the others then
// stop too).
bool checkCall(Comm& comm, Bootstrap& boot, cudaStream_t stream, const CallShape& s, bool inPlace) {
  CallBuffers b(rankDevice(s.rank), s, inPlace);
  EXPECT_EQ(fillRunCheck(comm, boot, stream, s, b, inPlace, /*reordered=*/true), 0u)
      << "rank " << s.rank << ": " << toString(s.collective) << " " << toString(s.type) << " " << toString(s.op)
      << " x " << s.count << " root " << s.root << (inPlace ? " in place" : " out of place");
  return !anyRankFailed(boot);
}

// A Comm of `boot` and a stream of its own for body(comm, stream).
template <class Body>
void withComm(const std::shared_ptr<TcpBootstrap>& boot, Body&& body) {
  Comm comm(boot);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  body(comm, stream);
  cudaStreamDestroy(stream);
}

// Every data type x reduce op (where it reduces) x placement x size (below the ranks of a host, odd,
// and of many partner rounds) of `collective`, roots from the seed, each call checked element by
// element; false once any rank has failed (the others then stop too).
bool checkEveryShape(Comm& comm, Bootstrap& boot, cudaStream_t stream, Collective collective, std::uint64_t& seed,
                     std::size_t& calls) {
  const int rank = comm.rank(), n = comm.worldSize();
  const int ops = tools::reduces(collective) ? kReduceOpCount : 1;
  for (int t = 0; t < kDataTypeCount; ++t) {
    for (int o = 0; o < ops; ++o) {
      for (std::size_t count : {std::size_t{1}, std::size_t{4099}, std::size_t{300001}}) {
        for (bool inPlace : {false, true}) {
          ++seed;
          const CallShape s{collective, static_cast<DataType>(t), static_cast<ReduceOp>(o), count, rank, n,
                            static_cast<int>(seed % static_cast<std::uint64_t>(n)), seed};
          ++calls;
          if (!checkCall(comm, boot, stream, s, inPlace)) return false;
        }
      }
    }
  }
  return true;
}

// Every collective x every shape of checkEveryShape, seeds from `seed`; prints how many calls were
// checked on rank 0.
void checkEveryCollective(Comm& comm, Bootstrap& boot, cudaStream_t stream, std::uint64_t seed) {
  std::size_t calls = 0;
  for (int c = 0; c < kCollectiveCount; ++c)
    if (!checkEveryShape(comm, boot, stream, static_cast<Collective>(c), seed, calls)) return;
  if (comm.rank() == 0) std::printf("%zu calls checked\n", calls);
}

struct Shape {
  int ranks, hosts;
};

class CommAcrossHosts : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam().ranks); !why.empty()) GTEST_SKIP() << why;
  }
};

// Every collective x data type x reduce op x placement x size (below the ranks of a host, odd, and
// of many partner rounds), roots on every host, each call checked element by element.
TEST_P(CommAcrossHosts, EveryCollectiveTypeOpPlacementAndSize) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) {
      ASSERT_EQ(comm.rank(), rank);
      ASSERT_EQ(comm.worldSize(), n);
      checkEveryCollective(comm, *boot, stream, 7);
    });
  });
}

// A variable of the ranks' environment for the scope of a test: set in this process before the
// ranks are forked (each parses its environment afresh), removed at the end.
// A call of 1001 floats of `collective` (root 0) that the forced algorithm across hosts cannot run:
// refused with InvalidUsage whose text holds `why`, on every rank, before anything is queued.
void expectRefused(Comm& comm, cudaStream_t stream, Collective collective, const char* why) {
  const int rank = comm.rank(), n = comm.worldSize();
  CallBuffers b(rankDevice(rank), {collective, DataType::Float32, ReduceOp::Sum, 1001, rank, n, 0, 1}, false);
  try {
    if (collective == Collective::AllReduce)
      comm.allReduce(b.send, b.recv, 1001, DataType::Float32, ReduceOp::Sum, stream);
    else if (collective == Collective::ReduceScatter)
      comm.reduceScatter(b.send, b.recv, 1001, DataType::Float32, ReduceOp::Sum, stream);
    else
      comm.reduce(b.send, b.recv, 1001, DataType::Float32, ReduceOp::Sum, 0, stream);
    ADD_FAILURE() << "rank " << rank << ": a forced algorithm that cannot run the call ran it";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

class RanksEnv {
 public:
  RanksEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~RanksEnv() { unsetenv(name_); }
  RanksEnv(const RanksEnv&) = delete;
  RanksEnv& operator=(const RanksEnv&) = delete;

 private:
  const char* name_;
};

// across_hosts_pipelined: allReduce in pieces of 64 KiB (counts of whole parts, of one piece, of
// dozens with a short last one, and of more than the 64 a call is cut into at most) and, forced,
// allGather (its exchange beside the host's first gather), broadcast (in the same pieces, from
// either host), reduceScatter (in pieces of each rank's chunk), allToAll (its exchange beside the
// host's own) and reduce (in pieces of the buffer, to a root on either host); every data type x
// reduce op x placement, element by element. (Hosts of one rank run phases: no test.)
TEST_P(CommAcrossHosts, PipelinedCollectivesEveryTypeOpPlacementAndSize) {
  const auto [n, hosts] = GetParam();
  if (n == hosts) GTEST_SKIP() << "hosts of one rank each run allReduce as phases (nothing to pipeline)";
  const RanksEnv piece("FERRY_ACROSS_HOSTS_PIECE", "64K");
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) {
      ASSERT_EQ(comm.algorithmFor(Collective::AllReduce, 1 << 20, DataType::Float32), "across_hosts_pipelined");
      ASSERT_EQ(comm.algorithmFor(Collective::AllReduce, (1 << 20) + 4, DataType::Float32), "across_hosts");
      std::uint64_t seed = 900;
      std::size_t calls = 0;
      for (int t = 0; t < kDataTypeCount; ++t)
        for (int o = 0; o < kReduceOpCount; ++o)
          for (std::size_t count : {std::size_t{32}, std::size_t{32} * 6151, std::size_t{32} * 20011})
            for (bool inPlace : {false, true}) {
              const CallShape s{Collective::AllReduce, static_cast<DataType>(t), static_cast<ReduceOp>(o), count,
                                rank, n, 0, ++seed};
              ++calls;
              if (!checkCall(comm, *boot, stream, s, inPlace)) return;
            }
      if (rank == 0) std::printf("%zu calls checked\n", calls);
      // Forced as a host's algorithms are: phases, then the pipelined one on a call it cannot run.
      comm.setAlgorithm(Collective::AllReduce, "across_hosts");
      ASSERT_EQ(comm.algorithmFor(Collective::AllReduce, 1 << 20, DataType::Float32), "across_hosts");
      if (!checkCall(comm, *boot, stream,
                     {Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 32 * 6151, rank, n, 0, ++seed}, false))
        return;
      comm.setAlgorithm(Collective::AllReduce, "across_hosts_pipelined");
      expectRefused(comm, stream, Collective::AllReduce, "cannot run this call");
      comm.setAlgorithm(Collective::AllReduce, "");
      ASSERT_EQ(comm.algorithmFor(Collective::AllReduce, 1 << 20, DataType::Float32), "across_hosts_pipelined");
      // allGather and allToAll, forced: the partners' exchange beside the host's own (allToAll's:
      // of its own ranks' chunks).
      for (const Collective collective : {Collective::AllGather, Collective::AllToAll}) {
        comm.setAlgorithm(collective, "across_hosts_pipelined");
        ASSERT_EQ(comm.algorithmFor(collective, 1 << 20, DataType::Float32), "across_hosts_pipelined");
        calls = 0;
        for (int t = 0; t < kDataTypeCount; ++t)
          for (std::size_t count : {std::size_t{1}, std::size_t{4099}, std::size_t{300001}})
            for (bool inPlace : {false, true}) {
              const CallShape s{collective, static_cast<DataType>(t), ReduceOp::Sum, count, rank, n, 0, ++seed};
              ++calls;
              if (!checkCall(comm, *boot, stream, s, inPlace)) return;
            }
        if (rank == 0) std::printf("%zu %s calls checked\n", calls, std::string(toString(collective)).c_str());
        comm.setAlgorithm(collective, "");
      }
      // broadcast, forced, from a rank of each host: the root's host sends the parts of each piece
      // while it broadcasts the next; the others gather each piece's parts as the next arrive.
      comm.setAlgorithm(Collective::Broadcast, "across_hosts_pipelined");
      ASSERT_EQ(comm.algorithmFor(Collective::Broadcast, 1 << 20, DataType::Float32), "across_hosts_pipelined");
      calls = 0;
      for (int t = 0; t < kDataTypeCount; ++t)
        for (std::size_t count : {std::size_t{32}, std::size_t{32} * 6151, std::size_t{32} * 20011})
          for (int root : {0, n - 1})
            for (bool inPlace : {false, true}) {
              const CallShape s{Collective::Broadcast, static_cast<DataType>(t), ReduceOp::Sum, count, rank, n, root,
                                ++seed};
              ++calls;
              if (!checkCall(comm, *boot, stream, s, inPlace)) return;
            }
      if (rank == 0) std::printf("%zu broadcast calls checked\n", calls);
      comm.setAlgorithm(Collective::Broadcast, "");
      // reduceScatter, forced: the host reduces and scatters piece k + 1 of every chunk while the
      // partners sum piece k (about 40 pieces of 64 KiB at the largest count).
      comm.setAlgorithm(Collective::ReduceScatter, "across_hosts_pipelined");
      ASSERT_EQ(comm.algorithmFor(Collective::ReduceScatter, 1 << 20, DataType::Float32), "across_hosts_pipelined");
      calls = 0;
      for (int t = 0; t < kDataTypeCount; ++t)
        for (int o = 0; o < kReduceOpCount; ++o)
          for (std::size_t count : {std::size_t{32}, std::size_t{32} * 6151, std::size_t{32} * 20011})
            for (bool inPlace : {false, true}) {
              const CallShape s{Collective::ReduceScatter, static_cast<DataType>(t), static_cast<ReduceOp>(o), count,
                                rank, n, 0, ++seed};
              ++calls;
              if (!checkCall(comm, *boot, stream, s, inPlace)) return;
            }
      if (rank == 0) std::printf("%zu reduceScatter calls checked\n", calls);
      expectRefused(comm, stream, Collective::ReduceScatter, "pieces of whole 16 bytes");
      comm.setAlgorithm(Collective::ReduceScatter, "");
      // reduce, forced, to a root on the first host and on the last: each host reduces piece k + 1
      // to the rank carrying the root's column while that rank sends its partial sum of piece k to
      // the root.
      comm.setAlgorithm(Collective::Reduce, "across_hosts_pipelined");
      ASSERT_EQ(comm.algorithmFor(Collective::Reduce, 1 << 20, DataType::Float32), "across_hosts_pipelined");
      calls = 0;
      for (int t = 0; t < kDataTypeCount; ++t)
        for (int o = 0; o < kReduceOpCount; ++o)
          for (std::size_t count : {std::size_t{32}, std::size_t{32} * 6151, std::size_t{32} * 20011})
            for (int root : {0, n - 1})
              for (bool inPlace : {false, true}) {
                const CallShape s{Collective::Reduce, static_cast<DataType>(t), static_cast<ReduceOp>(o), count,
                                  rank, n, root, ++seed};
                ++calls;
                if (!checkCall(comm, *boot, stream, s, inPlace)) return;
              }
      if (rank == 0) std::printf("%zu reduce calls checked\n", calls);
      expectRefused(comm, stream, Collective::Reduce, "pieces of whole 16 bytes");
      comm.setAlgorithm(Collective::Reduce, "");
    });
  });
}

// Every collective with its largest buffer at 256 MiB (the partners' slots of 256 KiB: a thousand
// rounds and more), in and out of place, roots on the last host, float sums and bf16 averages.
void checkAt256MiB(Comm& comm, Bootstrap& boot, cudaStream_t stream) {
  const int rank = comm.rank(), n = comm.worldSize();
  std::uint64_t seed = 4242;
  const std::pair<DataType, ReduceOp> kinds[] = {{DataType::Float32, ReduceOp::Sum},
                                                 {DataType::BFloat16, ReduceOp::Avg}};
  for (int c = 0; c < kCollectiveCount; ++c) {
    const auto collective = static_cast<Collective>(c);
    for (auto [type, op] : kinds) {
      const std::size_t largest = (std::size_t{256} << 20) / sizeOf(type);
      const bool perRank = collective == Collective::AllGather || collective == Collective::ReduceScatter ||
                           collective == Collective::AllToAll;
      const std::size_t count = perRank ? largest / static_cast<std::size_t>(n) : largest;
      for (bool inPlace : {false, true}) {
        const CallShape s{collective, type, tools::reduces(collective) ? op : ReduceOp::Sum, count, rank, n, n - 1,
                          ++seed};
        if (!checkCall(comm, boot, stream, s, inPlace)) return;
      }
    }
  }
}

TEST_P(CommAcrossHosts, EveryCollectiveAt256MiB) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) { checkAt256MiB(comm, *boot, stream); });
  });
}

// PreMulSum ops (each rank's input scaled by a factor of its own, then summed): allReduce,
// reduceScatter and reduce, every type, both placements, a size of one partner round and one of
// many, the factor from the host; element by element.
TEST_P(CommAcrossHosts, PreMulSumEveryTypeAndPlacement) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) {
      std::uint64_t seed = 5150;
      for (const Collective collective : {Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce})
        for (int t = 0; t < kDataTypeCount; ++t)
          for (std::size_t count : {std::size_t{4099}, std::size_t{300001}})
            for (bool inPlace : {false, true}) {
              CallShape s{collective, static_cast<DataType>(t), ReduceOp::Sum, count, rank, n,
                          static_cast<int>(seed % static_cast<std::uint64_t>(n)), ++seed};
              s.preMulSum = true;
              if (!checkCall(comm, *boot, stream, s, inPlace)) return;
            }
    });
  });
}

// A bad argument is named in world ranks, before any phase runs.
TEST_P(CommAcrossHosts, BadCallsAreRefusedInWorldRanks) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm comm(boot);
    void* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, 4096), cudaSuccess);
    try {
      comm.send(buf, 16, DataType::Float32, n, nullptr);
      ADD_FAILURE() << "a send to rank " << n << " of " << n << " ranks ran";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(n)), std::string::npos) << e.what();
    }
    try {
      comm.broadcast(buf, buf, 16, DataType::Float32, n, nullptr);
      ADD_FAILURE() << "a broadcast from root " << n << " of " << n << " ranks ran";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("root " + std::to_string(n) + " is out of range"), std::string::npos)
          << e.what();
    }
    cudaFree(buf);
  });
}

// send and recv across hosts (p2p_across_hosts.cpp): in one group, every rank sends to and receives
// from every rank, itself and its host's included, a count of its own each way (a few partner rounds
// through 1 MiB of scratch); then a ring of odd byte counts, one group a step, on a stream of each
// rank's own. Buffers poisoned first, every element checked.
TEST_P(CommAcrossHosts, SendRecvWithEveryPeerOnAndAcrossHosts) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) {
      // Elements from `from` to `to`, and their values: exact in float32.
      const auto countOf = [](int from, int to) { return std::size_t{70001} + 3001 * from + 17 * to; };
      const auto value = [](int from, int to, std::size_t i) {
        return static_cast<float>((from * 131 + to * 7 + static_cast<int>(i % 9973)) % 65536);
      };
      std::vector<void*> sendBufs(n), recvBufs(n);
      for (int p = 0; p < n; ++p) {
        std::vector<float> out(countOf(rank, p));
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = value(rank, p, i);
        ASSERT_EQ(cudaMalloc(&sendBufs[p], out.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(sendBufs[p], out.data(), out.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&recvBufs[p], countOf(p, rank) * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(recvBufs[p], 0xff, countOf(p, rank) * 4), cudaSuccess);  // (NaN)
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      comm.groupStart();
      for (int p = 0; p < n; ++p) {
        comm.send(sendBufs[p], countOf(rank, p), DataType::Float32, p, stream);
        comm.recv(recvBufs[p], countOf(p, rank), DataType::Float32, p, stream);
      }
      comm.groupEnd();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (int p = 0; p < n; ++p) {
        std::vector<float> got(countOf(p, rank));
        ASSERT_EQ(cudaMemcpy(got.data(), recvBufs[p], got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != value(p, rank, i);
        EXPECT_EQ(wrong, 0u) << "rank " << rank << " from rank " << p << " (" << got.size() << " floats)";
        cudaFree(sendBufs[p]);
        cudaFree(recvBufs[p]);
      }
      // A ring, one group a step: odd byte counts, across hosts where the next rank is elsewhere.
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      for (std::size_t bytes : {std::size_t{1}, std::size_t{4099}, std::size_t{300001}}) {
        std::vector<unsigned char> out(bytes), got(bytes);
        for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>((rank * 37 + i * 11) & 0xff);
        void *s = nullptr, *r = nullptr;
        ASSERT_EQ(cudaMalloc(&s, bytes), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&r, bytes), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(s, out.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemset(r, 0xa5, bytes), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        comm.groupStart();
        comm.send(s, bytes, DataType::Uint8, next, stream);
        comm.recv(r, bytes, DataType::Uint8, prev, stream);
        comm.groupEnd();
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got.data(), r, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < bytes; ++i)
          wrong += got[i] != static_cast<unsigned char>((prev * 37 + i * 11) & 0xff);
        EXPECT_EQ(wrong, 0u) << "rank " << rank << ": " << bytes << " bytes from rank " << prev;
        cudaFree(s);
        cudaFree(r);
      }
      // Grouped on one side, two calls on the other (NCCL runs this): the first host's ranks send to
      // and receive from their partner in one group; the partner sends, then receives.
      const int perHost = n / hosts, partner = (rank + perHost) % n;
      const bool first = rank < perHost;
      std::vector<int> out(4099, rank), got(4099, -1);
      void *s = nullptr, *r = nullptr;
      ASSERT_EQ(cudaMalloc(&s, out.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&r, got.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(s, out.data(), out.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(r, 0xff, got.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (first) comm.groupStart();
      comm.send(s, out.size(), DataType::Int32, partner, stream);
      comm.recv(r, got.size(), DataType::Int32, partner, stream);
      if (first) comm.groupEnd();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got.data(), r, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(std::count(got.begin(), got.end(), partner), static_cast<long>(got.size())) << "rank " << rank;
      cudaFree(s);
      cudaFree(r);
    });
  });
}

// The last host goes away (its ranks' processes end) between two calls: on the hosts left, the call
// that finds it gone ends (no trap: the streams stay usable) well within FERRY_DEVICE_TIMEOUT,
// aborted() turns true, and a call then throws Error(RemoteError) naming the partner that went
// away; the Comm is destroyed without hanging.
// The last host's ranks exit between calls; the others' calls end with a RemoteError naming this
// rank and its partner there within 30 s (partnerNet: FERRY_PARTNER_NET).
void checkAHostGoingAway(int n, int hosts, const char* partnerNet) {
  const int perHost = n / hosts;
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm comm(boot);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    const std::size_t count = 1 << 20;
    void* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, count * sizeof(float)), cudaSuccess);
    const bool leaves = rank >= n - perHost;
    const int partner = rank % perHost + (hosts - 1) * perHost;  // this rank's partner on the last host
    constexpr int kCallsBefore = 3;
    std::chrono::steady_clock::time_point gone;
    bool threw = false;
    for (int i = 0; i < 1000 && !threw; ++i) {
      if (i == kCallsBefore) {
        if (leaves) {
          std::fflush(stdout);
          _exit(0);  // as a crash would: no teardown, the sockets close with the process
        }
        gone = std::chrono::steady_clock::now();
      }
      try {
        comm.allReduce(buf, buf, count, DataType::Float32, ReduceOp::Sum, stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "rank " << rank << ", call " << i;
      } catch (const Error& e) {
        ASSERT_GE(i, kCallsBefore) << e.what();
        EXPECT_EQ(e.code(), ErrorCode::RemoteError) << e.what();
        const std::string text = e.what();
        EXPECT_NE(text.find("rank " + std::to_string(rank)), std::string::npos) << text;
        EXPECT_NE(text.find("rank " + std::to_string(partner) + " (host " + std::to_string(hosts - 1) + ")"),
                  std::string::npos)
            << text;
        EXPECT_TRUE(comm.aborted());
        threw = true;
      }
      if (i >= kCallsBefore) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - gone).count();
        ASSERT_LT(s, 30.0) << "rank " << rank << ": no error 30 s after rank " << partner << " went away";
      }
    }
    EXPECT_TRUE(threw) << "rank " << rank;
    cudaFree(buf);
    cudaStreamDestroy(stream);
  }, {}, "device", partnerNet);
}

TEST_P(CommAcrossHosts, AHostThatGoesAwayEndsTheCallsWithAnErrorNamingIt) {
  checkAHostGoingAway(GetParam().ranks, GetParam().hosts, "ferry");
}

// The same on NCCL's network: its watchdog sees NCCL's error and ends the host's calls.
TEST_P(CommAcrossHosts, AHostThatGoesAwayOnNcclNetworkEndsTheCallsWithAnErrorNamingIt) {
  checkAHostGoingAway(GetParam().ranks, GetParam().hosts, "nccl");
}

// Hosts whose calls differ (each host's ranks agree among themselves, so only the partners can see
// it): every rank's calls end with an error naming its partner within 30 s, not a wrong result. The
// last host's ranks ask for one element more in the first call; on NCCL's network allReduce asks
// for another op instead (the same sizes: NCCL's sends and recvs match, the digests do not), and
// broadcast's larger count leaves NCCL's data sends and recvs unmatched until the abort ends them.
void checkDifferentCalls(int n, int hosts, const char* partnerNet) {
  const int perHost = n / hosts;
  const bool nccl = std::string(partnerNet) == "nccl";
  // allReduce: every partner sends and receives. broadcast from rank 0: the first host only sends,
  // and learns of the difference from its partners' acknowledgements (on NCCL's network, from the
  // digests they send back).
  for (const Collective collective : {Collective::AllReduce, Collective::Broadcast}) {
    SCOPED_TRACE(toString(collective));
    runAcrossHosts(
        n, hosts,
        [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
          withComm(boot, [&](Comm& comm, cudaStream_t stream) {
            const std::size_t count = 1000;
            void* buf = nullptr;
            ASSERT_EQ(cudaMalloc(&buf, (count + 1) * sizeof(float)), cudaSuccess);
            const bool lastHost = rank >= n - perHost;
            const int partner = (rank + perHost) % n;  // (2 hosts)
            const auto start = std::chrono::steady_clock::now();
            bool threw = false;
            for (int i = 0; i < 1000 && !threw; ++i) {
              try {
                const bool differ = i == 0 && lastHost;
                const bool otherOp = nccl && collective == Collective::AllReduce;
                const std::size_t c = differ && !otherOp ? count + 1 : count;
                const ReduceOp op = differ && otherOp ? ReduceOp::Max : ReduceOp::Sum;
                if (collective == Collective::AllReduce)
                  comm.allReduce(buf, buf, c, DataType::Float32, op, stream);
                else
                  comm.broadcast(buf, buf, c, DataType::Float32, 0, stream);
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "rank " << rank << ", call " << i;
              } catch (const Error& e) {
                // (The call that differed is queued before its partners compare: the next one throws.)
                ASSERT_GE(i, 1) << e.what();
                EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
                const std::string text = e.what();
                EXPECT_NE(text.find("rank " + std::to_string(rank)), std::string::npos) << text;
                EXPECT_NE(text.find("rank " + std::to_string(partner) + " (host"), std::string::npos) << text;
                EXPECT_NE(text.find("another call"), std::string::npos) << text;
                threw = true;
              }
              const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              ASSERT_LT(s, 30.0) << "rank " << rank << ": no error 30 s after the calls differed";
            }
            EXPECT_TRUE(threw) << "rank " << rank;
            cudaFree(buf);
          });
        },
        {}, "device", partnerNet);
  }
}

TEST_P(CommAcrossHosts, HostsThatMakeDifferentCallsGetAnErrorNotAWrongResult) {
  checkDifferentCalls(GetParam().ranks, GetParam().hosts, "ferry");
}

TEST_P(CommAcrossHosts, HostsThatMakeDifferentCallsOnNcclNetworkGetAnErrorNotAWrongResult) {
  checkDifferentCalls(GetParam().ranks, GetParam().hosts, "nccl");
}

// Every collective, a few types and ops, both placements, sizes of one and of many rounds, roots
// from the seed, each call checked element by element.
void checkFewShapes(Comm& comm, Bootstrap& boot, cudaStream_t stream) {
  const int rank = comm.rank(), n = comm.worldSize();
  std::uint64_t seed = 777;
  const std::pair<DataType, ReduceOp> kinds[] = {
      {DataType::Float32, ReduceOp::Sum}, {DataType::BFloat16, ReduceOp::Avg}, {DataType::Int32, ReduceOp::Max}};
  for (int c = 0; c < kCollectiveCount; ++c) {
    const auto collective = static_cast<Collective>(c);
    for (auto [type, op] : kinds) {
      for (std::size_t count : {std::size_t{1}, std::size_t{4099}, std::size_t{300001}}) {
        for (bool inPlace : {false, true}) {
          ++seed;
          const CallShape s{collective, type, tools::reduces(collective) ? op : ReduceOp::Sum, count, rank, n,
                            static_cast<int>(seed % static_cast<std::uint64_t>(n)), seed};
          if (!checkCall(comm, boot, stream, s, inPlace)) return;
        }
      }
    }
  }
}

// The partners' parts received in host memory the GPU maps (FERRY_PARTNER_SCRATCH=host).
TEST_P(CommAcrossHosts, EveryCollectiveWithScratchInHostMemory) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(
      n, hosts,
      [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
        ASSERT_EQ(env().partnerScratch, "host");
        withComm(boot, [&](Comm& comm, cudaStream_t stream) { checkFewShapes(comm, *boot, stream); });
      },
      {}, "host");
}

// The cross-host phase on NCCL's network (FERRY_PARTNER_NET=nccl): NCCL's sockets on loopback.
TEST_P(CommAcrossHosts, EveryCollectiveOnNcclNetwork) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(
      n, hosts,
      [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
        withComm(boot, [&](Comm& comm, cudaStream_t stream) {
          ASSERT_EQ(comm.algorithmFor(Collective::AllReduce, 4096, DataType::Float32),
                    n > hosts ? "across_hosts_pipelined_nccl" : "across_hosts_nccl");
          checkFewShapes(comm, *boot, stream);
        });
      },
      {}, "device", "nccl");
}

// Both networks by size (FERRY_PARTNER_NET=sized): parts of up to 8 KiB on NCCL's sockets, larger
// ones on ferry's connections, so that the shapes below take both (one element, 4099 floats, and
// 300,001 elements in slot rounds), in turn on one stream.
TEST_P(CommAcrossHosts, EveryCollectiveOnBothNetworksBySize) {
  const auto [n, hosts] = GetParam();
  setenv("FERRY_PARTNER_NCCL_BYTES", "8K", 1);  // (inherited by the ranks, which parse it)
  runAcrossHosts(
      n, hosts,
      [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
        ASSERT_EQ(env().partnerNcclBytes, 8u << 10);
        withComm(boot, [&](Comm& comm, cudaStream_t stream) {
          ASSERT_EQ(comm.algorithmFor(Collective::AllReduce, 4096, DataType::Float32),
                    n > hosts ? "across_hosts_pipelined_sized" : "across_hosts_sized");
          checkFewShapes(comm, *boot, stream);
        });
      },
      {}, "device", "sized");
  unsetenv("FERRY_PARTNER_NCCL_BYTES");
}

// Other layouts: hosts of different sizes (3 + 1 and 1 + 3 ranks: a rank of the smaller host carries
// several columns) and hosts whose ranks are not consecutive world ranks (0 and 2 on one, 1 and 3 on
// the other): every collective x data type x reduce op x placement x size from every root, element
// by element.
class CommAcrossOtherLayouts : public ::testing::TestWithParam<std::vector<int>> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(static_cast<int>(GetParam().size())); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(CommAcrossOtherLayouts, EveryCollectiveTypeOpPlacementAndSize) {
  const std::vector<int> hostOf = GetParam();
  const int n = static_cast<int>(hostOf.size());
  runAcrossHosts(n, 2, [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) { checkEveryCollective(comm, *boot, stream, 313); });
  }, hostOf);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CommAcrossOtherLayouts,
                         ::testing::Values(std::vector<int>{0, 0, 0, 1}, std::vector<int>{0, 1, 1, 1},
                                           std::vector<int>{0, 1, 0, 1}),
                         [](const auto& info) {
                           const std::vector<int>& h = info.param;
                           return h[1] == 0 ? std::string("3and1") : h[2] == 1 ? std::string("1and3")
                                                                               : std::string("interleaved");
                         });

// 3 + 1 ranks with the cross-host phase on NCCL's network: the lone rank's three NCCL communicators.
TEST(CommAcrossUnevenHosts, EveryCollectiveOnNcclNetwork) {
  if (std::string why = whyCannotRun(4); !why.empty()) GTEST_SKIP() << why;
  runAcrossHosts(
      4, 2,
      [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
        withComm(boot, [&](Comm& comm, cudaStream_t stream) { checkFewShapes(comm, *boot, stream); });
      },
      /*hostOf=*/{0, 0, 0, 1}, "device", "nccl");
}

// 3 + 1 ranks at 256 MiB: the lone rank's columns in many partner rounds each.
TEST(CommAcrossUnevenHosts, EveryCollectiveAt256MiB) {
  if (std::string why = whyCannotRun(4); !why.empty()) GTEST_SKIP() << why;
  runAcrossHosts(4, 2, [&](int, const std::shared_ptr<TcpBootstrap>& boot) {
    withComm(boot, [&](Comm& comm, cudaStream_t stream) { checkAt256MiB(comm, *boot, stream); });
  }, /*hostOf=*/{0, 0, 0, 1});
}

INSTANTIATE_TEST_SUITE_P(Shapes, CommAcrossHosts, ::testing::Values(Shape{2, 2}, Shape{4, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.hosts) + "hostsOf" +
                                  std::to_string(info.param.ranks / info.param.hosts);
                         });

}  // namespace
}  // namespace ferry::test
