// A Comm across hosts (FERRY_MULTI_HOST; comm/comm_across_hosts.cpp) on one machine: each rank gets
// a host identity of its own choosing (FERRY_HOSTID, set before anything in the process reads the
// environment: hence a binary of its own), so ranks of one "host" share CUDA IPC and the "hosts"
// talk over Ethernet on loopback. 2 hosts x 2 ranks and 2 hosts x 1 rank: allReduce of every data
// type x reduce op x placement, at sizes below the ranks of a host, odd, and of many partner rounds,
// every element against the host reference (sums in another order than rank order: floats within
// rounding, integers exact); and every other call refused with an error that says why.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

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

// n ranks on `hosts` hosts (consecutive ranks share one), each on its GPU (shared where allowed).
template <class Body>
void runAcrossHosts(int n, int hosts, Body&& body) {
  const std::string root = "127.0.0.1:" + std::to_string(freePort(AF_INET));
  runRanksOk(n, [&](int rank) {
    const std::string host = "across-hosts-" + std::to_string(rank / (n / hosts));
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

struct Shape {
  int ranks, hosts;
};

class CommAcrossHosts : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam().ranks); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(CommAcrossHosts, AllReduceEveryTypeOpPlacementAndSize) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm comm(boot);
    ASSERT_EQ(comm.rank(), rank);
    ASSERT_EQ(comm.worldSize(), n);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::uint64_t seed = 7;
    std::size_t calls = 0;
    for (int t = 0; t < kDataTypeCount; ++t) {
      for (int o = 0; o < kReduceOpCount; ++o) {
        for (std::size_t count : {std::size_t{1}, std::size_t{4099}, std::size_t{300001}}) {
          for (bool inPlace : {false, true}) {
            const CallShape s{Collective::AllReduce, static_cast<DataType>(t), static_cast<ReduceOp>(o), count, rank,
                              n, 0, ++seed};
            const std::size_t bytes = count * sizeOf(s.type);
            std::vector<unsigned char> input(bytes), got(bytes), want(bytes);
            tools::fillSend(s.type, input.data(), count, rank, s.seed);
            void *send = nullptr, *recv = nullptr;
            ASSERT_EQ(cudaMalloc(&send, bytes), cudaSuccess);
            ASSERT_EQ(cudaMalloc(&recv, bytes), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(inPlace ? recv : send, input.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
            if (!inPlace) {
              ASSERT_EQ(cudaMemset(recv, tools::kPoisonByte, bytes), cudaSuccess);
            }
            comm.allReduce(inPlace ? recv : send, recv, count, s.type, s.op, stream);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(got.data(), recv, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
            tools::expectedRecv(s, want.data());
            EXPECT_EQ(tools::countWrongReordered(s.type, s.op, n, got.data(), want.data(), count), 0u)
                << "rank " << rank << ": " << toString(s.type) << " " << toString(s.op) << " x " << count
                << (inPlace ? " in place" : " out of place");
            cudaFree(send);
            cudaFree(recv);
            ++calls;
            if (anyRankFailed(*boot)) return;
          }
        }
      }
    }
    cudaStreamDestroy(stream);
    if (rank == 0) std::printf("%zu calls checked\n", calls);
  });
}

TEST_P(CommAcrossHosts, EveryOtherCallIsRefusedSayingWhy) {
  const auto [n, hosts] = GetParam();
  runAcrossHosts(n, hosts, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm comm(boot);
    void* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, 4096), cudaSuccess);
    auto refused = [&](const char* what, auto&& call) {
      try {
        call();
        ADD_FAILURE() << what << " ran on a Comm across hosts";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::NotSupported) << e.what();
        const std::string text = e.what();
        EXPECT_NE(text.find("rank " + std::to_string(rank) + ": " + what), std::string::npos) << text;
        EXPECT_NE(text.find("runs allReduce only"), std::string::npos) << text;
      }
    };
    refused("allgather", [&] { comm.allGather(buf, buf, 4, DataType::Float32, nullptr); });
    refused("broadcast", [&] { comm.broadcast(buf, buf, 16, DataType::Float32, 0, nullptr); });
    refused("send", [&] { comm.send(buf, 16, DataType::Float32, (rank + 1) % n, nullptr); });
    cudaFree(buf);
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, CommAcrossHosts, ::testing::Values(Shape{2, 2}, Shape{4, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.hosts) + "hostsOf" +
                                  std::to_string(info.param.ranks / info.param.hosts);
                         });

}  // namespace
}  // namespace ferry::test
