// The collectives across processes, one per GPU (or sharing one: GPU_TESTS_SHARE_GPUS), on 2 and 4
// GPUs: every algorithm x data type x reduce op x in-place and out-of-place, at counts that hit
// vector tails and several scratch rounds, checked element by element against the host reference
// (tools/common/collective_data.hpp) with the output poisoned first. Then: 1,000 back-to-back calls of changing size, CUDA graph capture and
// replay, two Comms used at once on different streams, and a rank that never joins a call.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "common/collective_data.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/errors.hpp"
#include "gpu_test_process.hpp"
#include "call_check.hpp"
#include "gpu_test_util.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

using tools::CallShape;

constexpr unsigned char kPoison = tools::kPoisonByte;

// ferry reads its environment once per process, at first use (which can come before main, in
// the parent that forks the ranks): set what this binary needs during static initialization.
// Small buffers on purpose, so that modest counts need several rounds and the LL limit is reached;
// a short device timeout, so the missing-rank test ends soon.
const bool kEnvironmentSet = [] {
  ::setenv("FERRY_SCRATCH_BYTES", "1M", 1);
  ::setenv("FERRY_LL_BYTES", "64K", 1);
  ::setenv("FERRY_DEVICE_TIMEOUT", "10", 1);
  return true;
}();

// GPU_TESTS_ALGORITHMS=REGEX: the tests that go through every algorithm take only the matching ones
// (a focused run, e.g. '_p2p$'); unset, all of them.
bool algorithmChosen(const std::string& algo) {
  static const char* pattern = std::getenv("GPU_TESTS_ALGORITHMS");
  static const std::regex chosen(pattern ? pattern : "");
  return pattern == nullptr || std::regex_search(algo, chosen);
}

struct Rank {
  int rank, size, device;
  std::shared_ptr<TcpBootstrap> boot;
  std::unique_ptr<Comm> comm;
  cudaStream_t stream = nullptr;
  DeviceBuffer factors;  // this rank's PreMulSum factor of type t at factors + 8 * t
  Rank(const UniqueId& id, int r, int n, const CommOptions& options = {})
      : rank(r), size(n), device(rankDevice(r)), factors(device, 8 * kDataTypeCount) {
    cudaSetDevice(device);
    boot = TcpBootstrap::create(id, r, n);
    comm = std::make_unique<Comm>(boot, options);
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    std::uint64_t bits[kDataTypeCount];
    for (int t = 0; t < kDataTypeCount; ++t) bits[t] = tools::preMulFactorBits(static_cast<DataType>(t), r);
    cudaMemcpy(factors.ptr, bits, sizeof bits, cudaMemcpyHostToDevice);
  }
  ~Rank() { cudaStreamDestroy(stream); }
};

struct CheckOptions {
  bool reordered = false;       // the algorithm reduces in another order than rank order
  bool registered = false;      // register the buffers (every rank) for the call
  bool factorOnDevice = false;  // a PreMulSum shape's factor is read from device memory
};

// Whether the Comm's algorithm `algo` reduces in another order than rank order (a ring, a plan):
// its floats are then checked with a tolerance (AlgorithmInfo::reducesInRankOrder).
bool reorders(const Comm& comm, const std::string& algo) {
  for (const AlgorithmInfo& a : comm.algorithms())
    if (a.name == algo) return !a.reducesInRankOrder;
  return true;
}

// Fills, poisons, runs one call and checks it; returns the number of wrong elements.
std::size_t runAndCheck(Rank& r, const CallShape& s, bool inPlace, CheckOptions options = {}) {
  CallBuffers b(r.device, s, inPlace);
  // Deregistered however the call ends (a forced algorithm that cannot run it throws).
  struct Registrations {
    Comm& comm;
    std::vector<BufferRegistration> all;
    ~Registrations() {
      for (const auto& reg : all) comm.deregisterBuffer(reg);
    }
  } registrations{*r.comm, {}};
  if (options.registered) {
    registrations.all.push_back(r.comm->registerBuffer(b.recvBuf.ptr, b.recvBuf.bytes));
    if (!inPlace) registrations.all.push_back(r.comm->registerBuffer(b.sendBuf.ptr, b.sendBuf.bytes));
  }
  return fillRunCheck(*r.comm, *r.boot, r.stream, s, b, inPlace, options.reordered,
                      options.factorOnDevice ? r.factors.ptr : nullptr);
}

std::string label(const CallShape& s, const std::string& algo, bool inPlace) {
  return std::string(toString(s.collective)) + "/" + algo + " " + std::string(toString(s.type)) + " " +
         std::string(toString(s.op)) + " count " + std::to_string(s.count) + (inPlace ? " in-place" : " out-of-place") +
         " root " + std::to_string(s.root) + " rank " + std::to_string(s.rank);
}

// Captures the calls `shapes` (out of place, on `bufs`) in one CUDA graph (beforeIssue(k), if
// given, runs before call k is issued), then replays it `replays` times, each on new random inputs
// and poisoned outputs, and checks every output element after each replay.
// reordered: the algorithms may reduce in another order than rank order.
template <std::size_t N>
void captureReplayAndCheck(Rank& r, const CallShape (&shapes)[N], const std::vector<std::unique_ptr<CallBuffers>>& bufs,
                           int replays, bool reordered, const std::function<void(std::size_t)>& beforeIssue = {}) {
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (std::size_t k = 0; k < N; ++k) {
    if (beforeIssue) beforeIssue(k);
    issue(*r.comm, shapes[k], bufs[k]->send, bufs[k]->recv, r.stream, r.factors.ptr);
  }
  ASSERT_EQ(cudaStreamEndCapture(r.stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (std::uint64_t replay = 1; replay <= static_cast<std::uint64_t>(replays); ++replay) {
    std::vector<std::vector<char>> wants;
    for (std::size_t k = 0; k < N; ++k) {
      CallShape s = shapes[k];
      s.seed = replay * 10 + k;
      const std::size_t es = sizeOf(s.type);
      std::vector<char> send(s.sendCount() * es);
      tools::fillSend(s.type, send.data(), s.sendCount(), r.rank, s.seed);
      cudaMemcpy(bufs[k]->send, send.data(), send.size(), cudaMemcpyHostToDevice);
      cudaMemset(bufs[k]->recv, kPoison, s.recvCount() * es);
      wants.emplace_back(s.recvCount() * es);
      tools::expectedRecv(s, wants.back().data());
    }
    cudaDeviceSynchronize();
    r.boot->barrier();
    ASSERT_EQ(cudaGraphLaunch(exec, r.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
    for (std::size_t k = 0; k < N; ++k) {
      const CallShape& s = shapes[k];
      std::vector<char> got(wants[k].size());
      cudaMemcpy(got.data(), bufs[k]->recv, got.size(), cudaMemcpyDeviceToHost);
      const std::size_t wrong =
          reordered ? tools::countWrongReordered(s.type, s.op, r.size, got.data(), wants[k].data(), s.recvCount())
                    : tools::countWrong(s.type, got.data(), wants[k].data(), s.recvCount());
      EXPECT_EQ(wrong, 0u) << toString(s.collective) << " call " << k << " replay " << replay;
    }
    r.boot->barrier();  // the next replay's inputs are written after everyone has checked
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

class GpuCollectives : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

// Every algorithm, type, op and placement, forced one at a time.
TEST_P(GpuCollectives, EveryAlgorithmTypeOpAndPlacement) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    std::size_t calls = 0, skipped = 0;
    for (int c = 0; c < kCollectiveCount; ++c) {
      const auto coll = static_cast<Collective>(c);
      for (const std::string& algo : Comm::algorithmNames(coll)) {
        if (algo.starts_with("plan:") || !algorithmChosen(algo)) continue;  // plans: EveryPlan's
        // The zero-copy and copy-engine algorithms run on buffers registered for the call (on every rank).
        const bool direct = algo.ends_with("_direct") || algo.ends_with("_ce");
        r.comm->setAlgorithm(coll, algo);
        const std::size_t callsBefore = calls;
        for (int t = 0; t < kDataTypeCount; ++t) {
          for (int o = 0; o < (tools::reduces(coll) ? kReduceOpCount : 1); ++o) {
            for (std::size_t count : {1ul, 3ul, 1023ul, 4099ul, 70001ul}) {
              for (bool inPlace : {false, true}) {
                CallShape s{coll, static_cast<DataType>(t), static_cast<ReduceOp>(o), count, rank, n,
                            static_cast<int>((count + t) % n), 1000u + calls};
                try {
                  const std::size_t wrong =
                      runAndCheck(r, s, inPlace, {.reordered = reorders(*r.comm, algo), .registered = direct});
                  EXPECT_EQ(wrong, 0u) << label(s, algo, inPlace);
                  ++calls;
                } catch (const Error& e) {
                  // Too large for this algorithm's buffers: the forced algorithm must say so.
                  EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
                  EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
                  ++skipped;
                }
                if (::testing::Test::HasFailure()) return;
              }
            }
          }
        }
        // An algorithm that refused every call would otherwise pass unseen.
        EXPECT_GT(calls, callsBefore) << algo << " ran none of the calls";
      }
      r.comm->setAlgorithm(coll, "");
    }
    if (rank == 0) std::printf("checked %zu calls, %zu too large for the forced algorithm\n", calls, skipped);
    EXPECT_GT(skipped, 0u) << "FERRY_LL_BYTES did not take: the LL size limit was never reached";
  }, {std::chrono::seconds(900)});
}

// Calls of many rounds (9 to 19 here, by algorithm) and a short last one, back to back, through
// every algorithm that runs in rounds through the scratch slots. Their blocks drift apart by
// rounds; the short round must not move a block into slot bytes that another block of a peer still
// reads (ranges.hpp's roundPart: on two GPUs it once did, and a few hundred elements came out wrong).
TEST_P(GpuCollectives, ManyRoundsEndingShort) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    std::size_t calls = 0;
    for (int c = 0; c < kCollectiveCount; ++c) {
      const auto coll = static_cast<Collective>(c);
      for (const std::string& algo : Comm::algorithmNames(coll)) {
        // (The _p2p ones run on the send/recv inboxes, not in scratch rounds.)
        const bool rounds = !algo.starts_with("plan:") && !algo.ends_with("_ll") &&
                            !algo.ends_with("_direct") && !algo.ends_with("_ce") && !algo.ends_with("_p2p");
        if (!rounds || !algorithmChosen(algo)) continue;
        r.comm->setAlgorithm(coll, algo);
        for (DataType t : {DataType::Int32, DataType::BFloat16}) {
          for (int repeat = 0; repeat < 6; ++repeat) {
            // 1 MiB of scratch (kEnvironmentSet): about 4.9 MB per rank is many rounds.
            const std::size_t count =
                4'900'000 / sizeOf(t) / (coll == Collective::AllGather ? n : 1) + 7 * repeat;
            CallShape s{coll, t, ReduceOp::Sum, count, rank, n, repeat % n, 5000u + calls};
            const std::size_t wrong =
                runAndCheck(r, s, repeat % 2 == 1, {.reordered = reorders(*r.comm, algo)});
            EXPECT_EQ(wrong, 0u) << label(s, algo, repeat % 2 == 1);
            ++calls;
            if (::testing::Test::HasFailure()) return;
          }
        }
      }
      r.comm->setAlgorithm(coll, "");
    }
    if (rank == 0) std::printf("many rounds: %zu calls checked\n", calls);
  });
}

// Accumulation::Float32 (allReduce, reduceScatter, reduce): every algorithm that says it runs it
// (AlgorithmInfo::sumsInFloat32), forced, and the selector's choice, on the 16- and 8-bit floats
// with sum and avg, counts past the LL limit and through several scratch rounds, in and out of
// place, registered where the algorithm needs it; every output element bit for bit against the
// float32 reference. The other algorithms must refuse such a call, naming the accumulation; and a
// float32 call of float32 data is any algorithm's. On 3 or more ranks the stepwise reference must
// differ from the float32 one somewhere, or the check could not tell the two apart.
TEST_P(GpuCollectives, ReductionsSumInFloat32) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    std::size_t calls = 0, skipped = 0, refused = 0, differing = 0;
    bool stepwiseTried = false;  // an algorithm that must refuse was among those run
    for (Collective coll : {Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce}) {
      std::vector<std::string> algos{""};  // "": the selector's choice
      for (const AlgorithmInfo& a : r.comm->algorithms())
        if (a.collective == coll && !a.name.starts_with("plan:")) algos.push_back(a.name);
      for (const std::string& algo : algos) {
        if (!algo.empty() && !algorithmChosen(algo)) continue;
        bool wide = algo.empty();
        for (const AlgorithmInfo& a : r.comm->algorithms()) wide = wide || (a.name == algo && a.sumsInFloat32);
        stepwiseTried = stepwiseTried || !wide;
        const bool direct = algo.ends_with("_direct") || algo.ends_with("_ce");
        const std::string name = algo.empty() ? std::string(toString(coll)) + " (chosen)" : algo;
        r.comm->setAlgorithm(coll, algo);
        for (DataType t : {DataType::BFloat16, DataType::Float16, DataType::Fp8E4M3, DataType::Fp8E5M2}) {
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
            for (std::size_t count : {1ul, 1023ul, 70001ul, 600'003ul}) {
              for (bool inPlace : {false, true}) {
                const int root = static_cast<int>((count + calls) % n);
                CallShape s{coll, t, op, count, rank, n, root, 7000u + calls + refused};
                s.accumulation = Accumulation::Float32;
                try {
                  const std::size_t wrong = runAndCheck(r, s, inPlace, {.registered = direct});
                  EXPECT_TRUE(wide) << name << " ran a call that asks for float32 accumulation";
                  EXPECT_EQ(wrong, 0u) << label(s, name, inPlace) << " float32 accumulation";
                  ++calls;
                } catch (const Error& e) {
                  const std::string what = e.what();
                  EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << what;
                  if (wide) {  // too large for this algorithm's buffers, as in EveryAlgorithmTypeOpAndPlacement
                    EXPECT_NE(what.find("cannot run this call"), std::string::npos) << what;
                    ++skipped;
                  } else {
                    EXPECT_NE(what.find("float32 accumulation"), std::string::npos) << what;
                    ++refused;
                  }
                }
                if (wide && rank == s.root && inPlace) {  // the two references, once per shape
                  std::vector<char> a(s.recvCount() * sizeOf(t)), b(a.size());
                  tools::expectedRecv(s, a.data());
                  CallShape stepwise = s;
                  stepwise.accumulation = Accumulation::Stepwise;
                  tools::expectedRecv(stepwise, b.data());
                  differing += tools::countWrong(t, a.data(), b.data(), s.recvCount());
                }
                if (::testing::Test::HasFailure()) return;
              }
            }
          }
        }
        // Float32 data: the accumulation changes nothing, so every algorithm runs it.
        CallShape s{coll, DataType::Float32, ReduceOp::Sum, 4099, rank, n, 1 % n, 7999u};
        s.accumulation = Accumulation::Float32;
        try {
          EXPECT_EQ(runAndCheck(r, s, false, {.reordered = reorders(*r.comm, algo), .registered = direct}), 0u)
              << label(s, name, false);
        } catch (const Error& e) {
          ADD_FAILURE() << name << " refused float32 data with float32 accumulation: " << e.what();
        }
        if (::testing::Test::HasFailure()) return;
      }
      r.comm->setAlgorithm(coll, "");
    }
    std::printf("rank %d, float32 accumulation: %zu calls checked, %zu too large, %zu refused; %zu elements "
                "differ from stepwise\n",
                rank, calls, skipped, refused, differing);
    EXPECT_GT(calls, 0u);
    if (stepwiseTried) {
      EXPECT_GT(refused, 0u) << "no algorithm refused float32 accumulation (a ring cannot run it)";
    }
    if (n >= 3) {
      // (Summed over every rank's shapes: a reduce's root changes from call to call.)
      std::vector<std::size_t> each(static_cast<std::size_t>(n));
      each[static_cast<std::size_t>(rank)] = differing;
      r.boot->allGather(each.data(), sizeof(std::size_t));
      std::size_t all = 0;
      for (std::size_t d : each) all += d;
      EXPECT_GT(all, 0u) << "the float32 and stepwise references never differ";
    }
  }, {std::chrono::seconds(900)});
}

// Every loaded plan (FERRY_PLAN_DIR: the gpu_collectives_plans test points it at the shipped
// programs, compiled for 2 and 4 ranks), forced one at a time: every type, op and placement a plan
// takes, on registered buffers and on unregistered ones (which plans that reach into the peers'
// buffers run on the Comm's staging buffer), alternating; the placement and sizes it does not take
// must be refused.
TEST_P(GpuCollectives, EveryPlanTypeOpAndPlacement) {
  const int n = GetParam();
  if (std::getenv("FERRY_PLAN_DIR") == nullptr) GTEST_SKIP() << "FERRY_PLAN_DIR is not set: no plans to run";
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    int plans = 0;
    for (int c = 0; c < kCollectiveCount; ++c) {
      const auto coll = static_cast<Collective>(c);
      for (const std::string& algo : Comm::algorithmNames(coll)) {
        if (!algo.starts_with("plan:")) continue;
        ++plans;
        r.comm->setAlgorithm(coll, algo);
        std::size_t calls = 0, refused = 0;
        for (int t = 0; t < kDataTypeCount; ++t) {
          for (int o = 0; o < (tools::reduces(coll) ? kReduceOpCount : 1); ++o) {
            const std::size_t counts[] = {1, 3, 1023, 4099, 70001};
            for (std::size_t k = 0; k < std::size(counts); ++k) {
              const std::size_t count = counts[k];
              const bool registered = (k + static_cast<std::size_t>(t + o)) % 2 == 0;
              for (bool inPlace : {false, true}) {
                CallShape s{coll, static_cast<DataType>(t), static_cast<ReduceOp>(o), count, rank, n,
                            0, 5000u + calls + refused};
                try {
                  const std::size_t wrong =
                      runAndCheck(r, s, inPlace, {.reordered = true, .registered = registered});
                  EXPECT_EQ(wrong, 0u) << label(s, algo, inPlace) << (registered ? " registered" : " staged");
                  ++calls;
                } catch (const Error& e) {
                  EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
                  EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
                  ++refused;
                }
                if (::testing::Test::HasFailure()) return;
              }
            }
          }
        }
        if (rank == 0) std::printf("%s: checked %zu calls, refused %zu\n", algo.c_str(), calls, refused);
        EXPECT_GT(calls, 0u) << algo << " ran no call";
      }
      r.comm->setAlgorithm(coll, "");
    }
    EXPECT_GE(plans, 9) << "FERRY_PLAN_DIR holds fewer plans than the shipped programs";
  }, {std::chrono::seconds(900)});
}

// On every rank: runs f(r, coll, algo, inPlace) for every loaded plan with the placement it takes
// (the other is refused, as EveryPlanTypeOpAndPlacement checks); f returns whether the plan ran
// the call. A plan that runs no call fails the test, unless it refused for its byte range.
template <class F>
void forEveryPlanOnEveryRank(int n, F&& f) {
  UniqueId id = UniqueId::create();
  runRanksOk(n,
             [&](int rank) {
               Rank r(id, rank, n);
               for (int c = 0; c < kCollectiveCount; ++c) {
                 const auto coll = static_cast<Collective>(c);
                 for (const std::string& algo : Comm::algorithmNames(coll)) {
                   if (!algo.starts_with("plan:")) continue;
                   r.comm->setAlgorithm(coll, algo);
                   bool ran = false, outOfRange = false;
                   for (bool inPlace : {false, true}) {
                     try {
                       ran = f(r, coll, algo, inPlace) || ran;
                     } catch (const Error& e) {
                       const std::string what = e.what();
                       EXPECT_NE(what.find("cannot run this call"), std::string::npos) << what;
                       outOfRange = outOfRange || what.find("outside the plan's range") != std::string::npos;
                       EXPECT_TRUE(what.find("place calls only") != std::string::npos || outOfRange) << what;
                     }
                     if (::testing::Test::HasFailure()) return;
                   }
                   EXPECT_TRUE(ran || outOfRange) << algo << " ran no call";
                   if (rank == 0 && !ran) std::printf("%s: refused (byte range)\n", algo.c_str());
                 }
                 r.comm->setAlgorithm(coll, "");
               }
             },
             {std::chrono::seconds(600)});
}

// The API count of a call whose larger buffer holds about `elements` on n ranks.
std::size_t countFor(Collective coll, std::size_t elements, int n) {
  const bool perRank =
      coll == Collective::AllGather || coll == Collective::ReduceScatter || coll == Collective::AllToAll;
  return perRank ? elements / static_cast<std::size_t>(n) : elements;
}

// Every plan on a call large enough to run in every lane FERRY_PLAN_LANES allows (64 by default;
// a call runs in one lane per 256 KiB), with a count that leaves every lane a ragged tail. This
// binary's scratch is 1 MiB, so the plans with scratch chunks run such a call in rounds.
TEST_P(GpuCollectives, EveryPlanInManyLanes) {
  const int n = GetParam();
  if (std::getenv("FERRY_PLAN_DIR") == nullptr) GTEST_SKIP() << "FERRY_PLAN_DIR is not set: no plans to run";
  forEveryPlanOnEveryRank(n, [&](Rank& r, Collective coll, const std::string& algo, bool inPlace) {
    // 16 MiB (and 5 floats) in the larger buffer: 64 lanes of 256 KiB.
    const std::size_t elements = (std::size_t{4} << 20) + 5;
    const CallShape s{coll,
                      DataType::Float32,
                      ReduceOp::Sum,
                      countFor(coll, elements, n),
                      r.rank,
                      n,
                      0,
                      9000u + static_cast<unsigned>(coll)};
    EXPECT_EQ(runAndCheck(r, s, inPlace, {.reordered = true, .registered = true}), 0u)
        << label(s, algo, inPlace);
    if (r.rank == 0) std::printf("%s: %zu elements checked\n", algo.c_str(), s.recvCount());
    return true;
  });
}

// Every plan on calls whose scratch is several times this binary's (1 MiB): they run in rounds,
// the last one short, with avg (divided round by round), a wide integer type and bf16, on
// registered and staged buffers.
TEST_P(GpuCollectives, EveryPlanInRounds) {
  const int n = GetParam();
  if (std::getenv("FERRY_PLAN_DIR") == nullptr) GTEST_SKIP() << "FERRY_PLAN_DIR is not set: no plans to run";
  unsigned seed = 9100;
  forEveryPlanOnEveryRank(n, [&](Rank& r, Collective coll, const std::string& algo, bool inPlace) {
    const std::pair<DataType, ReduceOp> cases[] = {{DataType::Float32, ReduceOp::Avg},
                                                   {DataType::Int64, ReduceOp::Max},
                                                   {DataType::BFloat16, ReduceOp::Sum}};
    for (const auto& [type, op] : cases) {
      const bool registered = seed % 2 == 0;
      const CallShape s{coll, type, op, countFor(coll, 1200003, n), r.rank, n, 0, seed++};
      EXPECT_EQ(runAndCheck(r, s, inPlace, {.reordered = true, .registered = registered}), 0u)
          << label(s, algo, inPlace) << (registered ? " registered" : " staged");
      if (::testing::Test::HasFailure()) break;
    }
    if (r.rank == 0) std::printf("%s: rounds checked\n", algo.c_str());
    return true;
  });
}

// Plans in a CUDA graph: a direct plan (the ring) on registered buffers and on unregistered ones
// (staged: one call first, outside the capture, sets the staging buffer up), and a scratch-only one
// (packets), captured once and replayed with new inputs. A staged call that would need a larger
// staging buffer during a capture is refused, saying what to do.
TEST_P(GpuCollectives, PlansCapturedInAGraphAndReplayed) {
  const int n = GetParam();
  if (std::getenv("FERRY_PLAN_DIR") == nullptr) GTEST_SKIP() << "FERRY_PLAN_DIR is not set: no plans to run";
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const CallShape shapes[] = {
        {Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 40000, rank, n, 0, 0},
        {Collective::AllReduce, DataType::Int32, ReduceOp::Max, 999, rank, n, 0, 0},
        {Collective::AllReduce, DataType::BFloat16, ReduceOp::Sum, 30001, rank, n, 0, 0}};
    const char* plans[] = {"plan:allreduce_ring", "plan:allreduce_allpairs_packets", "plan:allreduce_ring"};
    std::vector<std::unique_ptr<CallBuffers>> bufs;
    std::vector<BufferRegistration> regs;
    for (std::size_t k = 0; k < std::size(shapes); ++k) {
      bufs.push_back(std::make_unique<CallBuffers>(r.device, shapes[k], false));
      if (k == 2) break;  // staged
      regs.push_back(r.comm->registerBuffer(bufs.back()->sendBuf.ptr, bufs.back()->sendBuf.bytes));
      regs.push_back(r.comm->registerBuffer(bufs.back()->recvBuf.ptr, bufs.back()->recvBuf.bytes));
    }
    r.comm->setAlgorithm(Collective::AllReduce, plans[2]);
    EXPECT_EQ(runAndCheck(r, shapes[2], false, {.reordered = true}), 0u);  // sets the staging buffer up
    captureReplayAndCheck(r, shapes, bufs, 5, true,
                          [&](std::size_t k) { r.comm->setAlgorithm(Collective::AllReduce, plans[k]); });

    // More than the staging buffer holds (2 MiB so far), on a plan without scratch: the staging
    // buffer would have to grow inside the capture.
    const CallShape larger{Collective::AllGather, DataType::BFloat16, ReduceOp::Sum, 1 << 19, rank, n, 0, 0};
    CallBuffers big(r.device, larger, false);
    r.comm->setAlgorithm(Collective::AllGather, "plan:allgather_allpairs");
    ASSERT_EQ(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    try {
      issue(*r.comm, larger, big.send, big.recv, r.stream);
      ADD_FAILURE() << "a staged call that needs a larger staging buffer was captured";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a call of this size once before capturing"), std::string::npos)
          << e.what();
    }
    cudaGraph_t unused;
    EXPECT_EQ(cudaStreamEndCapture(r.stream, &unused), cudaSuccess);
    if (unused != nullptr) cudaGraphDestroy(unused);
    EXPECT_EQ(runAndCheck(r, larger, false, {.reordered = true}), 0u);  // outside a capture it grows
    r.comm->setAlgorithm(Collective::AllGather, "");
    r.comm->setAlgorithm(Collective::AllReduce, "");
    for (const auto& reg : regs) r.comm->deregisterBuffer(reg);
  });
}

// The copy-engine algorithms on counts that take several pipelined rounds through the 1 MiB
// scratch, then captured in a CUDA graph and replayed on new data (the driver asks the proxy for
// copies at run time, so a replay must work like a first call).
TEST_P(GpuCollectives, CopyEngineAlgorithmsOverManyRoundsAndInAGraph) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const std::pair<Collective, const char*> algos[] = {{Collective::AllReduce, "allreduce_ce"},
                                                        {Collective::ReduceScatter, "reducescatter_ce"},
                                                        {Collective::AllGather, "allgather_ce"},
                                                        {Collective::AllToAll, "alltoall_ce"}};
    for (const auto& [coll, algo] : algos) {
      r.comm->setAlgorithm(coll, algo);
      for (DataType t : {DataType::Float32, DataType::BFloat16, DataType::Int64}) {
        for (bool inPlace : {false, true}) {
          if (coll == Collective::AllToAll && inPlace) continue;  // out of place only
          const std::size_t count = (std::size_t{1} << 18) + 5 + static_cast<std::size_t>(t);
          const CallShape s{coll, t, ReduceOp::Sum, count, rank, n, 0, 555u + static_cast<unsigned>(t)};
          EXPECT_EQ(runAndCheck(r, s, inPlace, {.registered = true}), 0u) << label(s, algo, inPlace);
          if (::testing::Test::HasFailure()) return;
        }
      }
      r.comm->setAlgorithm(coll, "");
    }

    // The reduce-scatter runs the direct algorithm: zero-copy calls in a graph too.
    const CallShape shapes[] = {{Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 300001, rank, n, 0, 0},
                                {Collective::AllGather, DataType::Float16, ReduceOp::Sum, 70001, rank, n, 0, 0},
                                {Collective::ReduceScatter, DataType::BFloat16, ReduceOp::Sum, 20001, rank, n, 0, 0}};
    std::vector<std::unique_ptr<CallBuffers>> bufs;
    std::vector<BufferRegistration> regs;
    for (const auto& s : shapes) {
      bufs.push_back(std::make_unique<CallBuffers>(r.device, s, false));
      regs.push_back(r.comm->registerBuffer(bufs.back()->sendBuf.ptr, bufs.back()->sendBuf.bytes));
      regs.push_back(r.comm->registerBuffer(bufs.back()->recvBuf.ptr, bufs.back()->recvBuf.bytes));
    }
    r.comm->setAlgorithm(Collective::AllReduce, "allreduce_ce");
    r.comm->setAlgorithm(Collective::AllGather, "allgather_ce");
    r.comm->setAlgorithm(Collective::ReduceScatter, "reducescatter_direct");
    captureReplayAndCheck(r, shapes, bufs, 3, false);
    for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter}) r.comm->setAlgorithm(c, "");
    for (const auto& reg : regs) r.comm->deregisterBuffer(reg);
  });
}

// 1,000 allreduce calls of changing size with no synchronization between them, on the selector's
// choice (crossing the LL / two-shot boundary), each reading the previous call's output: int32 sum,
// so after the first call every element of a prefix of length L is multiplied by the world size.
TEST_P(GpuCollectives, ThousandBackToBackCallsOfChangingSize) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    constexpr std::size_t kMax = 200000;
    DeviceBuffer buf(r.device, kMax * 4);
    std::vector<std::int32_t> host(kMax);
    tools::fillSend(DataType::Int32, host.data(), kMax, 0, 7);  // same start on every rank
    cudaMemcpy(buf.ptr, host.data(), kMax * 4, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();  // (the DMA of a pageable copy may land after it returns; r.stream is not ordered)
    std::mt19937 rng(99);  // same sizes on every rank
    for (int i = 0; i < 1000; ++i) {
      const std::size_t len = 1 + rng() % (i % 3 == 0 ? kMax : 4000);
      r.comm->allReduce(buf.ptr, buf.ptr, len, DataType::Int32, ReduceOp::Sum, r.stream);
      for (std::size_t k = 0; k < len; ++k) host[k] = static_cast<std::int32_t>(static_cast<std::uint32_t>(host[k]) * n);
    }
    ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
    std::vector<std::int32_t> got(kMax);
    cudaMemcpy(got.data(), buf.ptr, kMax * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(tools::countWrong(DataType::Int32, got.data(), host.data(), kMax), 0u);
  });
}

// Comms whose kernels are bounded (CommOptions, NCCL's minCTAs/maxCTAs): every built-in algorithm at
// a few sizes, within one block, within [8, 8], and with bounds that differ between ranks (the
// tightest apply to all). Algorithms that need more blocks than allowed must refuse, saying so.
TEST_P(GpuCollectives, EveryAlgorithmWithinBlockBounds) {
  const int n = GetParam();
  for (int variant = 0; variant < 3; ++variant) {
    UniqueId id = UniqueId::create();
    runRanksOk(n, [&](int rank) {
      const CommOptions options[] = {{0, 1}, {8, 8}, {rank == 0 ? 2 : 0, rank == n - 1 ? 3 : 0}};
      Rank r(id, rank, n, options[variant]);
      std::size_t calls = 0, refused = 0;
      for (int c = 0; c < kCollectiveCount; ++c) {
        const auto coll = static_cast<Collective>(c);
        for (const std::string& algo : Comm::algorithmNames(coll)) {
          if (algo.starts_with("plan:") || !algorithmChosen(algo)) continue;
          const bool direct = algo.ends_with("_direct") || algo.ends_with("_ce");
          r.comm->setAlgorithm(coll, algo);
          for (DataType t : {DataType::Float32, DataType::BFloat16}) {
            for (std::size_t count : {3ul, 70001ul}) {
              const CallShape s{coll, t, ReduceOp::Sum, count, rank, n, 1 % n, 700u + calls + refused};
              try {
                const std::size_t wrong =
                    runAndCheck(r, s, false, {.reordered = reorders(*r.comm, algo), .registered = direct});
                EXPECT_EQ(wrong, 0u) << label(s, algo, false) << " bounds variant " << variant;
                ++calls;
              } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
                ++refused;
              }
              if (::testing::Test::HasFailure()) return;
            }
          }
          r.comm->setAlgorithm(coll, "");
        }
      }
      if (rank == 0) std::printf("block bounds variant %d: %zu calls checked, %zu refused\n", variant, calls, refused);
    });
  }
}

// 400 calls with no synchronization between them: random collective, algorithm (forced, every
// built-in one), type, op, root and count, on sub-ranges of two registered arenas (so the zero-copy
// and copy-engine algorithms run too), each call on fresh input and a poisoned output of its own.
// Consecutive calls of different algorithms share the Comm's buffers and flags: this is where a
// mistake in the reuse rules (device_context.hpp) would show. Every output is checked at the end.
TEST_P(GpuCollectives, MixedAlgorithmsBackToBack) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    struct Planned {
      CallShape shape;
      std::string algo;
      std::size_t sendAt, recvAt;  // byte offsets into the arenas
    };
    std::mt19937 rng(2026);  // the same sequence on every rank
    std::vector<Planned> calls;
    std::size_t sendBytes = 0, recvBytes = 0;
    auto align = [](std::size_t b) { return (b + 255) / 256 * 256; };
    while (calls.size() < 400) {
      const auto coll = static_cast<Collective>(rng() % kCollectiveCount);
      const auto names = Comm::algorithmNames(coll);
      std::string algo = names[rng() % names.size()];
      if (algo.starts_with("plan:") || !algorithmChosen(algo)) continue;
      const auto type = static_cast<DataType>(rng() % kDataTypeCount);
      const auto op = tools::reduces(coll) ? static_cast<ReduceOp>(rng() % kReduceOpCount) : ReduceOp::Sum;
      const std::size_t count = 1 + (rng() % 4 == 0 ? rng() % 60000 : rng() % 3000);
      const CallShape s{coll, type, op, count, rank, n, static_cast<int>(rng() % n), 9000u + calls.size()};
      calls.push_back({s, algo, sendBytes, recvBytes});
      sendBytes += align(s.sendCount() * sizeOf(type));
      recvBytes += align(s.recvCount() * sizeOf(type));
    }
    DeviceBuffer sendArena(r.device, sendBytes), recvArena(r.device, recvBytes);
    const BufferRegistration regs[] = {r.comm->registerBuffer(sendArena.ptr, sendBytes),
                                       r.comm->registerBuffer(recvArena.ptr, recvBytes)};
    auto* sendBase = static_cast<char*>(sendArena.ptr);
    auto* recvBase = static_cast<char*>(recvArena.ptr);
    std::vector<char> host(sendBytes);
    for (const Planned& c : calls)
      tools::fillSend(c.shape.type, host.data() + c.sendAt, c.shape.sendCount(), rank, c.shape.seed);
    cudaMemcpy(sendBase, host.data(), sendBytes, cudaMemcpyHostToDevice);
    cudaMemset(recvBase, kPoison, recvBytes);
    cudaDeviceSynchronize();
    r.boot->barrier();
    std::vector<bool> ran;
    for (const Planned& c : calls) {
      r.comm->setAlgorithm(c.shape.collective, c.algo);
      try {
        issue(*r.comm, c.shape, sendBase + c.sendAt, recvBase + c.recvAt, r.stream);
        ran.push_back(true);
      } catch (const Error& e) {
        // The forced algorithm cannot run this call (too large for it, say): refused alike everywhere.
        EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
        ran.push_back(false);
      }
      r.comm->setAlgorithm(c.shape.collective, "");
    }
    ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
    std::vector<char> got(recvBytes);
    cudaMemcpy(got.data(), recvBase, recvBytes, cudaMemcpyDeviceToHost);
    std::size_t checked = 0;
    for (std::size_t k = 0; k < calls.size(); ++k) {
      if (!ran[k]) continue;
      const CallShape& s = calls[k].shape;
      std::vector<char> want(s.recvCount() * sizeOf(s.type));
      tools::expectedRecv(s, want.data());
      const char* out = got.data() + calls[k].recvAt;
      const std::size_t wrong =
          reorders(*r.comm, calls[k].algo)
              ? tools::countWrongReordered(s.type, s.op, n, out, want.data(), s.recvCount())
              : tools::countWrong(s.type, out, want.data(), s.recvCount());
      EXPECT_EQ(wrong, 0u) << "call " << k << ": " << label(s, calls[k].algo, false);
      ++checked;
    }
    if (rank == 0) std::printf("mixed: %zu of %zu calls ran and were checked\n", checked, calls.size());
    EXPECT_GT(checked, calls.size() / 2);
    for (const auto& reg : regs) r.comm->deregisterBuffer(reg);
  });
}

// Every collective captured in one CUDA graph, replayed with new inputs each time.
TEST_P(GpuCollectives, CapturedInAGraphAndReplayed) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const std::size_t count = 50000;
    const CallShape shapes[] = {
        {Collective::AllReduce, DataType::BFloat16, ReduceOp::Sum, count, rank, n, 0, 0},
        {Collective::AllReduce, DataType::Float32, ReduceOp::Max, 300, rank, n, 0, 0},
        {Collective::AllGather, DataType::Float16, ReduceOp::Sum, count, rank, n, 0, 0},
        {Collective::ReduceScatter, DataType::Float32, ReduceOp::Avg, count, rank, n, 0, 0},
        {Collective::AllToAll, DataType::Int32, ReduceOp::Sum, 3001, rank, n, 0, 0},
        {Collective::Broadcast, DataType::BFloat16, ReduceOp::Sum, count, rank, n, n - 1, 0},
        {Collective::Reduce, DataType::Float16, ReduceOp::Sum, 300, rank, n, 1, 0},
        {Collective::Reduce, DataType::Float32, ReduceOp::Min, count, rank, n, 0, 0}};
    std::vector<std::unique_ptr<CallBuffers>> bufs;
    for (const auto& s : shapes) bufs.push_back(std::make_unique<CallBuffers>(r.device, s, false));
    captureReplayAndCheck(r, shapes, bufs, 5, false);
  });
}

// PreMulSum ops (each rank its own factor): every type through allReduce, reduceScatter and reduce,
// in place and out, at sizes of every algorithm range, with the factor on the host or the device
// and the buffers registered or not, by the selector's choice (which may reduce out of rank order).
// Then in a CUDA graph: the first call outside the capture grows the premul scratch; a larger one
// inside it is refused, saying what to do.
TEST_P(GpuCollectives, PreMulSumEveryTypePlacementAndFactor) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(
      n,
      [&](int rank) {
        Rank r(id, rank, n);
        std::size_t calls = 0;
        for (Collective coll : {Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce}) {
          for (int t = 0; t < kDataTypeCount; ++t) {
            for (std::size_t count : {1ul, 1023ul, 70001ul, 600000ul}) {
              for (bool inPlace : {false, true}) {
                CallShape s{coll, static_cast<DataType>(t),          ReduceOp::Sum, count, rank,
                            n,    static_cast<int>((count + t) % n), 9000u + calls};
                s.preMulSum = true;
                const bool onDevice = calls % 2 == 0, registered = calls / 2 % 2 == 0;
                const std::size_t wrong = runAndCheck(
                    r, s, inPlace, {.reordered = true, .registered = registered, .factorOnDevice = onDevice});
                EXPECT_EQ(wrong, 0u) << label(s, "premulsum", inPlace)
                                     << (onDevice ? " device factor" : " host factor")
                                     << (registered ? " registered" : "");
                ++calls;
                if (::testing::Test::HasFailure()) return;
              }
            }
          }
        }
        if (rank == 0) std::printf("PreMulSum: checked %zu calls\n", calls);

        const std::size_t count = 40000;
        CallShape shapes[] = {
            {Collective::AllReduce, DataType::BFloat16, ReduceOp::Sum, count, rank, n, 0, 0},
            {Collective::ReduceScatter, DataType::Float32, ReduceOp::Sum, count, rank, n, 0, 0},
            {Collective::Reduce, DataType::Float16, ReduceOp::Sum, count, rank, n, n - 1, 0}};
        std::vector<std::unique_ptr<CallBuffers>> bufs;
        for (auto& s : shapes) {
          s.preMulSum = true;
          bufs.push_back(std::make_unique<CallBuffers>(r.device, s, false));
        }
        captureReplayAndCheck(r, shapes, bufs, 3, true);

        // The premul scratch is at most twice the largest input scaled so far (600000 float64 per rank
        // of a reduceScatter) by now; this call needs more, so it would grow inside the capture.
        CallShape larger{Collective::ReduceScatter, DataType::Float64, ReduceOp::Sum, 1500000, rank, n, 0, 0};
        larger.preMulSum = true;
        CallBuffers big(r.device, larger, false);
        ASSERT_EQ(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        try {
          issue(*r.comm, larger, big.send, big.recv, r.stream);
          ADD_FAILURE() << "a PreMulSum call that needs a larger premul scratch was captured";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("a call of this size once before capturing"),
                    std::string::npos)
              << e.what();
        }
        cudaGraph_t unused;
        EXPECT_EQ(cudaStreamEndCapture(r.stream, &unused), cudaSuccess);
        if (unused != nullptr) cudaGraphDestroy(unused);
        EXPECT_EQ(runAndCheck(r, larger, false, {.reordered = true}), 0u);  // outside a capture it grows
      },
      {std::chrono::seconds(600)});
}

// Two Comms over the same GPUs, each on its own stream, calls interleaved without synchronization.
// The seeded input of shape s on this rank, into b's send buffer.
void fillSendOf(const CallShape& s, CallBuffers& b, int rank) {
  std::vector<char> send(s.sendCount() * sizeOf(s.type));
  tools::fillSend(s.type, send.data(), s.sendCount(), rank, s.seed);
  cudaMemcpy(b.send, send.data(), send.size(), cudaMemcpyHostToDevice);
}

// Every element of b's recv buffer against the reference of shape s.
void expectRecvOf(const CallShape& s, const CallBuffers& b) {
  const std::size_t es = sizeOf(s.type);
  std::vector<char> got(s.recvCount() * es), want(s.recvCount() * es);
  cudaMemcpy(got.data(), b.recv, got.size(), cudaMemcpyDeviceToHost);
  tools::expectedRecv(s, want.data());
  EXPECT_EQ(tools::countWrong(s.type, got.data(), want.data(), s.recvCount()), 0u) << toString(s.collective);
}

TEST_P(GpuCollectives, TwoCommsConcurrentlyOnTwoStreams) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank a(id, rank, n);
    Comm second(a.boot->split(0, rank));
    cudaStream_t s2;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    const CallShape sa{Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 1 << 20, rank, n, 0, 11};
    const CallShape sb{Collective::AllGather, DataType::Int32, ReduceOp::Sum, 100000, rank, n, 0, 12};
    CallBuffers ba(a.device, sa, false), bb(a.device, sb, false);
    for (auto [s, b] : {std::pair{&sa, &ba}, std::pair{&sb, &bb}}) fillSendOf(*s, *b, rank);
    cudaDeviceSynchronize();
    a.boot->barrier();
    for (int i = 0; i < 20; ++i) {
      issue(*a.comm, sa, ba.send, ba.recv, a.stream);
      issue(second, sb, bb.send, bb.recv, s2);
    }
    ASSERT_EQ(cudaStreamSynchronize(a.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
    for (auto [s, b] : {std::pair{&sa, &ba}, std::pair{&sb, &bb}}) expectRecvOf(*s, *b);
    cudaStreamDestroy(s2);
  });
}

// One Comm called on two streams in turn: its calls run in the order they were made, whatever the
// streams (as NCCL orders a communicator's calls; FSDP issues all-gathers and reduce-scatters from
// two streams). A host function holds the first stream back before each of its calls, so without
// the order the second stream's call would run first on some ranks and not on others.
TEST_P(GpuCollectives, OneCommOnTwoStreamsRunsItsCallsInOrder) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank a(id, rank, n);
    cudaStream_t s2;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    const CallShape sa{Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 1 << 18, rank, n, 0, 21};
    const CallShape sb{Collective::AllGather, DataType::Int32, ReduceOp::Sum, 50000, rank, n, 0, 22};
    CallBuffers ba(a.device, sa, false), bb(a.device, sb, false);
    for (auto [s, b] : {std::pair{&sa, &ba}, std::pair{&sb, &bb}}) fillSendOf(*s, *b, rank);
    cudaDeviceSynchronize();
    a.boot->barrier();
    int delayMs = 2 + 3 * (rank % 2);  // rank-dependent: the ranks' streams would drift apart without the order
    for (int i = 0; i < 10; ++i) {
      ASSERT_EQ(cudaLaunchHostFunc(
                    a.stream,
                    [](void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); },
                    &delayMs),
                cudaSuccess);
      issue(*a.comm, sa, ba.send, ba.recv, a.stream);
      issue(*a.comm, sb, bb.send, bb.recv, s2);
    }
    ASSERT_EQ(cudaStreamSynchronize(a.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
    for (auto [s, b] : {std::pair{&sa, &ba}, std::pair{&sb, &bb}}) expectRecvOf(*s, *b);
    cudaStreamDestroy(s2);
  });
}

// A rank that never joins a call: the others' kernels give up after FERRY_DEVICE_TIMEOUT and their
// stream reports an error, instead of hanging.
TEST_P(GpuCollectives, MissingRankTimesOut) {
  const int n = GetParam();
  if (n > 2 && ranksShareGpus(n)) GTEST_SKIP() << "several ranks trap at once: needs a GPU per rank";
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    DeviceBuffer buf(r.device, 4096);
    if (rank != n - 1) {
      const auto start = std::chrono::steady_clock::now();
      r.comm->allReduce(buf.ptr, buf.ptr, 1024, DataType::Float32, ReduceOp::Sum, r.stream);
      const cudaError_t err = cudaStreamSynchronize(r.stream);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_NE(err, cudaSuccess);
      EXPECT_LT(s, 25.0);  // FERRY_DEVICE_TIMEOUT is 10 s here
    }
    r.boot->barrier();
    std::fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);  // the trapped context cannot be torn down cleanly
  });
}

// A call that one rank never joins, ended by that rank's abort() instead of the timeout: every
// rank's kernel returns (without a trap) well before FERRY_DEVICE_TIMEOUT, every rank sees
// aborted(), the aborted Comm is destroyed without hanging, and a new Comm then computes right.
TEST_P(GpuCollectives, AbortEndsAHungCallOnEveryRank) {
  const int n = GetParam();
  UniqueId id = UniqueId::create(), second = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    using Clock = std::chrono::steady_clock;
    const auto seconds = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
    {
      Rank r(id, rank, n);
      DeviceBuffer buf(r.device, 4 << 20);
      const auto start = Clock::now();
      if (rank != n - 1) {
        r.comm->allReduce(buf.ptr, buf.ptr, 1 << 18, DataType::Float32, ReduceOp::Sum, r.stream);
        // Queued behind it (in place: this rank's block of the output is its input).
        r.comm->allGather(static_cast<char*>(buf.ptr) + rank * 4000, buf.ptr, 1000, DataType::Int32, r.stream);
      }
      r.boot->barrier();
      if (rank == n - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are surely waiting
        r.comm->abort();
        EXPECT_THROW(r.comm->allReduce(buf.ptr, buf.ptr, 16, DataType::Float32, ReduceOp::Sum, r.stream), Error);
      }
      EXPECT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
      EXPECT_LT(seconds(start), 5.0) << "the abort did not end the wait (FERRY_DEVICE_TIMEOUT is 10 s here)";
      const auto polled = Clock::now();
      while (!r.comm->aborted() && seconds(polled) < 5.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(r.comm->aborted());
      r.boot->barrier();
    }
    Rank fresh(second, rank, n);
    const CallShape s{Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 4099, rank, n, 0, 77};
    EXPECT_EQ(runAndCheck(fresh, s, false), 0u);
  });
}

// Registration ids cycle through the table's 256 slots: a registration that lives on (as the
// staging buffer's does) must not block them. 600 register/deregister cycles around one kept
// buffer, then a direct call on both.
TEST_P(GpuCollectives, RegistrationSlotsAreReusedAroundALongLivedOne) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const CallShape s{Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 100000, rank, n, 0, 31};
    CallBuffers b(r.device, s, false);
    const BufferRegistration kept = r.comm->registerBuffer(b.sendBuf.ptr, b.sendBuf.bytes);
    for (int i = 0; i < 600; ++i)
      r.comm->deregisterBuffer(r.comm->registerBuffer(b.recvBuf.ptr, b.recvBuf.bytes));
    const BufferRegistration last = r.comm->registerBuffer(b.recvBuf.ptr, b.recvBuf.bytes);
    EXPECT_GT(last.id, 600u);
    r.comm->setAlgorithm(Collective::AllReduce, "allreduce_direct");
    std::vector<char> send(s.sendCount() * 4), want(s.recvCount() * 4), got(s.recvCount() * 4);
    tools::fillSend(s.type, send.data(), s.sendCount(), rank, s.seed);
    cudaMemcpy(b.send, send.data(), send.size(), cudaMemcpyHostToDevice);
    cudaMemset(b.recv, kPoison, got.size());
    cudaDeviceSynchronize();
    r.boot->barrier();
    issue(*r.comm, s, b.send, b.recv, r.stream);
    ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
    cudaMemcpy(got.data(), b.recv, got.size(), cudaMemcpyDeviceToHost);
    tools::expectedRecv(s, want.data());
    EXPECT_EQ(tools::countWrong(s.type, got.data(), want.data(), s.recvCount()), 0u);
    r.comm->setAlgorithm(Collective::AllReduce, "");
    r.comm->deregisterBuffer(last);
    r.comm->deregisterBuffer(kept);
  });
}

// Buffers registered on rank 0 only: rank 0 runs the direct algorithm (forced: the tuning table
// may pick a scratch algorithm for registered buffers too), the others the scratch path, and every
// rank's kernel reports the mismatch (or its peer's absence) instead of hanging.
TEST_P(GpuCollectives, RegisteredOnOneRankOnlyIsAnError) {
  const int n = GetParam();
  if (ranksShareGpus(n)) GTEST_SKIP() << "several ranks trap at once: needs a GPU per rank";
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const std::size_t count = 1 << 20;
    DeviceBuffer buf(r.device, count * 4);
    const BufferRegistration reg = r.comm->registerBuffer(buf.ptr, buf.bytes);
    if (rank != 0) r.comm->deregisterBuffer(reg);
    if (rank == 0) r.comm->setAlgorithm(Collective::AllReduce, "allreduce_direct");
    const auto start = std::chrono::steady_clock::now();
    r.comm->allReduce(buf.ptr, buf.ptr, count, DataType::Float32, ReduceOp::Sum, r.stream);
    const cudaError_t err = cudaStreamSynchronize(r.stream);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(err, cudaSuccess);
    EXPECT_LT(s, 25.0);  // FERRY_DEVICE_TIMEOUT is 10 s here
    r.boot->barrier();
    std::fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);  // the trapped context cannot be torn down cleanly
  });
}

// Ranks whose calls differ (a count off by one, a different op) would exchange mismatched data
// without noticing: the counts below move the same number of packets or words, so nothing waits
// for data that never comes. Every rank's kernel must instead stop with a report naming the
// mismatch, at once (well inside FERRY_DEVICE_TIMEOUT), before a direct call touches a peer's buffer.
TEST_P(GpuCollectives, MismatchedCallsAreAnError) {
  const int n = GetParam();
  // Two ranks trapping at once on one GPU left one of them hung (seen on one H200).
  if (ranksShareGpus(n)) GTEST_SKIP() << "several ranks trap at once: needs a GPU per rank";
  struct Case {
    const char* algorithm;
    std::size_t count, lastRankCount;  // of float; the last rank calls with the second
    ReduceOp op, lastRankOp;
    bool registered;
  };
  const Case cases[] = {
      {"allreduce_ll", 100, 99, ReduceOp::Sum, ReduceOp::Sum, false},
      {"allreduce_two_shot", 1 << 16, 1 << 16, ReduceOp::Sum, ReduceOp::Max, false},
      {"allreduce_direct", 4096, 4095, ReduceOp::Sum, ReduceOp::Sum, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.algorithm);
    UniqueId id = UniqueId::create();
    runRanksOk(n, [&](int rank) {
      Rank r(id, rank, n);
      DeviceBuffer buf(r.device, c.count * 4);
      if (c.registered) r.comm->registerBuffer(buf.ptr, buf.bytes);
      r.comm->setAlgorithm(Collective::AllReduce, c.algorithm);
      const bool last = rank == n - 1;
      cudaError_t err = cudaSuccess;
      const auto start = std::chrono::steady_clock::now();
      const std::string report = capturingStdout([&] {
        r.comm->allReduce(buf.ptr, buf.ptr, last ? c.lastRankCount : c.count, DataType::Float32,
                          last ? c.lastRankOp : c.op, r.stream);
        err = cudaStreamSynchronize(r.stream);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_NE(err, cudaSuccess);
      EXPECT_LT(s, 5.0) << "found by the timeout (10 s here), not by the shape check";
      EXPECT_NE(report.find("made this call with other arguments"), std::string::npos) << report;
      r.boot->barrier();
      std::fflush(stdout);
      _exit(::testing::Test::HasFailure() ? 1 : 0);  // the trapped context cannot be torn down cleanly
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Gpus, GpuCollectives, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "gpus"; });

}  // namespace
}  // namespace ferry::test
