// Algorithms added to a Comm at run time (ferry/algorithm.hpp), on 2 and 4 ranks (one process each,
// sharing GPUs with GPU_TESTS_SHARE_GPUS): a shipped plan and a native algorithm of the test's own,
// written on the public channel API, are added to one Comm, listed, run (forced and chosen by the
// selector) and removed, while a second Comm of the same ranks never sees them. Every output
// element is checked against the host reference, outputs poisoned first.
// The plan comes from tests/unit's compiled plans (FERRY_TEST_PLAN_DIR, set by ctest).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/collective_data.hpp"
#include "unit/expect_contains.hpp"
#include "unit/invalid_usage.hpp"
#include "ferry/algorithm.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "ferry/memory_channel.hpp"
#include "ferry/semaphore.hpp"
#include "gpu_ranks.hpp"
#include "gpu_test_process.hpp"
#include "gpu_test_util.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

constexpr int kMaxPeers = 7;
constexpr std::size_t kCapacity = 1 << 20;  // bytes per rank's slot in every rank's scratch
constexpr unsigned char kPoison = tools::kPoisonByte;

struct OneShotParams {
  MemoryChannelDeviceHandle chan[kMaxPeers];  // to each peer: my staging -> its scratch
  int peers;
  int rank;
  int ranks;
  const float* in;
  float* out;
  const float* scratch;  // ranks slots of kCapacity bytes; slot r holds rank r's input
  std::size_t count;
};

// One block: every rank puts its input into every peer's scratch, then sums all inputs in rank
// order. A second signal round keeps the next call's puts off slots a peer still reads.
__global__ void oneShotSum(OneShotParams p) {
  const std::uint64_t bytes = p.count * sizeof(float);
  for (int i = 0; i < p.peers; ++i)
    p.chan[i].put(static_cast<std::uint64_t>(p.rank) * kCapacity, 0, bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < p.peers) {
    p.chan[threadIdx.x].signal();
    p.chan[threadIdx.x].wait();
  }
  __syncthreads();
  for (std::size_t j = threadIdx.x; j < p.count; j += blockDim.x) {
    float sum = 0;
    for (int r = 0; r < p.ranks; ++r) sum += r == p.rank ? p.in[j] : p.scratch[r * (kCapacity / sizeof(float)) + j];
    p.out[j] = sum;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < p.peers) {
    p.chan[threadIdx.x].signal();
    p.chan[threadIdx.x].wait();
  }
}

// A user's allreduce: float32 sums up to kCapacity bytes, on MemoryChannels it makes itself.
class OneShotSum final : public NativeAlgorithm {
 public:
  std::string name() const override { return "test_one_shot_sum"; }
  Collective collective() const override { return Collective::AllReduce; }
  std::string constraints() const override { return "float32 sums up to 1 MiB"; }
  std::string whyNot(const CollectiveArgs& c) const override {
    if (c.type != DataType::Float32 || c.op != ReduceOp::Sum) return "float32 sums only";
    if (c.bytes > kCapacity) return "more than 1 MiB";
    return {};
  }

  void setup(Comm& comm) override {
    Communicator& c = comm.communicator();
    rank_ = comm.rank();
    ranks_ = comm.worldSize();
    staging_ = gpuCallocShared<float>(kCapacity / sizeof(float));
    scratch_ = gpuCallocShared<float>(kCapacity / sizeof(float) * ranks_);
    const RegisteredMemory mine = c.registerMemory(scratch_.get(), kCapacity * ranks_, Transport::CudaIpc);
    std::vector<int> peers;
    std::vector<std::shared_future<std::shared_ptr<Connection>>> conns;
    std::vector<std::shared_future<RegisteredMemory>> theirs;
    for (int p = 0; p < ranks_; ++p) {
      if (p == rank_) continue;
      peers.push_back(p);
      conns.push_back(c.connect(p, Transport::CudaIpc, 0x100));
      c.sendMemory(mine, p, 0x101);
      theirs.push_back(c.recvMemory(p, 0x101));
    }
    for (std::size_t i = 0; i < peers.size(); ++i) {
      auto sem = std::make_shared<MemoryDevice2DeviceSemaphore>(c, conns[i].get(), 0x102);
      channels_.emplace_back(sem, theirs[i].get(), staging_.get());
      params_.chan[i] = channels_.back().deviceHandle();
    }
    params_.peers = static_cast<int>(peers.size());
    params_.rank = rank_;
    params_.ranks = ranks_;
    params_.scratch = scratch_.get();
    comm.communicator().bootstrap()->barrier();  // every peer's channels exist before any signal
  }

  void launch(const CollectiveArgs& c) override {
    OneShotParams p = params_;
    p.in = static_cast<const float*>(c.send);
    p.out = static_cast<float*>(c.recv);
    p.count = c.count;
    cudaMemcpyAsync(staging_.get(), c.send, c.bytes, cudaMemcpyDeviceToDevice, c.stream);
    oneShotSum<<<1, 512, 0, c.stream>>>(p);
    if (cudaGetLastError() != cudaSuccess) throw Error(ErrorCode::CudaError, "test_one_shot_sum: launch failed");
    ++launches;
  }

  int launches = 0;  // the test runs one call at a time

 private:
  int rank_ = 0, ranks_ = 1;
  std::shared_ptr<float> staging_, scratch_;
  std::vector<MemoryChannel> channels_;
  OneShotParams params_{};
};

// Fills, poisons, runs one out-of-place allReduce of `count` elements on `comm` and counts wrong
// elements (in any order of summation).
std::size_t allReduceWrong(Comm& comm, TcpBootstrap& boot, cudaStream_t stream, DataType type, std::size_t count,
                           std::uint64_t seed) {
  const tools::CallShape s{Collective::AllReduce, type, ReduceOp::Sum, count, comm.rank(), comm.worldSize(), 0, seed};
  const std::size_t bytes = count * sizeOf(type);
  DeviceBuffer send(comm.device(), bytes), recv(comm.device(), bytes);
  std::vector<char> host(bytes), want(bytes), got(bytes);
  tools::fillSend(type, host.data(), count, comm.rank(), seed);
  cudaMemcpy(send.ptr, host.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemset(recv.ptr, kPoison, bytes);
  cudaDeviceSynchronize();
  boot.barrier();
  comm.allReduce(send.ptr, recv.ptr, count, type, ReduceOp::Sum, stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaMemcpy(got.data(), recv.ptr, bytes, cudaMemcpyDeviceToHost);
  tools::expectedRecv(s, want.data());
  return tools::countWrongReordered(type, ReduceOp::Sum, comm.worldSize(), got.data(), want.data(), count);
}

bool lists(const Comm& comm, const std::string& name, AlgorithmKind kind) {
  const auto all = comm.algorithms();
  return std::any_of(all.begin(), all.end(), [&](const AlgorithmInfo& a) { return a.name == name && a.kind == kind; });
}

using ::ferry::testing::invalidUsageOf;

class RuntimeAlgorithms : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam()); !why.empty()) GTEST_SKIP() << why;
    const char* dir = std::getenv("FERRY_TEST_PLAN_DIR");
    if (dir == nullptr) GTEST_SKIP() << "FERRY_TEST_PLAN_DIR is not set (ctest sets it)";
    planFile_ = std::string(dir) + "/allreduce_ring_" + std::to_string(GetParam()) + ".json";
  }
  std::string planFile_;
};

TEST_P(RuntimeAlgorithms, PlanAndNativeAlgorithmOnOneCommOnly) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm a(boot);
    Comm b(boot->split(0, rank));
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    const Plan plan = Plan::fromFile(planFile_);
    const std::string planName = plan.algorithmName();
    auto native = std::make_shared<OneShotSum>();

    a.addPlan(plan);
    a.addAlgorithm(native);
    EXPECT_TRUE(lists(a, planName, AlgorithmKind::Plan));
    EXPECT_TRUE(lists(a, "test_one_shot_sum", AlgorithmKind::Native));
    EXPECT_FALSE(lists(b, planName, AlgorithmKind::Plan));
    EXPECT_FALSE(lists(b, "test_one_shot_sum", AlgorithmKind::Native));

    // Forced, each in turn.
    a.setAlgorithm(Collective::AllReduce, planName);
    EXPECT_EQ(allReduceWrong(a, *boot, stream, DataType::Float32, 100003, 1), 0u) << planName;
    EXPECT_EQ(native->launches, 0);
    a.setAlgorithm(Collective::AllReduce, "test_one_shot_sum");
    EXPECT_EQ(allReduceWrong(a, *boot, stream, DataType::Float32, 100003, 2), 0u) << "test_one_shot_sum";
    EXPECT_EQ(native->launches, 1);
    // Chosen: the newest added algorithm that can run the call, then the older one.
    a.setAlgorithm(Collective::AllReduce, "");
    EXPECT_EQ(a.algorithmFor(Collective::AllReduce, 4096, DataType::Float32), "test_one_shot_sum");
    EXPECT_NE(a.algorithmFor(Collective::AllReduce, 4096, DataType::Int32), "test_one_shot_sum");
    for (int i = 0; i < 3; ++i)  // the second and third come from the selection cache
      EXPECT_EQ(allReduceWrong(a, *boot, stream, DataType::Float32, 1000 + i, 3 + i), 0u);
    EXPECT_EQ(native->launches, 4);
    EXPECT_EQ(allReduceWrong(a, *boot, stream, DataType::Int32, 5000, 7), 0u);
    EXPECT_EQ(native->launches, 4);

    // The other Comm never sees them.
    EXPECT_CONTAINS(invalidUsageOf([&] { b.setAlgorithm(Collective::AllReduce, "test_one_shot_sum"); }),
                    "test_one_shot_sum");
    EXPECT_NE(b.algorithmFor(Collective::AllReduce, 4096, DataType::Float32), "test_one_shot_sum");
    EXPECT_EQ(allReduceWrong(b, *boot, stream, DataType::Float32, 100003, 8), 0u);
    EXPECT_EQ(native->launches, 4);

    // Removed: gone from the listing and the choice; calls run as before.
    a.removeAlgorithm("test_one_shot_sum");
    a.removeAlgorithm(planName);
    EXPECT_FALSE(lists(a, planName, AlgorithmKind::Plan));
    EXPECT_FALSE(lists(a, "test_one_shot_sum", AlgorithmKind::Native));
    EXPECT_CONTAINS(invalidUsageOf([&] { a.setAlgorithm(Collective::AllReduce, planName); }), planName);
    EXPECT_EQ(allReduceWrong(a, *boot, stream, DataType::Float32, 1000, 9), 0u);
    EXPECT_EQ(native->launches, 4);
    cudaStreamDestroy(stream);
  });
}

// A rank that adds another algorithm than its peers gets an error naming what the peer did, and
// so do the peers: no Comm ends up with registries that choose differently.
TEST_P(RuntimeAlgorithms, RanksThatAddDifferentAlgorithmsGetAnError) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm a(boot);
    const std::string message = invalidUsageOf([&] {
      if (rank == 0)
        a.addPlan(Plan::fromFile(planFile_));
      else
        a.addAlgorithm(std::make_shared<OneShotSum>());
    });
    EXPECT_CONTAINS(message, "every rank must add and remove the same algorithms");
    EXPECT_EQ(a.algorithms().size(), Comm::algorithmNames(Collective::AllReduce).size() +
                                         Comm::algorithmNames(Collective::AllGather).size() +
                                         Comm::algorithmNames(Collective::ReduceScatter).size() +
                                         Comm::algorithmNames(Collective::AllToAll).size() +
                                         Comm::algorithmNames(Collective::Broadcast).size() +
                                         Comm::algorithmNames(Collective::Reduce).size());
  });
}

// A native algorithm whose setup fails on one rank is added on none, and every rank hears which.
class FailsOnRankOne final : public NativeAlgorithm {
 public:
  std::string name() const override { return "test_fails_on_rank_one"; }
  Collective collective() const override { return Collective::AllGather; }
  void setup(Comm& comm) override {
    if (comm.rank() == 1) throw Error(ErrorCode::NotSupported, "rank 1 has no room for it");
  }
  void launch(const CollectiveArgs&) override {}
};

TEST_P(RuntimeAlgorithms, SetupThatFailsOnOneRankAddsOnNone) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) {
    Comm a(boot);
    const std::string message = invalidUsageOf([&] { a.addAlgorithm(std::make_shared<FailsOnRankOne>()); });
    EXPECT_CONTAINS(message, "setup failed on rank(s) 1");
    if (rank == 1) EXPECT_CONTAINS(message, "no room for it");
    EXPECT_FALSE(lists(a, "test_fails_on_rank_one", AlgorithmKind::Native));
    // The Comm still works.
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    EXPECT_EQ(allReduceWrong(a, *boot, stream, DataType::Float32, 1000, 1), 0u);
    cudaStreamDestroy(stream);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, RuntimeAlgorithms, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
}  // namespace ferry::test
