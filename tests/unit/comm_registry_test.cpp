// A Comm's algorithm registry and the selection cache, without a GPU: adding, removing and forcing
// algorithms at run time changes what the selector picks, for this Selector only; the cache answers
// exactly as the selector does and forgets when the registry changes; plans made from JSON
// describe themselves.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "comm/native_algorithm.hpp"
#include "comm/selector.hpp"
#include "executor/plan_algorithm.hpp"
#include "ferry/algorithm.hpp"
#include "ferry/errors.hpp"
#include "unit/expect_contains.hpp"
#include "unit/invalid_usage.hpp"

namespace ferry {
namespace {

const CommLimits kLimits{4, 1 << 20, 64 << 20};

CollectiveCall allReduceOf(std::size_t count, DataType type = DataType::Float32) {
  CollectiveCall call;
  call.collective = Collective::AllReduce;
  call.count = count;
  call.type = type;
  call.worldSize = 4;
  call.send = reinterpret_cast<const void*>(0x10000);
  call.recv = reinterpret_cast<void*>(0x80000000);
  return call;
}

// A user's algorithm that runs float32 calls up to `limit` bytes and counts how often it is asked.
class Probe final : public NativeAlgorithm {
 public:
  Probe(std::string name, std::size_t limit) : name_(std::move(name)), limit_(limit) {}
  std::string name() const override { return name_; }
  Collective collective() const override { return Collective::AllReduce; }
  std::string whyNot(const CollectiveArgs& c) const override {
    ++asked;
    if (c.type != DataType::Float32) return "float32 only";
    return c.bytes <= limit_ ? "" : "too large";
  }
  void launch(const CollectiveArgs&) override {}
  mutable int asked = 0;

 private:
  std::string name_;
  std::size_t limit_;
};

std::shared_ptr<NativeAlgorithmAdapter> adapted(std::shared_ptr<Probe> p) {
  return std::make_shared<NativeAlgorithmAdapter>(std::move(p));
}

using ::ferry::testing::invalidUsageOf;

// The cache's answer. No state is reserved: these tests select, they launch nothing.
const Algorithm& chosen(SelectionCache& cache, const Selector& s, const CollectiveCall& call) {
  static const AlgorithmStates none;
  return *cache.select(s, none, call, kLimits).algorithm;
}

// A built-in-style algorithm that runs any allReduce, on at most two ranks.
class TwoRanksOnly final : public Algorithm {
 public:
  const char* name() const override { return "two_ranks_only"; }
  Collective collective() const override { return Collective::AllReduce; }
  std::string whyNot(const CollectiveCall&, const CommLimits&) const override { return {}; }
  void launch(const CollectiveCall&, const CollectiveContext&, void*) const override {}
  int maxRanks() const override { return 2; }
};

TEST(CommRegistry, AddedAlgorithmsComeBeforeTheTableNewestFirst) {
  Selector s(defaultTuning());
  const std::string before = s.select(allReduceOf(1024), kLimits).name();
  auto older = adapted(std::make_shared<Probe>("older", 1 << 20));
  auto newer = adapted(std::make_shared<Probe>("newer", 8 << 10));
  s.add(older.get(), AlgorithmKind::Native, older);
  s.add(newer.get(), AlgorithmKind::Native, newer);
  EXPECT_EQ(std::string(s.select(allReduceOf(1024), kLimits).name()), "newer");
  EXPECT_EQ(std::string(s.select(allReduceOf(64 << 10), kLimits).name()), "older");  // newer: too large
  EXPECT_EQ(std::string(s.select(allReduceOf(1024, DataType::Int32), kLimits).name()),
            std::string(Selector(defaultTuning()).select(allReduceOf(1024, DataType::Int32), kLimits).name()));
  s.remove("newer");
  s.remove("older");
  EXPECT_EQ(std::string(s.select(allReduceOf(1024), kLimits).name()), before);
}

TEST(CommRegistry, NamesAreUniqueAndRemovingTheUnknownIsAnError) {
  Selector s(defaultTuning());
  auto a = adapted(std::make_shared<Probe>("mine", 1));
  s.add(a.get(), AlgorithmKind::Native, a);
  auto again = adapted(std::make_shared<Probe>("mine", 1));
  EXPECT_CONTAINS(invalidUsageOf([&] { s.add(again.get(), AlgorithmKind::Native, again); }), "already registered");
  auto clash = adapted(std::make_shared<Probe>("allreduce_ll", 1));
  EXPECT_CONTAINS(invalidUsageOf([&] { s.add(clash.get(), AlgorithmKind::Native, clash); }), "'allreduce_ll'");
  EXPECT_CONTAINS(invalidUsageOf([&] { s.remove("nothing_of_that_name"); }), "nothing_of_that_name");
  EXPECT_CONTAINS(invalidUsageOf([&] { adapted(std::make_shared<Probe>("plan:fake", 1)); }), "plan:");
  EXPECT_CONTAINS(invalidUsageOf([&] { NativeAlgorithmAdapter(nullptr); }), "null");
}

TEST(CommRegistry, RemovingAForcedAlgorithmUnforcesIt) {
  Selector s(defaultTuning());
  auto a = adapted(std::make_shared<Probe>("mine", 1 << 20));
  s.add(a.get(), AlgorithmKind::Native, a);
  s.force(Collective::AllReduce, "mine");
  EXPECT_EQ(s.forced(Collective::AllReduce), "mine");
  const auto removed = s.remove("mine");
  EXPECT_EQ(removed.owner, a);  // handed back, for the Comm to keep while queued work may use it
  EXPECT_EQ(s.forced(Collective::AllReduce), "");
  EXPECT_CONTAINS(invalidUsageOf([&] { s.force(Collective::AllReduce, "mine"); }), "'mine'");
}

TEST(CommRegistry, BuiltinAlgorithmsCanBeRemovedFromOneSelectorOnly) {
  Selector s(defaultTuning()), other(defaultTuning());
  s.remove("allreduce_ll");
  EXPECT_NE(std::string(s.select(allReduceOf(16), kLimits).name()), "allreduce_ll");
  EXPECT_EQ(std::string(other.select(allReduceOf(16), kLimits).name()), "allreduce_ll");
}

TEST(CommRegistry, AnAlgorithmRunsOnlyUpToItsRankLimit) {
  Selector s(defaultTuning());
  TwoRanksOnly mine;
  s.add(&mine, AlgorithmKind::Native, nullptr);
  EXPECT_NE(std::string(s.select(allReduceOf(16), kLimits).name()), "two_ranks_only") << "4 ranks";
  CommLimits two = kLimits;
  two.worldSize = 2;
  CollectiveCall call = allReduceOf(16);
  call.worldSize = 2;
  EXPECT_EQ(std::string(s.select(call, two).name()), "two_ranks_only");
  s.force(Collective::AllReduce, "two_ranks_only");
  EXPECT_CONTAINS(invalidUsageOf([&] { s.select(allReduceOf(16), kLimits); }), "runs on up to 2 ranks, not 4");
}

TEST(SelectionCache, AnswersAsTheSelectorWithoutAskingAgain) {
  Selector s(defaultTuning());
  auto probe = std::make_shared<Probe>("probe", 8 << 10);
  auto a = adapted(probe);
  s.add(a.get(), AlgorithmKind::Native, a);
  SelectionCache cache;
  for (std::size_t count : {16ul, 100ul, 1000ul, 4000ul, 1ul << 20, 1ul << 24}) {
    for (DataType t : {DataType::Float32, DataType::BFloat16, DataType::Int64}) {
      const CollectiveCall call = allReduceOf(count, t);
      const Algorithm& want = s.select(call, kLimits);
      EXPECT_EQ(&chosen(cache, s, call), &want) << count << " " << toString(t);
      const int asked = probe->asked;
      EXPECT_EQ(&chosen(cache, s, call), &want);
      EXPECT_EQ(probe->asked, asked) << "the second call of a shape must come from the cache";
    }
  }
}

TEST(SelectionCache, ForgetsWhenTheRegistryOrTheForcingChanges) {
  Selector s(defaultTuning());
  SelectionCache cache;
  const CollectiveCall call = allReduceOf(1024);
  const std::string builtin = chosen(cache, s, call).name();
  auto a = adapted(std::make_shared<Probe>("mine", 1 << 20));
  s.add(a.get(), AlgorithmKind::Native, a);
  EXPECT_EQ(std::string(chosen(cache, s, call).name()), "mine");
  s.force(Collective::AllReduce, "allreduce_two_shot");
  EXPECT_EQ(std::string(chosen(cache, s, call).name()), "allreduce_two_shot");
  s.force(Collective::AllReduce, "");
  s.remove("mine");
  EXPECT_EQ(chosen(cache, s, call).name(), builtin);
}

TEST(SelectionCache, ShapesThatDifferOnlyInRegistrationOrPlacementAreKeptApart) {
  Selector s(defaultTuning());
  SelectionCache cache;
  CollectiveCall plain = allReduceOf(1 << 20);
  CollectiveCall registered = plain;
  registered.sendId = registered.recvId = 1;
  CollectiveCall inPlace = plain;
  inPlace.recv = const_cast<void*>(inPlace.send);
  for (const CollectiveCall* c : {&plain, &registered, &inPlace, &registered, &plain})
    EXPECT_EQ(&chosen(cache, s, *c), &s.select(*c, kLimits));
}

TEST(SelectionCache, ErrorsAreNotRemembered) {
  Selector s(defaultTuning());
  s.force(Collective::AllReduce, "allreduce_ll");
  SelectionCache cache;
  const CollectiveCall big = allReduceOf(1 << 20);
  EXPECT_CONTAINS(invalidUsageOf([&] { chosen(cache, s, big); }), "cannot run this call");
  EXPECT_CONTAINS(invalidUsageOf([&] { chosen(cache, s, big); }), "cannot run this call");
}

// allgather_allpairs for 2 ranks (python -m ferry.dsl compile), renamed, with a smaller range.
constexpr const char* kPlanJson = R"({"format": "ferry-plan", "version": 1, "name": "tiny_allgather", "collective": "allgather", "protocol": "Simple", "inplace": false, "world_size": 2, "chunks": {"input": 1, "output": 2, "scratch": 0}, "min_bytes": 0, "max_bytes": 1048576, "ranks": [
  {"rank": 0, "channels": [{"type": "memory", "peer": 1}, {"type": "memory", "peer": 1}], "thread_blocks": [{"id": 0, "ops": [{"op": "copy", "src": {"buffer": "input", "index": 0, "count": 1}, "dst": {"buffer": "output", "index": 0, "count": 1}}, {"op": "put", "channel": 0, "src": {"buffer": "input", "index": 0, "count": 1}, "dst": {"buffer": "output", "index": 0, "count": 1}}, {"op": "signal", "channel": 0}, {"op": "wait", "channel": 1}]}]},
  {"rank": 1, "channels": [{"type": "memory", "peer": 0}, {"type": "memory", "peer": 0}], "thread_blocks": [{"id": 0, "ops": [{"op": "copy", "src": {"buffer": "input", "index": 0, "count": 1}, "dst": {"buffer": "output", "index": 1, "count": 1}}, {"op": "put", "channel": 1, "src": {"buffer": "input", "index": 0, "count": 1}, "dst": {"buffer": "output", "index": 1, "count": 1}}, {"op": "signal", "channel": 1}, {"op": "wait", "channel": 0}]}]}
]})";

TEST(PlanObject, FromJsonDescribesItselfAndRefusesBadPlans) {
  const Plan plan = Plan::fromJson(kPlanJson, "the test's plan");
  EXPECT_EQ(plan.name(), "tiny_allgather");
  EXPECT_EQ(plan.algorithmName(), "plan:tiny_allgather");
  EXPECT_EQ(plan.collective(), Collective::AllGather);
  EXPECT_EQ(plan.worldSize(), 2);
  EXPECT_FALSE(plan.inPlace());
  EXPECT_EQ(plan.maxBytes(), 1048576u);
  const auto& algorithm = executor::algorithmOf(plan);
  EXPECT_CONTAINS(algorithm.constraints(CommLimits{2, 1 << 20, 64 << 20}), "2 ranks");
  // Copies share the compiled program.
  const Plan copy = plan;
  EXPECT_EQ(&executor::algorithmOf(copy), &algorithm);
  EXPECT_CONTAINS(invalidUsageOf([] { Plan::fromJson("{", "a broken string"); }), "a broken string");
  EXPECT_CONTAINS(invalidUsageOf([] { Plan::fromFile("/nonexistent/plan.json"); }), "/nonexistent/plan.json");
}

TEST(PlanObject, AddedToASelectorItIsPreferredWhereItCanRun) {
  const Plan plan = Plan::fromJson(kPlanJson);
  Selector s(defaultTuning());
  s.add(&executor::algorithmOf(plan), AlgorithmKind::Plan, plan.impl());
  CollectiveCall call;
  call.collective = Collective::AllGather;
  call.count = 256;
  call.worldSize = 2;
  call.send = reinterpret_cast<const void*>(0x10000);
  call.recv = reinterpret_cast<void*>(0x80000000);
  const CommLimits two{2, 1 << 20, 64 << 20};
  EXPECT_EQ(std::string(s.select(call, two).name()), "plan:tiny_allgather");
  call.count = 1 << 20;  // 4 MiB per rank: outside the plan's range
  EXPECT_NE(std::string(s.select(call, two).name()), "plan:tiny_allgather");
}

// AlgorithmInfo::reducesInRankOrder, which checks use to pick exact or tolerant float compares.
class InOrder final : public NativeAlgorithm {
 public:
  std::string name() const override { return "in_order"; }
  Collective collective() const override { return Collective::AllReduce; }
  void launch(const CollectiveArgs&) override {}
  bool reducesInRankOrder() const override { return true; }
};

TEST(CommRegistry, RingsPlansAndUnknownUserAlgorithmsReduceInAnotherOrder) {
  Selector s(defaultTuning());
  const Algorithm* ring = nullptr;
  const Algorithm* twoShot = nullptr;
  for (const auto& e : s.registry().entries()) {
    if (std::string(e.algorithm->name()) == "allreduce_ring") ring = e.algorithm;
    if (std::string(e.algorithm->name()) == "allreduce_two_shot") twoShot = e.algorithm;
  }
  ASSERT_NE(ring, nullptr);
  ASSERT_NE(twoShot, nullptr);
  EXPECT_FALSE(ring->reducesInRankOrder());  // each chunk's sum starts at its own rank
  EXPECT_TRUE(twoShot->reducesInRankOrder());
  EXPECT_FALSE(executor::algorithmOf(Plan::fromJson(kPlanJson)).reducesInRankOrder());
  EXPECT_FALSE(adapted(std::make_shared<Probe>("p", 1))->reducesInRankOrder());  // unless it says so
  EXPECT_TRUE(NativeAlgorithmAdapter(std::make_shared<InOrder>()).reducesInRankOrder());
}

// The chain algorithms' pieces: a 32nd of the message (the rings: of one chunk), at least
// 256 KiB, at most a quarter of the scratch half; fewer than 2^17 messages (the round field of a
// signal).
TEST(CommRegistry, ChainAlgorithmsNeedTwoRanksAndScratchForTheirPieces) {
  Selector s(defaultTuning());
  for (const Collective collective :
       {Collective::Reduce, Collective::Broadcast, Collective::ReduceScatter, Collective::AllReduce}) {
    const std::string name = collective == Collective::Reduce          ? "reduce_chain"
                             : collective == Collective::Broadcast     ? "broadcast_chain"
                             : collective == Collective::ReduceScatter ? "reducescatter_ring"
                                                                       : "allreduce_ring_pipelined";
    const Algorithm* chain = nullptr;
    for (const auto& e : s.registry().entries())
      if (e.algorithm->name() == name) chain = e.algorithm;
    ASSERT_NE(chain, nullptr) << name;
    EXPECT_EQ(chain->collective(), collective);
    CollectiveCall call;
    call.collective = collective;
    call.type = DataType::Float32;
    call.count = 1 << 28;  // 1 GiB (the ring's output: its pieces cut that)
    EXPECT_EQ(chain->whyNot(call, CommLimits{4, 1 << 20, 64 << 20}), "") << name;
    EXPECT_NE(chain->whyNot(call, CommLimits{1, 1 << 20, 64 << 20}), "") << name;
    EXPECT_NE(chain->whyNot(call, CommLimits{4, 1 << 20, 32}), "") << name;  // no 16-byte piece fits
    call.count = 1ull << 40;                                                  // 4 TiB in 16 MiB pieces
    EXPECT_NE(chain->whyNot(call, CommLimits{4, 1 << 20, 64 << 20}), "") << name;
  }
  for (const auto& e : s.registry().entries()) {
    const std::string name = e.algorithm->name();
    if (name == "reduce_chain" || name == "reducescatter_ring" || name == "allreduce_ring_pipelined") {
      EXPECT_FALSE(e.algorithm->reducesInRankOrder()) << name;  // in chain order
    }
  }
}

}  // namespace
}  // namespace ferry
