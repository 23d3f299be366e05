// One data plane: a Connection the collectives were never told about carries them. The test brings
// its own connection class (CountingConnection: copies with cudaMemcpyAsync on a stream of its own
// and counts every byte, signal and flush that passes), hands it to the Comm through
// CommOptions::connect, and runs over it the PortChannel algorithms (allreduce_ce, reducescatter_ce,
// allgather_ce, alltoall_ce) and a plan with port-channel puts (allgather_port), forced by name, on
// 2 and 4 ranks (one process each; ranks share GPUs with GPU_TESTS_SHARE_GPUS). Every output
// element is checked against the host reference, outputs poisoned first, and the counts show that
// the bytes went through the test's connection.
// The same PortChannel algorithms then run over ferry's own Ethernet connections (TCP on loopback,
// device memory staged through host buffers): the kernels are unchanged, only the connection differs.
// The plan comes from tests/unit's compiled plans (FERRY_TEST_PLAN_DIR, set by ctest).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/collective_data.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/connection.hpp"
#include "ferry/errors.hpp"
#include "gpu_ranks.hpp"
#include "gpu_test_process.hpp"
#include "gpu_test_util.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

constexpr unsigned char kPoison = tools::kPoisonByte;

// Read once per process, before the ranks fork: Ethernet connections listen on loopback here.
const bool kEnvironmentSet = [] {
  ::setenv("FERRY_SOCKET_IFNAME", "lo", 0);
  return true;
}();

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(ErrorCode::CudaError, std::string("CountingConnection: ") + what + ": " + cudaGetErrorString(err));
}

// Copies on a stream of its own, in order; a signal lands after every earlier copy (the stream is
// drained first, then the word stored); flushes drain the stream. Slow and simple: what matters is
// that ferry's collectives reach it only through the Connection interface.
class CountingConnection final : public Connection {
 public:
  CountingConnection(int rank, int remoteRank) : Connection(rank, remoteRank, Transport::CudaIpc) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CountingConnection() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  bool readsLocalPointers() const override { return true; }

  std::atomic<std::uint64_t> bytes{0}, writes{0}, signals{0}, flushes{0};

 protected:
  void doWrite(void* dst, const void* src, std::uint64_t n) override {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
    bytes += n;
    ++writes;
  }
  void doUpdateAndSync(std::uint64_t* dst, bool dstInHostMemory, std::uint64_t value) override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (dstInHostMemory)
      __atomic_store_n(dst, value, __ATOMIC_RELEASE);
    else
      check(cudaMemcpy(dst, &value, sizeof value, cudaMemcpyDefault), "cudaMemcpy");
    ++signals;
  }
  void doFlush(std::chrono::duration<double>) override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    ++flushes;
  }
  std::uint64_t doBeginFlush() override {
    doFlush(std::chrono::seconds(0));
    return 0;
  }

 private:
  cudaStream_t stream_ = nullptr;
};

struct Counts {
  std::uint64_t bytes = 0, writes = 0, signals = 0;
};

Counts total(const std::vector<std::shared_ptr<CountingConnection>>& conns) {
  Counts c;
  for (const auto& k : conns) {
    c.bytes += k->bytes;
    c.writes += k->writes;
    c.signals += k->signals;
  }
  return c;
}

// Fills, poisons, runs one call of `s` on registered buffers and counts wrong elements.
std::size_t callWrong(Comm& comm, TcpBootstrap& boot, cudaStream_t stream, const tools::CallShape& s) {
  const std::size_t es = sizeOf(s.type);
  const std::size_t sendBytes = s.sendCount() * es, recvBytes = s.recvCount() * es;
  DeviceBuffer send(comm.device(), sendBytes), recv(comm.device(), recvBytes);
  const BufferRegistration rs = comm.registerBuffer(send.ptr, sendBytes);
  const BufferRegistration rr = comm.registerBuffer(recv.ptr, recvBytes);
  std::vector<char> host(sendBytes), want(recvBytes), got(recvBytes);
  tools::fillSend(s.type, host.data(), s.sendCount(), s.rank, s.seed);
  cudaMemcpy(send.ptr, host.data(), sendBytes, cudaMemcpyHostToDevice);
  cudaMemset(recv.ptr, kPoison, recvBytes);
  cudaDeviceSynchronize();
  boot.barrier();
  switch (s.collective) {
    case Collective::AllReduce: comm.allReduce(send.ptr, recv.ptr, s.count, s.type, s.op, stream); break;
    case Collective::ReduceScatter: comm.reduceScatter(send.ptr, recv.ptr, s.count, s.type, s.op, stream); break;
    case Collective::AllGather: comm.allGather(send.ptr, recv.ptr, s.count, s.type, stream); break;
    case Collective::AllToAll: comm.allToAll(send.ptr, recv.ptr, s.count, s.type, stream); break;
    default: ADD_FAILURE() << "not a collective of this test"; return 1;
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaMemcpy(got.data(), recv.ptr, recvBytes, cudaMemcpyDeviceToHost);
  tools::expectedRecv(s, want.data());
  comm.deregisterBuffer(rs);
  comm.deregisterBuffer(rr);
  return tools::countWrongReordered(s.type, s.op, s.worldSize, got.data(), want.data(), s.recvCount());
}

class ForeignConnection : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam()); !why.empty()) GTEST_SKIP() << why;
    const char* dir = std::getenv("FERRY_TEST_PLAN_DIR");
    if (dir == nullptr) GTEST_SKIP() << "FERRY_TEST_PLAN_DIR is not set (ctest sets it)";
    planFile_ = std::string(dir) + "/allgather_port_" + std::to_string(GetParam()) + ".json";
  }
  std::string planFile_;
};

TEST_P(ForeignConnection, CarriesThePortChannelAlgorithmsAndAPortPlan) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    std::vector<std::shared_ptr<CountingConnection>> conns;
    CommOptions options;
    options.connect = [&](Communicator& c, int peer) {
      EXPECT_EQ(c.bootstrap()->rank(), rank);
      conns.push_back(std::make_shared<CountingConnection>(rank, peer));
      return conns.back();
    };
    Comm comm(boot, options);
    ASSERT_EQ(conns.size(), static_cast<std::size_t>(n - 1));
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

    const std::pair<Collective, const char*> algos[] = {{Collective::AllReduce, "allreduce_ce"},
                                                        {Collective::ReduceScatter, "reducescatter_ce"},
                                                        {Collective::AllGather, "allgather_ce"},
                                                        {Collective::AllToAll, "alltoall_ce"}};
    for (const auto& [coll, algo] : algos) {
      comm.setAlgorithm(coll, algo);
      // Sizes of one round and of several (the reductions go through 1 MiB of scratch in rounds).
      for (std::size_t count : {std::size_t{1001}, (std::size_t{1} << 18) + 7}) {
        for (DataType t : {DataType::Float32, DataType::BFloat16}) {
          const tools::CallShape s{coll, t, ReduceOp::Sum, count, rank, n, 0, 31u + count + static_cast<unsigned>(t)};
          const Counts before = total(conns);
          EXPECT_EQ(callWrong(comm, *boot, stream, s), 0u) << algo << " count " << count;
          const Counts after = total(conns);
          // What this rank sends its peers, at least: (n - 1) blocks of the input, or of the result.
          const std::uint64_t block =
              (coll == Collective::AllReduce ? count / static_cast<std::size_t>(n) : count) * sizeOf(t);
          EXPECT_GE(after.bytes - before.bytes, static_cast<std::uint64_t>(n - 1) * block) << algo;
          EXPECT_GE(after.signals - before.signals, static_cast<std::uint64_t>(n - 1)) << algo;
          if (::testing::Test::HasFailure()) return;
        }
      }
      comm.setAlgorithm(coll, "");
    }

    // A plan whose puts are port-channel puts, through the same connections.
    const Plan plan = Plan::fromFile(planFile_);
    comm.addPlan(plan);
    comm.setAlgorithm(Collective::AllGather, plan.algorithmName());
    for (std::size_t count : {std::size_t{4096}, std::size_t{100003}}) {
      const tools::CallShape s{Collective::AllGather, DataType::Float32, ReduceOp::Sum, count, rank, n, 0, 77u + count};
      const Counts before = total(conns);
      EXPECT_EQ(callWrong(comm, *boot, stream, s), 0u) << plan.algorithmName() << " count " << count;
      const Counts after = total(conns);
      EXPECT_GE(after.bytes - before.bytes, static_cast<std::uint64_t>(n - 1) * count * 4) << plan.algorithmName();
    }
    comm.setAlgorithm(Collective::AllGather, "");
    cudaStreamDestroy(stream);
  });
}

// ferry's Ethernet connection (transport/ethernet_connection.hpp) under the Comm's port channels.
TEST_P(ForeignConnection, EthernetConnectionsCarryThePortChannelAlgorithms) {
  ASSERT_TRUE(kEnvironmentSet);
  const int n = GetParam();
  runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    CommOptions options;
    options.connect = [&](Communicator& c, int peer) {
      auto conn = c.connect(peer, Transport::Ethernet, 11).get();
      EXPECT_EQ(conn->transport(), Transport::Ethernet);
      return conn;
    };
    Comm comm(boot, options);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    const std::pair<Collective, const char*> algos[] = {{Collective::AllReduce, "allreduce_ce"},
                                                        {Collective::AllGather, "allgather_ce"},
                                                        {Collective::AllToAll, "alltoall_ce"}};
    for (const auto& [coll, algo] : algos) {
      comm.setAlgorithm(coll, algo);
      for (std::size_t count : {std::size_t{1001}, (std::size_t{1} << 18) + 7}) {
        const tools::CallShape s{coll, DataType::Float32, ReduceOp::Sum, count, rank, n, 0, 91u + count};
        EXPECT_EQ(callWrong(comm, *boot, stream, s), 0u) << algo << " over Ethernet, count " << count;
        if (::testing::Test::HasFailure()) return;
      }
      comm.setAlgorithm(coll, "");
    }
    cudaStreamDestroy(stream);
  });
}

// A connection that is not between the ranks it was asked for (here: it claims to start at the
// next rank) is refused while the Comm is made, naming what it got.
TEST_P(ForeignConnection, AConnectionToAnotherRankIsRefused) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    CommOptions options;
    options.connect = [&](Communicator&, int peer) { return std::make_shared<CountingConnection>((rank + 1) % n, peer); };
    try {
      Comm comm(boot, options);
      ADD_FAILURE() << "the Comm was made";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("CommOptions::connect"), std::string::npos) << e.what();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ForeignConnection, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
}  // namespace ferry::test
