// The algorithm registry, the tuning table and the selector, without a GPU: which algorithm a call
// gets, that forcing and malformed tables fail with InvalidUsage naming the culprit, and FERRY_ALGO.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/algorithm_states.hpp"
#include "comm/buffer_registry.hpp"
#include "kernels/launch.hpp"
#include "comm/across_hosts_algorithms.hpp"
#include "comm/selector.hpp"
#include "expect_contains.hpp"
#include "invalid_usage.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kAny = ~0ull;
// 4 ranks, 1 MiB of data per LL slot, 64 MiB of scratch per half.
const CommLimits kLimits{4, 1 << 20, 64 << 20};

// A float call; the selector only looks at sizes, so the buffers are never touched.
CollectiveCall callOf(Collective c, std::size_t count, int worldSize = 4) {
  CollectiveCall call;
  call.collective = c;
  call.count = count;
  call.type = DataType::Float32;
  call.worldSize = worldSize;
  call.send = reinterpret_cast<const void*>(0x10000);
  call.recv = reinterpret_cast<void*>(0x80000000);
  return call;
}

// The message of the InvalidUsage error `f` throws; a test failure (and "") for anything else.
using ::ferry::testing::invalidUsageOf;

std::string selected(const Selector& s, const CollectiveCall& call, const CommLimits& limits = kLimits) {
  return s.select(call, limits).name();
}

// --- Registry -----------------------------------------------------------------------------------

TEST(AlgorithmRegistry, NamesAreUniqueAndFindable) {
  std::set<std::string> names;
  for (const Algorithm* a : allAlgorithms()) {
    EXPECT_TRUE(names.insert(a->name()).second) << "duplicate algorithm name " << a->name();
    EXPECT_EQ(findAlgorithm(a->name()), a);
  }
  EXPECT_EQ(findAlgorithm("allreduce_bogus"), nullptr);
  EXPECT_EQ(findAlgorithm(""), nullptr);
}

// The selector's last resort is registry order within a collective, so each group must be
// contiguous, and a choice needs at least two candidates.
TEST(AlgorithmRegistry, GroupedByCollectiveWithAtLeastTwoEach) {
  int counts[kCollectiveCount] = {};
  int previous = 0;
  for (const Algorithm* a : allAlgorithms()) {
    const int c = static_cast<int>(a->collective());
    EXPECT_GE(c, previous) << a->name() << " is not grouped with the other " << toString(a->collective())
                           << " algorithms";
    previous = c;
    ++counts[c];
  }
  for (int c = 0; c < kCollectiveCount; ++c)
    EXPECT_GE(counts[c], 2) << toString(static_cast<Collective>(c)) << " has fewer than 2 algorithms";
}

TEST(DefaultTuning, EveryRowNamesAnAlgorithmOfItsCollective) {
  for (const TuningRow& row : defaultTuning()) {
    if (row.hosts) {  // a row of calls across hosts names one of theirs
      EXPECT_TRUE(parseAcrossHostsAlgorithm(row.algorithm)) << row.algorithm;
      continue;
    }
    const Algorithm* a = findAlgorithm(row.algorithm);
    ASSERT_NE(a, nullptr) << "default row names unknown algorithm " << row.algorithm;
    EXPECT_EQ(a->collective(), row.collective) << row.algorithm;
  }
}

// --- Selection from the table -------------------------------------------------------------------

struct DefaultChoice {
  Collective collective;
  const char* small;  // at 4 KiB
  const char* large;  // at 64 MiB
  const char* registeredLarge = nullptr;  // at 64 MiB on registered buffers; unset: <collective>_direct
};

class DefaultSelection : public ::testing::TestWithParam<DefaultChoice> {};

// `count` is per rank for some collectives, so sizes are given as the call's bytes().
CollectiveCall callOfBytes(Collective c, std::uint64_t bytes) {
  CollectiveCall call = callOf(c, 1);
  call.count = bytes / call.bytes();
  EXPECT_EQ(call.bytes(), bytes);
  return call;
}

TEST_P(DefaultSelection, LLWhileSmallThenBandwidth) {
  const DefaultChoice& p = GetParam();
  const Selector s(defaultTuning());
  EXPECT_EQ(selected(s, callOfBytes(p.collective, 4 << 10)), p.small);
  EXPECT_EQ(selected(s, callOfBytes(p.collective, 64 << 20)), p.large);
}

INSTANTIATE_TEST_SUITE_P(
    Collectives, DefaultSelection,
    ::testing::Values(DefaultChoice{Collective::AllReduce, "allreduce_ll", "allreduce_two_shot"},
                      DefaultChoice{Collective::AllGather, "allgather_ll", "allgather_push"},
                      DefaultChoice{Collective::ReduceScatter, "reducescatter_ll", "reducescatter_push"},
                      DefaultChoice{Collective::AllToAll, "alltoall_ll", "alltoall_push"},
                      DefaultChoice{Collective::Broadcast, "broadcast_ll", "broadcast_chain", "broadcast_scatter"},
                      DefaultChoice{Collective::Reduce, "reduce_ll", "reduce_chain"}),
    [](const auto& info) { return std::string(toString(info.param.collective)); });

// Above the LL sizes, calls on registered buffers go zero-copy (but a 4-rank broadcast, where
// scatter + all-gather through scratch won at 64 MiB); below, LL still wins.
TEST_P(DefaultSelection, RegisteredBuffersGoDirectAboveLL) {
  const DefaultChoice& p = GetParam();
  const Selector s(defaultTuning());
  for (std::uint64_t bytes : {std::uint64_t{4} << 10, std::uint64_t{64} << 20}) {
    CollectiveCall call = callOfBytes(p.collective, bytes);
    call.sendId = 1;
    call.recvId = 2;
    const std::string direct = std::string(toString(p.collective)) + "_direct";
    EXPECT_EQ(selected(s, call), bytes < (1 << 20) ? std::string(p.small)
                                 : p.registeredLarge ? std::string(p.registeredLarge)
                                                     : direct)
        << bytes;
    call.recvId = 0;  // one buffer unregistered: the scratch path
    EXPECT_NE(selected(s, call), direct);
  }
}

// Two ranks have their own measured rows: LL to 1 MiB on any buffers; on registered ones the
// scratch kernels or the copy engine where zero-copy lost; on unregistered ones send/recv groups
// for allgather, alltoall (out of place) and broadcast. Other world sizes keep the general rows.
TEST(DefaultTuning, TwoRanksFollowTheirMeasurement) {
  const Selector s(defaultTuning());
  const CommLimits two{2, 1 << 20, 64 << 20};
  auto call = [](Collective c, std::uint64_t bytes, int worldSize, bool registered) {
    CollectiveCall x = callOf(c, 1, worldSize);
    x.count = bytes / x.bytes();
    if (registered) x.sendId = x.recvId = 1;
    return x;
  };
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1 << 20, 2, false), two), "allreduce_ll");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1 << 20, 4, false)), "allreduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1ull << 30, 2, true), two), "allreduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1ull << 30, 4, true)), "allreduce_direct");
  EXPECT_EQ(selected(s, call(Collective::AllGather, 2 << 20, 2, true), two), "allgather_push");
  EXPECT_EQ(selected(s, call(Collective::AllGather, 1ull << 30, 2, true), two), "allgather_ce");
  EXPECT_EQ(selected(s, call(Collective::AllGather, 1ull << 30, 2, false), two), "allgather_p2p");
  EXPECT_EQ(selected(s, call(Collective::AllGather, 1ull << 30, 4, false)), "allgather_push");
  EXPECT_EQ(selected(s, call(Collective::AllToAll, 4 << 20, 2, false), two), "alltoall_p2p");
  CollectiveCall inPlace = call(Collective::AllToAll, 4 << 20, 2, false);
  inPlace.send = inPlace.recv;
  EXPECT_EQ(selected(s, inPlace, two), "alltoall_push");
  EXPECT_EQ(selected(s, call(Collective::Broadcast, 1ull << 30, 2, false), two), "broadcast_p2p");
  EXPECT_EQ(selected(s, call(Collective::Broadcast, 32 << 20, 2, true), two), "broadcast_push");
  EXPECT_EQ(selected(s, call(Collective::Reduce, 1ull << 30, 2, true), two), "reduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::Reduce, 64 << 20, 2, false), two), "reduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::Reduce, 1ull << 30, 2, false), two), "reduce_chain");
}

// Four ranks broadcast large calls by scatter + all-gather, and from 64 MiB down a chain (unregistered
// buffers): the root's links bound broadcast_push there, and broadcast_direct lost above 16 MiB. Two
// ranks have nothing to scatter to: one send.
TEST(DefaultTuning, FourRanksBroadcastLargeCallsByScatter) {
  const Selector s(defaultTuning());
  auto call = [](std::uint64_t bytes, int worldSize) {
    CollectiveCall x = callOf(Collective::Broadcast, 1, worldSize);
    x.count = bytes / x.bytes();
    return x;
  };
  const CommLimits two{2, 1 << 20, 64 << 20};
  EXPECT_EQ(selected(s, call(64 << 10, 4)), "broadcast_ll");
  EXPECT_EQ(selected(s, call(1 << 20, 4)), "broadcast_push");
  EXPECT_EQ(selected(s, call(4 << 20, 4)), "broadcast_scatter");
  EXPECT_EQ(selected(s, call(32 << 20, 4)), "broadcast_scatter");
  EXPECT_EQ(selected(s, call(1ull << 30, 4)), "broadcast_chain");
  EXPECT_EQ(selected(s, call(1ull << 30, 2), two), "broadcast_p2p");
  CollectiveCall registered = call(16 << 20, 4);
  registered.sendId = registered.recvId = 1;
  EXPECT_EQ(selected(s, registered), "broadcast_direct");
  registered.count *= 4;
  EXPECT_EQ(selected(s, registered), "broadcast_scatter");
}

// Four ranks, unregistered buffers: the pipelines of collectives/chain.cu from where they won on 4
// H200 (reduce and broadcast above 32 MiB, the rings above 512 MiB), the kernels before them below;
// registered buffers keep the general rows; a scratch too small for their pieces falls through.
TEST(DefaultTuning, FourRanksTakeThePipelinesWhereTheyWon) {
  const Selector s(defaultTuning());
  auto call = [](Collective c, std::uint64_t bytes, bool registered = false) {
    CollectiveCall x = callOf(c, 1, 4);
    x.count = bytes / x.bytes();
    if (registered) x.sendId = x.recvId = 1;
    return x;
  };
  EXPECT_EQ(selected(s, call(Collective::Reduce, 64 << 10)), "reduce_ll");
  EXPECT_EQ(selected(s, call(Collective::Reduce, 32 << 20)), "reduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::Reduce, 64 << 20)), "reduce_chain");
  EXPECT_EQ(selected(s, call(Collective::Reduce, 64 << 20, true)), "reduce_direct");
  EXPECT_EQ(selected(s, call(Collective::Broadcast, 64 << 20, true)), "broadcast_scatter");
  EXPECT_EQ(selected(s, call(Collective::ReduceScatter, 64 << 10)), "reducescatter_ll");
  EXPECT_EQ(selected(s, call(Collective::ReduceScatter, 512 << 20)), "reducescatter_push");
  EXPECT_EQ(selected(s, call(Collective::ReduceScatter, 1ull << 30)), "reducescatter_ring");
  EXPECT_EQ(selected(s, call(Collective::ReduceScatter, 1ull << 30, true)), "reducescatter_direct");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 64 << 10)), "allreduce_ll");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 512 << 20)), "allreduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1ull << 30)), "allreduce_ring_pipelined");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1ull << 30, true)), "allreduce_direct");
  const CommLimits tiny{4, 1 << 20, 4 << 10};  // 1 KiB pieces: a million messages in a call
  EXPECT_EQ(selected(s, call(Collective::Reduce, 1ull << 30), tiny), "reduce_two_shot");
  EXPECT_EQ(selected(s, call(Collective::AllReduce, 1ull << 30), tiny), "allreduce_two_shot");
}

TEST(Selector, DirectBroadcastOffTheRootNeedsOnlyTheRecvRegistered) {
  const Selector s(defaultTuning());
  CollectiveCall call = callOfBytes(Collective::Broadcast, 16 << 20);  // above, 4 ranks scatter
  call.rank = 1;
  call.root = 0;
  call.send = nullptr;
  call.recvId = 3;
  EXPECT_EQ(selected(s, call), "broadcast_direct");
}

TEST(Selector, DirectReduceOffTheRootNeedsOnlyTheSendRegistered) {
  const Selector s(defaultTuning());
  CollectiveCall call = callOfBytes(Collective::Reduce, 64 << 20);
  call.rank = 1;
  call.root = 0;
  call.recv = nullptr;
  call.sendId = 3;
  EXPECT_TRUE(call.registered());
  EXPECT_EQ(selected(s, call), "reduce_direct");
  call.rank = 0;  // the root needs its recv registered too
  EXPECT_FALSE(call.registered());
  EXPECT_EQ(selected(s, call), "reduce_chain");
}

// CommOptions' bounds narrow every kernel's grid; where they conflict with an algorithm's own range,
// the maximum wins.
TEST(GridFor, StaysWithinTheCommsBlockBounds) {
  CollectiveContext c;
  EXPECT_EQ(gridFor(c, 1, 1, 1, 64), 1u);
  EXPECT_EQ(gridFor(c, 1000, 1, 1, 64), 64u);
  c.maxBlocks = 4;
  EXPECT_EQ(gridFor(c, 1000, 1, 1, 64), 4u);
  c.minBlocks = 3;
  EXPECT_EQ(gridFor(c, 1, 1, 1, 64), 3u);
  EXPECT_EQ(gridFor(c, 1, 1, 1, 2), 2u);  // the algorithm's own maximum wins over minBlocks
  c.minBlocks = 1;
  c.maxBlocks = 1;
  EXPECT_EQ(gridFor(c, 1000, 1, 1, 64), 1u);
}

// With fewer blocks allowed than they need, the copy-engine reductions are not chosen, and forcing
// one says why.
TEST(Selector, BlockBoundsRuleOutAlgorithmsThatNeedMoreBlocks) {
  CommLimits few = kLimits;
  few.maxBlocks = 8;
  CollectiveCall call = callOfBytes(Collective::AllReduce, 64 << 20);
  call.sendId = 1;
  call.recvId = 2;
  Selector s(defaultTuning());
  s.force(Collective::AllReduce, "allreduce_ce");
  EXPECT_NO_THROW(s.select(call, kLimits));
  EXPECT_CONTAINS(invalidUsageOf([&] { s.select(call, few); }), "it needs 17 thread blocks; the Comm allows 8");
  s.force(Collective::AllReduce, "");
  EXPECT_EQ(selected(s, call, few), "allreduce_direct");
}

TEST(Selector, DirectAllToAllRefusesInPlace) {
  Selector s(defaultTuning());
  CollectiveCall call = callOfBytes(Collective::AllToAll, 64 << 20);
  call.send = call.recv;
  call.sendId = call.recvId = 1;
  EXPECT_EQ(selected(s, call), "alltoall_push");
  s.force(Collective::AllToAll, "alltoall_direct");
  EXPECT_CONTAINS(invalidUsageOf([&] { s.select(call, kLimits); }), "in place");
}

// --- Registered ranges --------------------------------------------------------------------------

TEST(RegistrationRanges, FindsTheRegistrationHoldingAWholeRange) {
  RegistrationRanges r;
  auto* base = reinterpret_cast<char*>(0x10000);
  r.add(7, base, 1000, "rank 0: registerBuffer");
  r.add(8, base + 4096, 100, "rank 0: registerBuffer");
  EXPECT_EQ(r.find(base, 1000).id, 7u);
  EXPECT_EQ(r.find(base + 10, 990).offset, 10u);
  EXPECT_EQ(r.find(base + 10, 991).id, 0u);  // runs past the end
  EXPECT_EQ(r.find(base - 1, 10).id, 0u);    // starts before
  EXPECT_EQ(r.find(base + 4096 + 50, 50).id, 8u);
  EXPECT_EQ(r.find(base + 2000, 1).id, 0u);  // between the two
  EXPECT_EQ(r.find(nullptr, 1).id, 0u);
  EXPECT_TRUE(r.remove(7));
  EXPECT_FALSE(r.remove(7));
  EXPECT_EQ(r.find(base, 10).id, 0u);
  EXPECT_EQ(r.size(), 1u);
}

TEST(RegistrationRanges, OverlapIsInvalidUsageNamingBothRanges) {
  RegistrationRanges r;
  auto* base = reinterpret_cast<char*>(0x10000);
  r.add(1, base, 100, "rank 2: registerBuffer");
  for (auto [offset, bytes] : {std::pair{50, 100}, std::pair{-50, 100}, std::pair{10, 10}, std::pair{-10, 500}}) {
    const std::string msg = invalidUsageOf([&] { r.add(2, base + offset, bytes, "rank 2: registerBuffer"); });
    EXPECT_CONTAINS(msg, "rank 2: registerBuffer: [");
    EXPECT_CONTAINS(msg, "overlaps the buffer [0x10000, 0x10064)");
  }
  r.add(3, base + 100, 10, "rank 2: registerBuffer");  // adjacent is fine
  EXPECT_EQ(r.size(), 2u);
}

TEST(Selector, MaxBytesIsInclusive) {
  const Selector s(defaultTuning());
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, 256 << 10)), "allreduce_ll");
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, (256 << 10) + 4)), "allreduce_two_shot");
}

TEST(Selector, SkipsARowWhoseAlgorithmCannotRunTheCall) {
  const Selector s({{Collective::AllReduce, 0, kAny, "allreduce_ll"},
                    {Collective::AllReduce, 0, kAny, "allreduce_two_shot"}});
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, 1 << 20)), "allreduce_ll");
  // Above llSlotDataBytes LL cannot run, although its row covers the size.
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, 2 << 20)), "allreduce_two_shot");
}

// Accumulation::Float32: the tuning table's choice where it sums every element in one place
// (LL, two-shot, push, direct, copy engine); never a ring or chain, even where the table names one
// (1 GiB on 4 ranks); a ring forced is InvalidUsage naming the accumulation. Where the
// accumulation changes nothing (float32 data, a max) every algorithm stays open.
TEST(Selector, Float32AccumulationKeepsToTheAlgorithmsThatSumInOnePlace) {
  const Selector s(defaultTuning());
  std::set<std::string> wide;
  for (const Algorithm* a : allAlgorithms())
    if (a->sumsInFloat32()) wide.insert(a->name());
  EXPECT_EQ(wide, (std::set<std::string>{"allreduce_ll", "allreduce_two_shot", "allreduce_direct", "allreduce_ce",
                                         "reducescatter_ll", "reducescatter_push", "reducescatter_direct",
                                         "reducescatter_ce", "reduce_ll", "reduce_two_shot", "reduce_direct"}));
  for (DataType t : {DataType::BFloat16, DataType::Float16, DataType::Fp8E4M3, DataType::Fp8E5M2}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      SCOPED_TRACE(std::string(toString(t)) + " " + std::string(toString(op)));
      CollectiveCall call = callOf(Collective::ReduceScatter, 1);
      call.type = t;
      call.op = op;
      call.accumulation = Accumulation::Float32;
      EXPECT_TRUE(call.sumsInFloat32());
      call.count = (std::uint64_t{1} << 30) / sizeOf(t) / 4;  // 1 GiB in all: the table's ring row
      EXPECT_EQ(selected(s, call), "reducescatter_push");
      call.count = 1024;
      EXPECT_EQ(selected(s, call), "reducescatter_ll");
      call.count = (std::uint64_t{64} << 20) / sizeOf(t) / 4;
      call.sendId = call.recvId = 1;
      EXPECT_EQ(selected(s, call), "reducescatter_direct");
    }
  }
  // 1 GiB of bf16 on 4 ranks, where the table names a pipeline that passes partial sums on: the
  // table's next choice that sums in one place.
  for (auto [c, want] : {std::pair{Collective::AllReduce, "allreduce_two_shot"},
                         std::pair{Collective::Reduce, "reduce_two_shot"}}) {
    CollectiveCall call = callOf(c, (std::uint64_t{1} << 30) / 2);
    call.type = DataType::BFloat16;
    EXPECT_NE(selected(s, call), want);
    call.accumulation = Accumulation::Float32;
    EXPECT_EQ(selected(s, call), want) << toString(c);
  }
  CollectiveCall call = callOf(Collective::ReduceScatter, (std::uint64_t{1} << 30) / 2 / 4);
  call.type = DataType::BFloat16;
  Selector forced(defaultTuning());
  forced.force(Collective::ReduceScatter, "reducescatter_ring");
  EXPECT_EQ(selected(forced, call), "reducescatter_ring");  // stepwise: the ring runs it
  call.accumulation = Accumulation::Float32;
  const std::string msg = invalidUsageOf([&] { forced.select(call, kLimits); });
  EXPECT_CONTAINS(msg, "reducescatter_ring cannot run this call");
  EXPECT_CONTAINS(msg, "float32 accumulation (Accumulation::Float32)");
  // Nothing to widen: float32 data, or a max of bf16.
  call.type = DataType::Float32;
  call.count /= 2;
  EXPECT_FALSE(call.sumsInFloat32());
  EXPECT_EQ(selected(forced, call), "reducescatter_ring");
  call.type = DataType::BFloat16;
  call.op = ReduceOp::Max;
  EXPECT_FALSE(call.sumsInFloat32());
  EXPECT_EQ(selected(forced, call), "reducescatter_ring");
}

// The same shape with and without float32 accumulation is two shapes to the cache and to the
// ranks' start-word check (a rank that accumulates otherwise would round otherwise).
TEST(Selector, Float32AccumulationIsPartOfTheCallShape) {
  CollectiveCall call = callOf(Collective::ReduceScatter, (std::uint64_t{1} << 30) / 2 / 4);
  call.type = DataType::BFloat16;
  const std::uint64_t stepwise = callShape(call);
  call.accumulation = Accumulation::Float32;
  EXPECT_NE(callShape(call), stepwise);
  const Selector s(defaultTuning());
  SelectionCache cache;
  AlgorithmStates states;
  EXPECT_STREQ(cache.select(s, states, call, kLimits).algorithm->name(), "reducescatter_push");
  call.accumulation = Accumulation::Stepwise;
  EXPECT_STREQ(cache.select(s, states, call, kLimits).algorithm->name(), "reducescatter_ring");
}

TEST(Selector, RowsApplyOnlyToTheirWorldSize) {
  const Selector s({{Collective::AllReduce, 2, kAny, "allreduce_two_shot"},
                    {Collective::AllReduce, 0, kAny, "allreduce_ll"}});
  const CommLimits twoRanks{2, 1 << 20, 64 << 20};
  EXPECT_EQ(selected(s, callOf(Collective::AllReduce, 1024, 2), twoRanks), "allreduce_two_shot");
  EXPECT_EQ(selected(s, callOf(Collective::AllReduce, 1024, 4)), "allreduce_ll");
}

TEST(Selector, WorldSizeZeroMatchesAny) {
  const Selector s({{Collective::AllReduce, 0, kAny, "allreduce_two_shot"}});
  for (int ranks : {1, 2, 4, 8}) {
    const CommLimits limits{ranks, 1 << 20, 64 << 20};
    EXPECT_EQ(selected(s, callOf(Collective::AllReduce, 1024, ranks), limits), "allreduce_two_shot") << ranks;
  }
}

TEST(Selector, RowsNamingADataTypeApplyOnlyToIt) {
  TuningRow bf16Row{Collective::AllReduce, 0, kAny, "allreduce_two_shot"};
  bf16Row.type = DataType::BFloat16;
  const Selector s({bf16Row, {Collective::AllReduce, 0, kAny, "allreduce_ll"}});
  CollectiveCall call = callOf(Collective::AllReduce, 1024);
  call.type = DataType::BFloat16;
  EXPECT_EQ(selected(s, call), "allreduce_two_shot");
  call.type = DataType::Float32;
  EXPECT_EQ(selected(s, call), "allreduce_ll");
}

TEST(Selector, RowsNamingRegistrationApplyOnlyToCallsThatMatchIt) {
  TuningRow registeredRow{Collective::AllGather, 0, kAny, "allgather_push"};
  registeredRow.registered = true;
  TuningRow unregisteredRow{Collective::AllGather, 0, kAny, "allgather_ll"};
  unregisteredRow.registered = false;
  const Selector s({registeredRow, unregisteredRow});
  CollectiveCall call = callOf(Collective::AllGather, 1024);
  EXPECT_EQ(selected(s, call), "allgather_ll");
  call.sendId = 1;
  call.recvId = 2;
  EXPECT_EQ(selected(s, call), "allgather_push");
}

TEST(Selector, RowsNamingATopologyApplyOnlyOnIt) {
  TuningRow pcieRow{Collective::AllReduce, 0, kAny, "allreduce_ring"};
  pcieRow.fabric = Fabric::Pcie;
  const Selector s({pcieRow, {Collective::AllReduce, 0, kAny, "allreduce_two_shot"}});
  const CollectiveCall call = callOfBytes(Collective::AllReduce, 64 << 20);
  CommLimits limits = kLimits;
  for (Fabric f : {Fabric::Unknown, Fabric::NvLink, Fabric::NvSwitch}) {
    limits.fabric = f;
    EXPECT_EQ(selected(s, call, limits), "allreduce_two_shot") << toString(f);
  }
  limits.fabric = Fabric::Pcie;
  EXPECT_EQ(selected(s, call, limits), "allreduce_ring");
}

TEST(Fabric, OfAGpuFollowsItsLinks) {
  const NvlinkLink toSwitch{0, NvlinkRemote::Switch, ""}, toGpu{1, NvlinkRemote::Gpu, "0000:1b:00.0"};
  EXPECT_EQ(gpuFabric({}, false), Fabric::Unknown);
  EXPECT_EQ(gpuFabric({}, true), Fabric::Pcie);
  const NvlinkLink switches[] = {toSwitch, toSwitch};
  EXPECT_EQ(gpuFabric(switches, true), Fabric::NvSwitch);
  const NvlinkLink mixed[] = {toSwitch, toGpu};
  EXPECT_EQ(gpuFabric(mixed, true), Fabric::NvLink);
}

TEST(Fabric, OfACommIsItsSlowestRanks) {
  const Fabric same[] = {Fabric::NvSwitch, Fabric::NvSwitch};
  EXPECT_EQ(commFabric(same), Fabric::NvSwitch);
  const Fabric mixed[] = {Fabric::NvSwitch, Fabric::Pcie, Fabric::NvLink};
  EXPECT_EQ(commFabric(mixed), Fabric::Pcie);
  const Fabric unknown[] = {Fabric::NvSwitch, Fabric::Unknown};
  EXPECT_EQ(commFabric(unknown), Fabric::Unknown);
  for (Fabric f : {Fabric::Unknown, Fabric::Pcie, Fabric::NvLink, Fabric::NvSwitch})
    EXPECT_EQ(parseFabric(toString(f)), f);
  EXPECT_EQ(parseFabric("infiniband"), std::nullopt);
}

TEST(Selector, RowsOfOtherCollectivesDoNotApply) {
  const Selector s({{Collective::AllGather, 0, kAny, "allgather_push"}});
  // No row of allreduce: the first allreduce algorithm that can run it.
  EXPECT_EQ(selected(s, callOf(Collective::AllReduce, 1024)), "allreduce_ll");
  EXPECT_EQ(selected(s, callOf(Collective::AllGather, 1024)), "allgather_push");
}

TEST(Selector, WithoutRowsFallsBackToRegistryOrder) {
  const Selector s({});
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, 4 << 10)), "allreduce_ll");
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, 64 << 20)), "allreduce_two_shot");
}

TEST(Selector, NoAlgorithmCanRunSaysWhyForEach) {
  const Selector s(defaultTuning());
  const std::string msg = invalidUsageOf([&] {
    s.select(callOfBytes(Collective::AllReduce, 64 << 20), CommLimits{4, 1 << 10, 0});
  });
  EXPECT_CONTAINS(msg, "rank 0: allReduce");
  EXPECT_CONTAINS(msg, "no algorithm can run this call");
  EXPECT_CONTAINS(msg, "allreduce_ll: ");
  EXPECT_CONTAINS(msg, "allreduce_two_shot: ");
}

// --- Forcing ------------------------------------------------------------------------------------

TEST(SelectorForce, ForcedAlgorithmWinsOverTheTable) {
  Selector s(defaultTuning());
  s.force(Collective::AllReduce, "allreduce_two_shot");
  EXPECT_EQ(s.forced(Collective::AllReduce), "allreduce_two_shot");
  EXPECT_EQ(selected(s, callOf(Collective::AllReduce, 16)), "allreduce_two_shot");
  // Other collectives keep the table.
  EXPECT_EQ(s.forced(Collective::AllGather), "");
  EXPECT_EQ(selected(s, callOf(Collective::AllGather, 16)), "allgather_ll");
}

TEST(SelectorForce, EmptyNameGoesBackToTheTable) {
  Selector s(defaultTuning());
  s.force(Collective::AllReduce, "allreduce_two_shot");
  s.force(Collective::AllReduce, "");
  EXPECT_EQ(s.forced(Collective::AllReduce), "");
  EXPECT_EQ(selected(s, callOf(Collective::AllReduce, 16)), "allreduce_ll");
}

TEST(SelectorForce, UnknownNameIsInvalidUsage) {
  Selector s(defaultTuning());
  const std::string msg = invalidUsageOf([&] { s.force(Collective::AllReduce, "allreduce_bogus"); });
  EXPECT_CONTAINS(msg, "'allreduce_bogus'");
  EXPECT_CONTAINS(msg, "allreduce_ll");  // the known names of the collective are listed
  EXPECT_EQ(s.forced(Collective::AllReduce), "");
}

TEST(SelectorForce, NameOfAnotherCollectiveIsInvalidUsage) {
  Selector s(defaultTuning());
  const std::string msg = invalidUsageOf([&] { s.force(Collective::AllReduce, "allgather_ll"); });
  EXPECT_CONTAINS(msg, "'allgather_ll'");
  EXPECT_CONTAINS(msg, "not of allreduce");
  EXPECT_EQ(s.forced(Collective::AllReduce), "");
}

TEST(SelectorForce, ForcedAlgorithmThatCannotRunTheCallIsInvalidUsage) {
  Selector s(defaultTuning());
  s.force(Collective::AllReduce, "allreduce_ll");
  EXPECT_EQ(selected(s, callOfBytes(Collective::AllReduce, 1 << 20)), "allreduce_ll");
  // Never silently another algorithm: the caller asked for this one.
  const std::string msg =
      invalidUsageOf([&] { s.select(callOfBytes(Collective::AllReduce, 2 << 20), kLimits); });
  EXPECT_CONTAINS(msg, "rank 0: allReduce");
  EXPECT_CONTAINS(msg, "allreduce_ll cannot run this call");
  EXPECT_CONTAINS(msg, "exceed the LL slot");
}

TEST(SelectorForce, ZeroCopyAlgorithmOnUnregisteredBuffersIsInvalidUsage) {
  Selector s(defaultTuning());
  for (const char* name : {"allreduce_direct", "allreduce_ce"}) {
    SCOPED_TRACE(name);
    s.force(Collective::AllReduce, name);
    CollectiveCall call = callOfBytes(Collective::AllReduce, 1 << 20);
    const std::string msg = invalidUsageOf([&] { s.select(call, kLimits); });
    EXPECT_CONTAINS(msg, std::string(name) + " cannot run this call");
    EXPECT_CONTAINS(msg, "buffer is not registered (Comm::registerBuffer, on every rank)");
    call.sendId = call.recvId = 1;  // registered: the same call runs
    EXPECT_EQ(selected(s, call), name);
  }
}

// --- Tuning files -------------------------------------------------------------------------------

// One tuning row as JSON; each field is spliced in as written, so a test can make it malformed.
std::string row(const std::string& collective, const std::string& worldSize, const std::string& maxBytes,
                const std::string& algorithm) {
  return "{\"collective\": " + collective + ", \"world_size\": " + worldSize +
         ", \"max_bytes\": " + maxBytes + ", \"algorithm\": " + algorithm + "}";
}
std::string table(const std::string& rows) { return "{\"version\": 1, \"rows\": [" + rows + "]}"; }
const std::string kGoodRow = row("\"allreduce\"", "4", "65536", "\"allreduce_ll\"");

struct BadTuning {
  std::string name;
  std::string json;
  std::string field;  // what the message must name
};

class ParseTuningError : public ::testing::TestWithParam<BadTuning> {};

TEST_P(ParseTuningError, InvalidUsageNamingSourceAndField) {
  const BadTuning& p = GetParam();
  const std::string msg = invalidUsageOf([&] { parseTuning(p.json, "my_tuning.json"); });
  EXPECT_CONTAINS(msg, "my_tuning.json");
  EXPECT_CONTAINS(msg, p.field);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParseTuningError,
    ::testing::Values(
        BadTuning{"NotJson", "{\"version\": 1, ", "document: not JSON"},
        BadTuning{"NotAnObject", "[1, 2]", "document"},
        BadTuning{"MissingVersion", "{\"rows\": []}", "version"},
        BadTuning{"WrongVersion", "{\"version\": 2, \"rows\": []}", "version"},
        BadTuning{"MissingRows", "{\"version\": 1}", "rows"},
        BadTuning{"RowsNotAnArray", "{\"version\": 1, \"rows\": {}}", "rows"},
        BadTuning{"RowNotAnObject", table(kGoodRow + ", 7"), "rows[1]"},
        BadTuning{"MissingCollective", table("{\"max_bytes\": 1, \"algorithm\": \"allreduce_ll\"}"),
                  "rows[0].collective"},
        BadTuning{"UnknownCollective", table(row("\"allsum\"", "4", "1", "\"allreduce_ll\"")),
                  "rows[0].collective"},
        BadTuning{"UnknownAlgorithm",
                  table(kGoodRow + ", " + row("\"allreduce\"", "4", "1", "\"allreduce_fast\"")),
                  "rows[1].algorithm"},
        BadTuning{"AlgorithmOfAnotherCollective", table(row("\"allreduce\"", "4", "1", "\"allgather_ll\"")),
                  "rows[0].algorithm"},
        BadTuning{"AlgorithmNotAString", table(row("\"allreduce\"", "4", "1", "0")), "rows[0].algorithm"},
        BadTuning{"NegativeMaxBytes", table(row("\"allreduce\"", "4", "-1", "\"allreduce_ll\"")),
                  "rows[0].max_bytes"},
        BadTuning{"FractionalMaxBytes", table(row("\"allreduce\"", "4", "1.5", "\"allreduce_ll\"")),
                  "rows[0].max_bytes"},
        BadTuning{"MissingMaxBytes",
                  table("{\"collective\": \"allreduce\", \"algorithm\": \"allreduce_ll\"}"),
                  "rows[0].max_bytes"},
        BadTuning{"NegativeWorldSize", table(row("\"allreduce\"", "-1", "1", "\"allreduce_ll\"")),
                  "rows[0].world_size"},
        BadTuning{"WorldSizeAboveMaxRanks",
                  table(kGoodRow + ", " + row("\"allreduce\"", "9", "1", "\"allreduce_ll\"")),
                  "rows[1].world_size"},
        BadTuning{"WorldSizeNotANumber", table(row("\"allreduce\"", "\"4\"", "1", "\"allreduce_ll\"")),
                  "rows[0].world_size"}),
    [](const auto& info) { return info.param.name; });

TEST(ParseTuning, AcceptsOptionalWorldSizeAndCollectiveSpellings) {
  const auto rows = parseTuning(
      table("{\"collective\": \"All_Reduce\", \"max_bytes\": 100, \"algorithm\": \"allreduce_ll\"}, " +
            row("\"reducescatter\"", "8", "0", "\"reducescatter_push\"")),
      "inline");
  const std::vector<TuningRow> expected{{Collective::AllReduce, 0, 100, "allreduce_ll"},
                                        {Collective::ReduceScatter, 8, 0, "reducescatter_push"}};
  EXPECT_EQ(rows, expected);
  EXPECT_TRUE(parseTuning(table(""), "inline").empty());
}

TEST(ParseTuning, ReadsTheOptionalDataTypeAndRegistration) {
  const auto rows = parseTuning(table("{\"collective\": \"allreduce\", \"datatype\": \"bf16\", \"registered\": true, "
                                      "\"max_bytes\": 100, \"algorithm\": \"allreduce_ce\"}"),
                                "inline");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].type, DataType::BFloat16);
  EXPECT_EQ(rows[0].registered, true);
  EXPECT_CONTAINS(invalidUsageOf([] {
                    parseTuning(table("{\"collective\": \"allreduce\", \"datatype\": \"bf17\", \"max_bytes\": 1, "
                                      "\"algorithm\": \"allreduce_ll\"}"),
                                "inline");
                  }),
                  "rows[0].datatype");
  EXPECT_CONTAINS(invalidUsageOf([] {
                    parseTuning(table("{\"collective\": \"allreduce\", \"registered\": 1, \"max_bytes\": 1, "
                                      "\"algorithm\": \"allreduce_ll\"}"),
                                "inline");
                  }),
                  "rows[0].registered");
  const auto pcie =
      parseTuning(table("{\"collective\": \"allreduce\", \"topology\": \"pcie\", \"max_bytes\": 1, "
                        "\"algorithm\": \"allreduce_ll\"}"),
                  "inline");
  EXPECT_EQ(pcie.at(0).fabric, Fabric::Pcie);
  EXPECT_CONTAINS(invalidUsageOf([] {
                    parseTuning(
                        table("{\"collective\": \"allreduce\", \"topology\": \"unknown\", \"max_bytes\": 1, "
                              "\"algorithm\": \"allreduce_ll\"}"),
                        "inline");
                  }),
                  "rows[0].topology");
}

TEST(ParseTuning, RoundTripsThroughJson) {
  std::vector<TuningRow> rows = defaultTuning();
  TuningRow narrow{Collective::ReduceScatter, 4, 1 << 20, "reducescatter_ce"};
  narrow.type = DataType::Fp8E5M2;
  narrow.registered = false;
  narrow.fabric = Fabric::NvSwitch;
  rows.push_back(narrow);
  rows.insert(rows.begin(), {Collective::AllToAll, 4, 12345, "alltoall_push"});
  rows.insert(rows.begin(), {Collective::Broadcast, 8, 0, "broadcast_ll"});
  EXPECT_EQ(parseTuning(tuningToJson(rows), "round trip"), rows);
  EXPECT_TRUE(parseTuning(tuningToJson({}), "round trip").empty());
}

// A file in the temporary directory, removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("ferry_tuning_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json")) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(LoadTuningFile, ReadsWhatTuningToJsonWrote) {
  const std::vector<TuningRow> rows{{Collective::AllGather, 2, 4096, "allgather_ll"}};
  const TempFile file(tuningToJson(rows));
  EXPECT_EQ(loadTuningFile(file.path()), rows);
}

TEST(LoadTuningFile, MalformedFileIsNamedInTheError) {
  const TempFile file("{\"version\": 3, \"rows\": []}");
  const std::string msg = invalidUsageOf([&] { loadTuningFile(file.path()); });
  EXPECT_CONTAINS(msg, file.path());
  EXPECT_CONTAINS(msg, "version");
}

TEST(LoadTuningFile, MissingFileIsInvalidUsage) {
  const std::string path = "/nonexistent/ferry/tuning.json";
  const std::string msg = invalidUsageOf([&] { loadTuningFile(path); });
  EXPECT_CONTAINS(msg, path);
}

// --- FERRY_ALGO ---------------------------------------------------------------------------------

using Forced = std::array<std::string, kCollectiveCount>;

Forced forcedOnly(std::initializer_list<std::pair<Collective, std::string>> entries) {
  Forced out;
  for (const auto& [c, name] : entries) out[static_cast<int>(c)] = name;
  return out;
}

TEST(ParseForcedAlgorithms, BareNameImpliesItsCollective) {
  EXPECT_EQ(parseForcedAlgorithms("allreduce_ll"), forcedOnly({{Collective::AllReduce, "allreduce_ll"}}));
  EXPECT_EQ(parseForcedAlgorithms("allreduce_ll,broadcast_push"),
            forcedOnly({{Collective::AllReduce, "allreduce_ll"}, {Collective::Broadcast, "broadcast_push"}}));
}

TEST(ParseForcedAlgorithms, CollectiveEqualsName) {
  EXPECT_EQ(
      parseForcedAlgorithms("allreduce=allreduce_two_shot, allgather=allgather_ll"),
      forcedOnly({{Collective::AllReduce, "allreduce_two_shot"}, {Collective::AllGather, "allgather_ll"}}));
  EXPECT_EQ(parseForcedAlgorithms(" reduce_scatter = reducescatter_ll "),
            forcedOnly({{Collective::ReduceScatter, "reducescatter_ll"}}));
}

TEST(ParseForcedAlgorithms, EmptyForcesNothing) {
  EXPECT_EQ(parseForcedAlgorithms(""), Forced{});
  EXPECT_EQ(parseForcedAlgorithms(" , ,"), Forced{});
}

TEST(ParseForcedAlgorithms, UnknownNameIsInvalidUsage) {
  std::string msg = invalidUsageOf([] { parseForcedAlgorithms("allreduce_ll,allgather_fast"); });
  EXPECT_CONTAINS(msg, "FERRY_ALGO");
  EXPECT_CONTAINS(msg, "'allgather_fast'");
  msg = invalidUsageOf([] { parseForcedAlgorithms("allgather=allreduce_ll"); });
  EXPECT_CONTAINS(msg, "'allreduce_ll'");
  EXPECT_CONTAINS(msg, "not of allgather");
}

TEST(ParseForcedAlgorithms, UnknownCollectiveIsInvalidUsage) {
  const std::string msg = invalidUsageOf([] { parseForcedAlgorithms("allsum=allreduce_ll"); });
  EXPECT_CONTAINS(msg, "FERRY_ALGO");
  EXPECT_CONTAINS(msg, "'allsum'");
}

}  // namespace
}  // namespace ferry
