// The executor's host side, without a GPU: flattening a plan for one rank (flag rows, sequence
// numbers, peers, direct mode), the executor's own rules, where chunks lie for odd counts, plans as
// algorithms (whyNot, loading FERRY_PLAN_DIR, the selector trying plans first), and (CompiledPlans)
// that every shipped program compiles for every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "kernels/device_context.hpp"
#include "comm/selector.hpp"
#include "executor/plan_algorithm.hpp"
#include "executor/rank_program.hpp"
#include "expect_contains.hpp"
#include "invalid_usage.hpp"
#include "ferry/errors.hpp"

namespace ferry::executor {
namespace {

using Json = nlohmann::ordered_json;

Json ref(const char* buffer, int index, int count = 1) {
  return {{"buffer", buffer}, {"index", index}, {"count", count}};
}

// Two ranks, allreduce in two shots: rank r puts the peer's half into the peer's scratch (channel
// 0), reduces its own half, and puts it into the peer's output (channel 1).
Json twoShot() {
  Json ranks = Json::array();
  for (int r = 0; r < 2; ++r) {
    const int p = 1 - r;
    Json ops = Json::array();
    ops.push_back({{"op", "put"}, {"channel", 0}, {"src", ref("input", p)}, {"dst", ref("scratch", 0)}});
    ops.push_back({{"op", "signal"}, {"channel", 0}});
    ops.push_back({{"op", "wait"}, {"channel", 0}});
    ops.push_back({{"op", "reduce"}, {"srcs", {ref("input", r), ref("scratch", 0)}}, {"dst", ref("output", r)}});
    ops.push_back({{"op", "put"}, {"channel", 1}, {"src", ref("output", r)}, {"dst", ref("output", r)}});
    ops.push_back({{"op", "signal"}, {"channel", 1}});
    ops.push_back({{"op", "wait"}, {"channel", 1}});
    ranks.push_back({{"rank", r},
                     {"channels", {{{"type", "memory"}, {"peer", p}}, {{"type", "memory"}, {"peer", p}}}},
                     {"thread_blocks", {{{"id", 0}, {"ops", ops}}}}});
  }
  return {{"format", "ferry-plan"}, {"version", 1},     {"name", "two"},       {"collective", "allreduce"},
          {"protocol", "Simple"},   {"inplace", false}, {"world_size", 2},     {"chunks", {{"input", 2}, {"output", 2}, {"scratch", 1}}},
          {"min_bytes", 0},         {"max_bytes", 1 << 20}, {"ranks", ranks}};
}

// Two ranks, allreduce with LL packets: each sends its input to the peer's scratch chunk 0.
Json packets() {
  Json ranks = Json::array();
  for (int r = 0; r < 2; ++r) {
    Json ops = Json::array();
    ops.push_back({{"op", "put_packets"}, {"channel", 0}, {"src", ref("input", 0)}, {"dst", ref("scratch", 0)}});
    ops.push_back({{"op", "copy"}, {"src", ref("input", 0)}, {"dst", ref("output", 0)}});
    ops.push_back({{"op", "reduce_packets"}, {"src", ref("scratch", 0)}, {"dst", ref("output", 0)}});
    ranks.push_back({{"rank", r},
                     {"channels", {{{"type", "memory"}, {"peer", 1 - r}}}},
                     {"thread_blocks", {{{"id", 0}, {"ops", ops}}}}});
  }
  return {{"format", "ferry-plan"}, {"version", 1},     {"name", "pk"},        {"collective", "allreduce"},
          {"protocol", "LL"},       {"inplace", false}, {"world_size", 2},     {"chunks", {{"input", 1}, {"output", 1}, {"scratch", 1}}},
          {"min_bytes", 0},         {"max_bytes", 1 << 16}, {"ranks", ranks}};
}

// Two ranks, broadcast from rank 0: the root copies its input to its output and puts that into
// rank 1's output.
Json broadcast() {
  Json ranks = Json::array();
  Json rootOps = Json::array();
  rootOps.push_back({{"op", "copy"}, {"src", ref("input", 0)}, {"dst", ref("output", 0)}});
  rootOps.push_back({{"op", "put"}, {"channel", 0}, {"src", ref("output", 0)}, {"dst", ref("output", 0)}});
  rootOps.push_back({{"op", "signal"}, {"channel", 0}});
  Json leafOps = Json::array();
  leafOps.push_back({{"op", "wait"}, {"channel", 0}});
  for (int r = 0; r < 2; ++r)
    ranks.push_back({{"rank", r},
                     {"channels", {{{"type", "memory"}, {"peer", 1 - r}}}},
                     {"thread_blocks", {{{"id", 0}, {"ops", r == 0 ? rootOps : leafOps}}}}});
  return {{"format", "ferry-plan"}, {"version", 1},      {"name", "bc"},   {"collective", "broadcast"},
          {"protocol", "Simple"},   {"inplace", false},  {"world_size", 2}, {"root", 0},
          {"chunks", {{"input", 1}, {"output", 1}, {"scratch", 0}}},        {"min_bytes", 0},
          {"max_bytes", 1 << 20},   {"ranks", ranks}};
}

// The message of the InvalidUsage error `f` throws; a test failure (and "") for anything else.
using ::ferry::testing::invalidUsageOf;

Json& opOf(Json& plan, int rank, int tb, int op) { return plan["ranks"][rank]["thread_blocks"][tb]["ops"][op]; }

std::string refusal(const Json& plan, int rank) {
  try {
    compileRankProgram(loadPlan(plan.dump()), rank);
  } catch (const PlanError& e) {
    return e.what();
  }
  ADD_FAILURE() << "the executor took the plan";
  return {};
}

TEST(RankProgram, FlagRowsSequencesAndPeers) {
  const RankProgram p = compileRankProgram(loadPlan(twoShot().dump()), 1);
  ASSERT_EQ(p.threadBlocks(), 1);
  ASSERT_EQ(p.ops.size(), 7u);
  EXPECT_EQ(p.ops[0].dst.rank, 0);  // put: into rank 0's scratch
  EXPECT_EQ(p.ops[0].src.rank, kLocal);
  EXPECT_EQ(p.ops[1].slot, 1);  // first memory channel to rank 0: row 1
  EXPECT_EQ(p.ops[1].seq, 1u);
  EXPECT_EQ(p.ops[5].slot, 3);  // second memory channel to rank 0: row 3
  EXPECT_EQ(p.ops[2].peer, 0);
  EXPECT_EQ(p.ops[3].nsrcs, 2);
  EXPECT_EQ(p.refs[p.ops[3].firstRef + 1].buffer, static_cast<std::int8_t>(BufferKind::Scratch));
  EXPECT_TRUE(p.touchesPeerBuffers);  // the put into rank 0's output
}

std::vector<RankProgram> programsOf(const Json& plan) {
  const Plan p = loadPlan(plan.dump());
  std::vector<RankProgram> out;
  for (int r = 0; r < p.worldSize; ++r) out.push_back(compileRankProgram(p, r));
  return out;
}

// The end-of-call exchange is left out only where the plan's own signals keep each rank in the call
// until its peers are done with its buffers.
TEST(RankProgram, PeersWaitOutAccessesOnlyWhenEveryAccessIsSignalledAndWaitedFor) {
  EXPECT_TRUE(peersWaitOutAccesses(programsOf(twoShot())));
  Json noWait = twoShot();  // rank 1 never waits for rank 0's last signal
  noWait["ranks"][1]["thread_blocks"][0]["ops"].erase(6);
  EXPECT_FALSE(peersWaitOutAccesses(programsOf(noWait)));
  Json signalFirst = twoShot();  // rank 0 signals before its put into rank 1's output
  std::swap(opOf(signalFirst, 0, 0, 4), opOf(signalFirst, 0, 0, 5));
  EXPECT_FALSE(peersWaitOutAccesses(programsOf(signalFirst)));
  Json otherChannel = twoShot();  // rank 0's last signal goes to the channel rank 1 waited on before
  opOf(otherChannel, 0, 0, 5)["channel"] = 0;
  EXPECT_FALSE(peersWaitOutAccesses(programsOf(otherChannel)));
  EXPECT_TRUE(peersWaitOutAccesses(programsOf(packets())));  // nothing of a peer's but scratch
}

// A port-channel put is done only once a port channel's signal or flush has flushed the channel:
// a memory channel's signal after it does not cover it.
TEST(RankProgram, PortPutsAreCoveredOnlyAfterAPortFlush) {
  Json port = twoShot();
  for (int r = 0; r < 2; ++r) port["ranks"][r]["channels"][1]["type"] = "port";
  EXPECT_TRUE(peersWaitOutAccesses(programsOf(port)));  // put, then the port channel's signal
  Json memorySignal = port;  // rank 0 signals the memory channel after its port put instead
  opOf(memorySignal, 0, 0, 5)["channel"] = 0;
  memorySignal["ranks"][1]["thread_blocks"][0]["ops"].push_back({{"op", "wait"}, {"channel", 0}});
  EXPECT_FALSE(peersWaitOutAccesses(programsOf(memorySignal)));
  Json flushed = memorySignal;  // ... after a flush of the port channel
  auto& ops = flushed["ranks"][0]["thread_blocks"][0]["ops"];
  ops.insert(ops.begin() + 5, Json{{"op", "flush"}, {"channel", 1}});
  EXPECT_TRUE(peersWaitOutAccesses(programsOf(flushed)));
}

TEST(RankProgram, SecondSignalOnAChannelCountsOn) {
  Json plan = twoShot();
  auto& ops = plan["ranks"][0]["thread_blocks"][0]["ops"];
  ops.push_back({{"op", "signal"}, {"channel", 0}});
  const RankProgram p = compileRankProgram(loadPlan(plan.dump()), 0);
  EXPECT_EQ(p.ops.back().seq, 2u);
  EXPECT_EQ(p.ops.back().slot, p.ops[1].slot);
}

TEST(RankProgram, PortChannelsGetTheirOwnRows) {
  Json plan = twoShot();
  for (int r = 0; r < 2; ++r) plan["ranks"][r]["channels"][1]["type"] = "port";
  const RankProgram p = compileRankProgram(loadPlan(plan.dump()), 0);
  EXPECT_EQ(p.ops[1].slot, 1);  // memory, first
  EXPECT_EQ(p.ops[5].slot, 2);  // port, first
}

TEST(RankProgram, PortChannelOpsGoThroughTheProxy) {
  Json plan = twoShot();
  const RankProgram memoryOnly = compileRankProgram(loadPlan(plan.dump()), 0);
  EXPECT_FALSE(memoryOnly.usesPortChannels);
  for (int r = 0; r < 2; ++r) plan["ranks"][r]["channels"][1]["type"] = "port";
  const RankProgram p = compileRankProgram(loadPlan(plan.dump()), 0);
  EXPECT_TRUE(p.usesPortChannels);
  EXPECT_EQ(p.ops[0].proxy, 0);  // put, memory channel
  EXPECT_EQ(p.ops[4].proxy, 1);  // put, port channel
  EXPECT_EQ(p.ops[5].proxy, 1);  // its signal: after the put has landed
  EXPECT_EQ(p.ops[6].proxy, 0);  // a wait is the same on every channel
}

TEST(RankProgram, OneThreadBlockPerChannelEnd) {
  Json plan = twoShot();
  plan["ranks"][0]["thread_blocks"].push_back({{"id", 1}, {"ops", {{{"op", "signal"}, {"channel", 0}}}}});
  const std::string why = refusal(plan, 0);
  EXPECT_CONTAINS(why, "ranks[0].thread_blocks[1].ops[0]");
  EXPECT_CONTAINS(why, "thread block 0 also signals");
}

TEST(RankProgram, SwitchChannelsAreNeverRun) {
  Json plan = twoShot();
  for (int r = 0; r < 2; ++r) plan["ranks"][r]["channels"].push_back({{"type", "switch"}, {"peer", 1 - r}});
  EXPECT_CONTAINS(refusal(plan, 0), "switch channel");
}

// The kernel stores a send through the peer's mapping, which a port channel's peer may not have.
TEST(RankProgram, SendsGoOnMemoryChannelsOnly) {
  Json plan = twoShot();
  for (int r = 0; r < 2; ++r) {
    plan["ranks"][r]["channels"][1]["type"] = "port";
    Json& ops = plan["ranks"][r]["thread_blocks"][0]["ops"];
    ops[3] = {{"op", "read_reduce_copy_send"},
              {"srcs", {ref("input", r), ref("scratch", 0)}},
              {"dst", ref("output", r)},
              {"sends", {{{"channel", 1}, {"dst", ref("output", r)}}}}};
    ops.erase(4);  // the put the send replaces
  }
  const std::string why = refusal(plan, 0);
  EXPECT_CONTAINS(why, "ranks[0].thread_blocks[0].ops[3].sends");
  EXPECT_CONTAINS(why, "port channel");
}

TEST(RankProgram, LLScratchHoldsPacketsOnly) {
  Json plan = packets();
  opOf(plan, 0, 0, 1)["src"] = ref("scratch", 0);
  EXPECT_CONTAINS(refusal(plan, 0), "holds packets only");
}

TEST(RankProgram, PacketsIntoAChunkOncePerCall) {
  Json plan = packets();
  auto& ops = plan["ranks"][1]["thread_blocks"][0]["ops"];
  ops.push_back(ops[0]);
  const std::string why = refusal(plan, 0);  // every rank refuses, not only the senders
  EXPECT_CONTAINS(why, "scratch chunk 0 of rank 0 receives packets more than once");
}

TEST(RankProgram, PacketReaderKnowsTheSender) {
  const RankProgram p = compileRankProgram(loadPlan(packets().dump()), 0);
  EXPECT_EQ(p.ops[2].peer, 1);
  EXPECT_FALSE(p.touchesPeerBuffers);  // packets go to the peer's scratch only
}

TEST(RankProgram, NoPacketsInASimplePlan) {
  Json plan = packets();
  plan["protocol"] = "Simple";
  EXPECT_CONTAINS(refusal(plan, 0), "packet op in a Simple-protocol plan");
}

// One lane per 256 KiB of the call (8 KiB for LL plans), within FERRY_PLAN_LANES, the Comm's blocks (for
// the rank with the most thread blocks) and kMaxLanes; plans whose port channels go through the proxy
// run as written, those whose port channels run as memory channels in lanes.
// R ranks, allreduce in one shot with LL packets, as python/ferry/programs/allreduce_allpairs_packets.py
// writes it: rank r puts its input into every peer's scratch, copies it to its output, then reduces
// the peers' packets into it one peer at a time. Rank r's scratch chunk for sender s: s, or s - 1
// past r.
Json allPairsPackets(int R) {
  Json ranks = Json::array();
  for (int r = 0; r < R; ++r) {
    Json ops = Json::array(), channels = Json::array();
    for (int p = 0, ch = 0; p < R; ++p) {
      if (p == r) continue;
      channels.push_back({{"type", "memory"}, {"peer", p}});
      ops.push_back({{"op", "put_packets"}, {"channel", ch++}, {"src", ref("input", 0)},
                     {"dst", ref("scratch", r < p ? r : r - 1)}});
    }
    ops.push_back({{"op", "copy"}, {"src", ref("input", 0)}, {"dst", ref("output", 0)}});
    for (int p = 0; p < R; ++p)
      if (p != r) ops.push_back({{"op", "reduce_packets"}, {"src", ref("scratch", p < r ? p : p - 1)}, {"dst", ref("output", 0)}});
    ranks.push_back({{"rank", r}, {"channels", channels}, {"thread_blocks", {{{"id", 0}, {"ops", ops}}}}});
  }
  return {{"format", "ferry-plan"}, {"version", 1},     {"name", "ap"},        {"collective", "allreduce"},
          {"protocol", "LL"},       {"inplace", false}, {"world_size", R},     {"chunks", {{"input", 1}, {"output", 1}, {"scratch", R - 1}}},
          {"min_bytes", 0},         {"max_bytes", 1 << 16}, {"ranks", ranks}};
}

std::uint8_t fused(FusedKind k) { return static_cast<std::uint8_t>(k); }

TEST(FusedOps, AllPairsPacketsBecomeOnePutAndOneReduce) {
  RankProgram p = compileRankProgram(loadPlan(allPairsPackets(4).dump()), 1);
  ASSERT_EQ(p.ops.size(), 7u);
  fuseRankProgram(p);
  ASSERT_EQ(p.ops.size(), 2u);
  EXPECT_EQ(p.tbFirst, (std::vector<std::uint32_t>{0, 2}));
  const ExecOp& put = p.ops[0];
  EXPECT_EQ(put.kind, fused(FusedKind::PutPacketsToMany));
  EXPECT_EQ(put.src.buffer, static_cast<std::int8_t>(BufferKind::Input));
  ASSERT_EQ(put.nsends, 3);
  for (int i = 0; i < 3; ++i) {  // peers 0, 2, 3, each into its chunk for sender 1: 0 at rank 0, 1 past it
    const ExecRef& to = p.refs[put.firstRef + i];
    EXPECT_EQ(to.rank, i == 0 ? 0 : i + 1);
    EXPECT_EQ(to.buffer, static_cast<std::int8_t>(BufferKind::Scratch));
    EXPECT_EQ(to.index, i == 0 ? 0 : 1);
  }
  const ExecOp& reduce = p.ops[1];
  EXPECT_EQ(reduce.kind, fused(FusedKind::ReducePacketsFromMany));
  EXPECT_EQ(reduce.src.buffer, static_cast<std::int8_t>(BufferKind::Input));  // the copy's source
  EXPECT_EQ(reduce.dst.buffer, static_cast<std::int8_t>(BufferKind::Output));
  ASSERT_EQ(reduce.nsrcs, 3);
  for (int i = 0; i < 3; ++i) {  // in the plan's order: senders 0, 2, 3 from chunks 0, 1, 2
    const ExecRef& from = p.refs[reduce.firstRef + i];
    EXPECT_EQ(from.rank, i == 0 ? 0 : i + 1) << "the sender";
    EXPECT_EQ(from.index, i);
  }
}

TEST(FusedOps, OnlyRunsThatOneOpCanDo) {
  // A Simple plan: nothing to fuse, nothing changes.
  RankProgram two = compileRankProgram(loadPlan(twoShot().dump()), 1);
  const std::vector<ExecOp> before = two.ops;
  fuseRankProgram(two);
  ASSERT_EQ(two.ops.size(), before.size());
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(two.ops[i].kind, before[i].kind) << i;
  // One put: kept; a copy and one reduce into its destination: one op.
  RankProgram pk = compileRankProgram(loadPlan(packets().dump()), 0);
  fuseRankProgram(pk);
  ASSERT_EQ(pk.ops.size(), 2u);
  EXPECT_EQ(pk.ops[0].kind, static_cast<std::uint8_t>(OpKind::PutPackets));
  EXPECT_EQ(pk.ops[1].kind, fused(FusedKind::ReducePacketsFromMany));
  EXPECT_EQ(pk.ops[1].nsrcs, 1);
  // Puts of different sources: kept apart.
  Json plan = allPairsPackets(3);
  for (int r = 0; r < 3; ++r) opOf(plan, r, 0, 1)["src"] = ref("output", 0);
  RankProgram apart = compileRankProgram(loadPlan(plan.dump()), 0);
  fuseRankProgram(apart);
  ASSERT_EQ(apart.ops.size(), 3u);  // put, put, then the copy and two reduces as one
  EXPECT_EQ(apart.ops[0].kind, static_cast<std::uint8_t>(OpKind::PutPackets));
  EXPECT_EQ(apart.ops[1].kind, static_cast<std::uint8_t>(OpKind::PutPackets));
  EXPECT_EQ(apart.ops[2].kind, fused(FusedKind::ReducePacketsFromMany));
  EXPECT_EQ(apart.ops[2].nsrcs, 2);
}

TEST(FusedOps, RunsOfAtMostFourAndReducesIntoOneDestination) {
  // Two ranks: rank 0 puts its input into 9 scratch chunks of rank 1 (9 channels); rank 1 reduces
  // 9 of them into its output (no copy), then one into another chunk of it, then copies a chunk
  // onto another index. (Host only: no rank waits for anything.)
  static_assert(kMaxFusedRun == 4);
  Json ranks = Json::array();
  Json put = Json::array(), reduce = Json::array(), channels0 = Json::array(), channels1 = Json::array();
  for (int k = 0; k < 9; ++k) {
    channels0.push_back({{"type", "memory"}, {"peer", 1}});
    channels1.push_back({{"type", "memory"}, {"peer", 0}});
    put.push_back({{"op", "put_packets"}, {"channel", k}, {"src", ref("input", 0)}, {"dst", ref("scratch", k)}});
    reduce.push_back({{"op", "reduce_packets"}, {"src", ref("scratch", k)}, {"dst", ref("output", 0)}});
  }
  reduce.push_back({{"op", "reduce_packets"}, {"src", ref("scratch", 9)}, {"dst", ref("output", 1)}});
  reduce.push_back({{"op", "copy"}, {"src", ref("input", 0)}, {"dst", ref("output", 1)}});
  reduce.push_back({{"op", "reduce_packets"}, {"src", ref("scratch", 10)}, {"dst", ref("output", 1)}});
  put.push_back({{"op", "put_packets"}, {"channel", 0}, {"src", ref("input", 1)}, {"dst", ref("scratch", 9)}});
  put.push_back({{"op", "put_packets"}, {"channel", 1}, {"src", ref("input", 1)}, {"dst", ref("scratch", 10)}});
  ranks.push_back({{"rank", 0}, {"channels", channels0}, {"thread_blocks", {{{"id", 0}, {"ops", put}}}}});
  ranks.push_back({{"rank", 1}, {"channels", channels1}, {"thread_blocks", {{{"id", 0}, {"ops", reduce}}}}});
  const Json plan = {{"format", "ferry-plan"}, {"version", 1},     {"name", "nine"},      {"collective", "allreduce"},
                     {"protocol", "LL"},       {"inplace", false}, {"world_size", 2},     {"chunks", {{"input", 2}, {"output", 2}, {"scratch", 11}}},
                     {"min_bytes", 0},         {"max_bytes", 1 << 16}, {"ranks", ranks}};
  RankProgram sender = compileRankProgram(loadPlan(plan.dump()), 0);
  fuseRankProgram(sender);
  ASSERT_EQ(sender.ops.size(), 4u);  // 4 and 4 puts of input 0, the ninth, the two of input 1
  EXPECT_EQ(sender.ops[0].kind, fused(FusedKind::PutPacketsToMany));
  EXPECT_EQ(sender.ops[0].nsends, 4);
  EXPECT_EQ(sender.ops[1].kind, fused(FusedKind::PutPacketsToMany));
  EXPECT_EQ(sender.refs[sender.ops[1].firstRef].index, 4);
  EXPECT_EQ(sender.ops[2].kind, static_cast<std::uint8_t>(OpKind::PutPackets));
  EXPECT_EQ(sender.ops[2].dst.index, 8);
  EXPECT_EQ(sender.ops[3].kind, fused(FusedKind::PutPacketsToMany));
  EXPECT_EQ(sender.ops[3].src.index, 1);
  RankProgram receiver = compileRankProgram(loadPlan(plan.dump()), 1);
  fuseRankProgram(receiver);
  // 4 and 4 reduces from the output itself, the ninth alone, the one into output 1 alone, and the
  // copy of input 0 onto output 1 (another index) kept apart from the reduce after it.
  ASSERT_EQ(receiver.ops.size(), 6u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(receiver.ops[k].kind, fused(FusedKind::ReducePacketsFromMany));
    EXPECT_EQ(receiver.ops[k].nsrcs, 4);
    EXPECT_EQ(receiver.ops[k].src.buffer, static_cast<std::int8_t>(BufferKind::Output));  // starts from itself
  }
  EXPECT_EQ(receiver.refs[receiver.ops[1].firstRef].index, 4);
  EXPECT_EQ(receiver.ops[2].kind, static_cast<std::uint8_t>(OpKind::ReducePackets));
  EXPECT_EQ(receiver.ops[3].kind, static_cast<std::uint8_t>(OpKind::ReducePackets));
  EXPECT_EQ(receiver.ops[3].dst.index, 1);
  EXPECT_EQ(receiver.ops[4].kind, static_cast<std::uint8_t>(OpKind::Copy));
  EXPECT_EQ(receiver.ops[5].kind, static_cast<std::uint8_t>(OpKind::ReducePackets));
}

TEST(FusedOps, AReduceRunStopsAtAnotherOp) {
  // A wait between two reduces: each stays on its side of it. (Host only: the inserted signal and
  // wait do not pair up across the ranks.)
  Json plan = allPairsPackets(3);
  for (int r = 0; r < 3; ++r) {
    Json& ops = plan["ranks"][r]["thread_blocks"][0]["ops"];
    ops.insert(ops.begin() + 4, Json{{"op", "wait"}, {"channel", 0}});
    ops.insert(ops.begin() + 2, Json{{"op", "signal"}, {"channel", 1}});
  }
  RankProgram p = compileRankProgram(loadPlan(plan.dump()), 2);
  fuseRankProgram(p);
  // the two puts (one op), the signal, the copy and the first reduce (one op), the wait, the reduce
  ASSERT_EQ(p.ops.size(), 5u);
  EXPECT_EQ(p.ops[0].kind, fused(FusedKind::PutPacketsToMany));
  EXPECT_EQ(p.ops[1].kind, static_cast<std::uint8_t>(OpKind::Signal));
  EXPECT_EQ(p.ops[2].kind, fused(FusedKind::ReducePacketsFromMany));
  EXPECT_EQ(p.ops[2].nsrcs, 1);
  EXPECT_EQ(p.ops[3].kind, static_cast<std::uint8_t>(OpKind::Wait));
  EXPECT_EQ(p.ops[4].kind, static_cast<std::uint8_t>(OpKind::ReducePackets));
  EXPECT_EQ(p.ops[4].peer, 1);
}

// Waits in a row become one WaitOnMany whose refs carry each wait's peer, slot and seq (the executor
// then waits on them all at once); a single wait stays as it is. (Host only.)
TEST(FusedOps, WaitsInARowBecomeOneWaitOnMany) {
  Json plan = allPairsPackets(3);
  for (int r = 0; r < 3; ++r) {
    Json& ops = plan["ranks"][r]["thread_blocks"][0]["ops"];
    ops.insert(ops.begin() + 2, Json{{"op", "wait"}, {"channel", 1}});
    ops.insert(ops.begin() + 2, Json{{"op", "wait"}, {"channel", 0}});
    ops.insert(ops.begin() + 2, Json{{"op", "signal"}, {"channel", 1}});
    ops.insert(ops.begin() + 2, Json{{"op", "signal"}, {"channel", 0}});
    ops.push_back(Json{{"op", "wait"}, {"channel", 0}});
  }
  RankProgram p = compileRankProgram(loadPlan(plan.dump()), 2);
  const RankProgram compiled = p;
  ASSERT_EQ(compiled.ops.size(), 10u);
  fuseRankProgram(p);
  // the puts (one op), two signals, the two waits (one op), the copy and reduces (one op), the last wait
  ASSERT_EQ(p.ops.size(), 6u);
  EXPECT_EQ(p.ops[1].kind, static_cast<std::uint8_t>(OpKind::Signal));
  EXPECT_EQ(p.ops[2].kind, static_cast<std::uint8_t>(OpKind::Signal));
  const ExecOp& waits = p.ops[3];
  EXPECT_EQ(waits.kind, fused(FusedKind::WaitOnMany));
  ASSERT_EQ(waits.nsrcs, 2);
  for (int i = 0; i < 2; ++i) {
    const ExecOp& wait = compiled.ops[static_cast<std::size_t>(4 + i)];
    ASSERT_EQ(wait.kind, static_cast<std::uint8_t>(OpKind::Wait));
    const ExecRef& r = p.refs[waits.firstRef + static_cast<std::uint32_t>(i)];
    EXPECT_EQ(r.rank, wait.peer);
    EXPECT_EQ(r.count, static_cast<std::int32_t>(wait.slot));
    EXPECT_EQ(r.index, static_cast<std::int32_t>(wait.seq));
  }
  EXPECT_EQ(p.refs[waits.firstRef].rank, 0);
  EXPECT_EQ(p.refs[waits.firstRef + 1].rank, 1);
  EXPECT_EQ(p.ops[4].kind, fused(FusedKind::ReducePacketsFromMany));
  EXPECT_EQ(p.ops[5].kind, static_cast<std::uint8_t>(OpKind::Wait));
}

TEST(PlanLanes, FollowTheSizeWithinEveryBound) {
  const RankProgram plan = compileRankProgram(loadPlan(twoShot().dump()), 0);  // one thread block a rank
  EXPECT_EQ(planLanes(plan, 1 << 10, 32, 128, true), 1);
  EXPECT_EQ(planLanes(plan, 1 << 20, 32, 128, true), 4);
  EXPECT_EQ(planLanes(plan, 1 << 20, 1, 128, true), 1);
  EXPECT_EQ(planLanes(plan, 1ull << 30, 32, 128, true), 32);
  EXPECT_EQ(planLanes(plan, 1ull << 30, 64, 128, true), kMaxLanes);
  EXPECT_EQ(planLanes(plan, 1ull << 30, 32, 16, true), 16);
  EXPECT_EQ(planLanes(plan, 1ull << 30, 32, 1, true), 1);
  Json wide = twoShot();  // rank 1 gets a second thread block: every rank counts as two wide
  wide["ranks"][1]["thread_blocks"].push_back(
      {{"id", 1}, {"ops", {{{"op", "copy"}, {"src", ref("input", 0)}, {"dst", ref("output", 0)}}}}});
  EXPECT_EQ(planLanes(compileRankProgram(loadPlan(wide.dump()), 0), 1ull << 30, 32, 16, true), 8);
  Json port = twoShot();
  for (int r = 0; r < 2; ++r) port["ranks"][r]["channels"][1]["type"] = "port";
  const RankProgram ports = compileRankProgram(loadPlan(port.dump()), 0);
  EXPECT_EQ(planLanes(ports, 1ull << 30, 32, 128, true), 1);
  EXPECT_EQ(planLanes(ports, 4 << 20, 32, 128, false), 16);  // its puts are stores (FERRY_PLAN_PORTS=memory)
  // LL plans: one lane per 8 KiB, so a 256 KiB call spreads over 32 blocks a thread block.
  const RankProgram ll = compileRankProgram(loadPlan(packets().dump()), 0);
  EXPECT_EQ(planLanes(ll, 1 << 10, 32, 128, true), 1);
  EXPECT_EQ(planLanes(ll, 64 << 10, 32, 128, true), 8);
  EXPECT_EQ(planLanes(ll, 256 << 10, 32, 128, true), 32);
  EXPECT_EQ(planLanes(ll, 256 << 10, 32, 16, true), 16);
}

// Every (channel row, lane) has a flag row of its own, clear of the call-start and final rows.
TEST(PlanLanes, EachLaneHasItsOwnFlagRows) {
  std::set<int> rows;
  for (int lane = 0; lane < kMaxLanes; ++lane)
    for (int slot = 1; slot <= kMaxChannelSlots; ++slot) {
      const int row = laneFlagRow(slot, lane);
      EXPECT_TRUE(rows.insert(row).second) << "slot " << slot << " lane " << lane;
      EXPECT_NE(row, 0);
      EXPECT_NE(row, kFinalSlot);
      EXPECT_LT(row, kFlagSlots);
    }
}

TEST(ChunkGeometry, EvenAndUnevenCounts) {
  Plan plan = loadPlan(twoShot().dump());
  ChunkGeometry even = chunkGeometry(plan, 10);
  EXPECT_TRUE(even.uniform());
  EXPECT_EQ(even.offset(1), 5u);
  EXPECT_EQ(even.length(1), 5u);
  ChunkGeometry odd = chunkGeometry(plan, 7);  // chunks of 4 and 3
  EXPECT_FALSE(odd.uniform());
  EXPECT_EQ(odd.offset(1), 4u);
  EXPECT_EQ(odd.length(0), 4u);
  EXPECT_EQ(odd.length(1), 3u);
  ChunkGeometry one = chunkGeometry(plan, 1);  // the second chunk is empty
  EXPECT_EQ(one.length(0), 1u);
  EXPECT_EQ(one.length(1), 0u);
}

TEST(ChunkGeometry, GroupsFollowTheCollective) {
  Json j = twoShot();
  j["collective"] = "allgather";
  j["chunks"] = {{"input", 2}, {"output", 4}, {"scratch", 1}};
  ChunkGeometry g = chunkGeometry(loadPlan(j.dump()), 5);  // per rank: chunks of 3 and 2
  EXPECT_EQ(g.offset(2), 5u);  // rank 1's first chunk starts at its block
  EXPECT_EQ(g.offset(3), 8u);
  EXPECT_EQ(g.length(3), 2u);
}

TEST(ChunkGeometry, ARoundIsPartOfEveryGroup) {
  Json j = twoShot();
  j["collective"] = "allgather";
  j["chunks"] = {{"input", 2}, {"output", 4}, {"scratch", 1}};
  // A round of 4 of each rank's 10 elements: chunks of 2, rank 1's block still 10 elements on.
  ChunkGeometry g = chunkGeometry(loadPlan(j.dump()), 10, 4);
  EXPECT_FALSE(g.uniform());  // a reference across groups is not one piece
  EXPECT_EQ(g.chunkElements, 2u);
  EXPECT_EQ(g.offset(1), 2u);
  EXPECT_EQ(g.offset(2), 10u);
  EXPECT_EQ(g.length(3), 2u);
  EXPECT_TRUE(chunkGeometry(loadPlan(j.dump()), 10, 10).uniform());
}

TEST(PlanRounds, OneRoundWhenTheScratchFits) {
  const Plan plan = loadPlan(twoShot().dump());  // 1 scratch chunk of half the count
  const PlanRounds r = planRounds(plan, 1000, 4, 2000);
  EXPECT_EQ(r.count, 1u);
  EXPECT_EQ(r.elements, 1000u);
}

TEST(PlanRounds, ChunksOfWholeGrainsThatFitTheRoom) {
  const Plan plan = loadPlan(twoShot().dump());
  // 1000 floats: a 2000-byte chunk; 1000 bytes of room fit 248 floats (62 grains of 16 bytes).
  const PlanRounds r = planRounds(plan, 1000, 4, 1000);
  EXPECT_EQ(r.elements, 2u * 248u);
  EXPECT_EQ(r.count, 3u);                                 // 496 + 496 + 8
  EXPECT_EQ(planRounds(plan, 1000, 4, 15).count, 0u);     // not one grain
  EXPECT_EQ(planRounds(plan, 1000, 8, 16).elements, 4u);  // one grain: 2 doubles per chunk
}

TEST(PlanRounds, PacketPlansCountPacketBytes) {
  const Plan plan = loadPlan(packets().dump());  // 1 chunk: the whole input, in LL16 packets
  // 4096 floats need 32 KiB of packets; 8 KiB of room carry 4 KiB of data per round.
  const PlanRounds r = planRounds(plan, 4096, 4, 8192);
  EXPECT_EQ(r.elements, 1024u);
  EXPECT_EQ(r.count, 4u);
}

TEST(PlanRounds, NoScratchIsOneRound) {
  Json j = twoShot();
  j["chunks"]["scratch"] = 0;
  for (auto& rank : j["ranks"]) rank["thread_blocks"][0]["ops"] = Json::array();
  const PlanRounds r = planRounds(loadPlan(j.dump()), 1 << 30, 4, 0);
  EXPECT_EQ(r.count, 1u);
  EXPECT_EQ(r.elements, 1u << 30);
}

// --- Plans as algorithms -------------------------------------------------------------------------

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/ferry_plans_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const Json& j) const {
    std::ofstream(path / name) << j.dump();
    return (path / name).string();
  }
};

CollectiveCall callOf(std::size_t count, int rank = 0) {
  CollectiveCall c;
  c.collective = ferry::Collective::AllReduce;
  c.count = count;
  c.type = DataType::Float32;
  c.rank = rank;
  c.worldSize = 2;
  c.send = reinterpret_cast<const void*>(0x10000);
  c.recv = reinterpret_cast<void*>(0x80000000);
  return c;
}

const CommLimits kLimits{2, 1 << 20, 1 << 20};

TEST(PlanAlgorithm, WhyNotNamesEachLimit) {
  TempDir dir;
  dir.write("a.json", twoShot());
  auto algos = loadPlanAlgorithms(dir.path.string());
  ASSERT_EQ(algos.size(), 1u);
  const PlanAlgorithm& a = *algos[0];
  EXPECT_STREQ(a.name(), "plan:two");
  CollectiveCall call = callOf(1024);
  // It reaches into the peers' buffers: unregistered calls run staged, not refused.
  EXPECT_TRUE(a.needsRegisteredBuffers(call));
  EXPECT_EQ(a.whyNot(call, kLimits), "");
  call.sendId = call.recvId = 1;
  EXPECT_EQ(a.whyNot(call, kLimits), "");
  EXPECT_CONTAINS(a.whyNot(call, {4, 1 << 20, 1 << 20}), "plans for 2 ranks, not 4");
  EXPECT_CONTAINS(a.whyNot(callOf(1 << 20), kLimits), "outside the plan's range [0, 1048576]");
  CollectiveCall inPlace = call;
  inPlace.send = inPlace.recv;
  EXPECT_CONTAINS(a.whyNot(inPlace, kLimits), "out-of-place calls only");
  EXPECT_EQ(a.whyNot(call, {2, 1 << 20, 1024}), "");  // 2 KiB of scratch: it runs in rounds
  EXPECT_CONTAINS(a.whyNot(call, {2, 1 << 20, 8}), "FERRY_SCRATCH_BYTES");  // not even 16 bytes
  EXPECT_CONTAINS(a.whyNot(call, {2, 1 << 20, 1 << 20, 0}), "thread blocks; the Comm allows 0");  // maxBlocks
}

// Only the root's send buffer says whether a broadcast is in place (the other ranks' is not
// read), so every rank must take the call alike whatever its own buffers: a broadcast plan takes
// both. Refusing on one rank and not another had them run different algorithms: a hang.
TEST(PlanAlgorithm, BroadcastPlansTakeInPlaceAndOutOfPlaceCallsOnEveryRank) {
  TempDir dir;
  dir.write("bc.json", broadcast());
  auto algos = loadPlanAlgorithms(dir.path.string());
  ASSERT_EQ(algos.size(), 1u);
  const PlanAlgorithm& a = *algos[0];
  for (int rank = 0; rank < 2; ++rank) {
    CollectiveCall call = callOf(1024, rank);
    call.collective = ferry::Collective::Broadcast;
    call.root = 0;
    EXPECT_EQ(a.whyNot(call, kLimits), "") << "rank " << rank << ", out of place";
    call.send = call.recv;
    EXPECT_EQ(a.whyNot(call, kLimits), "") << "rank " << rank << ", in place";
    call.send = nullptr;
    EXPECT_EQ(a.whyNot(call, kLimits), "") << "rank " << rank << ", no send buffer";
    call.root = 1;
    EXPECT_CONTAINS(a.whyNot(call, kLimits), "broadcasts from rank 0, not 1");
  }
}

TEST(PlanAlgorithm, PacketPlansNeedRoomInThePacketRegion) {
  TempDir dir;
  dir.write("pk.json", packets());
  auto algos = loadPlanAlgorithms(dir.path.string());
  const CollectiveCall call = callOf(4096);  // 16 KiB of data: 32 KiB of packets
  EXPECT_EQ(algos[0]->whyNot(call, kLimits), "");
  EXPECT_FALSE(algos[0]->needsRegisteredBuffers(call));  // peers only through scratch
  EXPECT_EQ(algos[0]->whyNot(call, {2, 4096, 1 << 20}), "");  // 16 KiB of packets: 2 rounds
  EXPECT_CONTAINS(algos[0]->whyNot(call, {2, 4, 1 << 20}), "FERRY_LL_BYTES");
}

TEST(PlanAlgorithm, OneAlgorithmPerNameAcrossWorldSizes) {
  TempDir dir;
  Json four = twoShot();
  four["world_size"] = 4;  // not a valid two-shot, but the loader only checks the format
  four["ranks"] = Json::array();
  for (int r = 0; r < 4; ++r)
    four["ranks"].push_back({{"rank", r}, {"channels", Json::array()},
                             {"thread_blocks", {{{"id", 0}, {"ops", {{{"op", "barrier"}}}}}}}});
  dir.write("a2.json", twoShot());
  dir.write("a4.json", four);
  auto algos = loadPlanAlgorithms(dir.path.string());
  ASSERT_EQ(algos.size(), 1u);
  EXPECT_NE(algos[0]->forWorldSize(2), nullptr);
  EXPECT_NE(algos[0]->forWorldSize(4), nullptr);
  dir.write("a5.json", twoShot());  // a second plan "two" for 2 ranks
  EXPECT_CONTAINS(invalidUsageOf([&] { loadPlanAlgorithms(dir.path.string()); }), "already loaded from");
}

TEST(PlanAlgorithm, BadPathsAndPlansNameTheFile) {
  EXPECT_CONTAINS(invalidUsageOf([] { loadPlanAlgorithms("/nonexistent/plans"); }), "/nonexistent/plans");
  TempDir dir;
  Json bad = twoShot();
  bad["chunks"]["input"] = "two";
  const std::string file = dir.write("bad.json", bad);
  EXPECT_CONTAINS(invalidUsageOf([&] { loadPlanAlgorithms(file); }), "bad.json");
  EXPECT_TRUE(loadPlanAlgorithms("").empty());
}

TEST(PlanAlgorithm, SelectorTriesPlansFirst) {
  TempDir dir;
  dir.write("a.json", twoShot());
  auto algos = loadPlanAlgorithms(dir.path.string());
  Selector s(defaultTuning());
  s.add(algos[0].get(), AlgorithmKind::Plan, nullptr);
  CollectiveCall call = callOf(1024);
  EXPECT_STREQ(s.select(call, kLimits).name(), "plan:two");  // not registered: it runs staged
  call.sendId = call.recvId = 1;
  EXPECT_STREQ(s.select(call, kLimits).name(), "plan:two");
  EXPECT_STRNE(s.select(callOf(1 << 20), kLimits).name(), "plan:two");  // past max_bytes
}

// The shipped programs, compiled by the plan_compile_* tests (FERRY_PLAN_DIR): each loads as an
// algorithm with a plan for 2 and 4 ranks, every rank's program within the executor's rules.
TEST(CompiledPlans, EveryShippedProgramRunsOnTheExecutor) {
  const char* dir = std::getenv("FERRY_PLAN_DIR");
  if (!dir) GTEST_SKIP() << "FERRY_PLAN_DIR not set (the plan_executable ctest sets it)";
  auto algos = loadPlanAlgorithms(dir);
  EXPECT_GE(algos.size(), 6u);
  for (const auto& a : algos) {
    SCOPED_TRACE(a->name());
    for (int w : {2, 4}) {
      const auto* e = a->forWorldSize(w);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->programs.size(), static_cast<std::size_t>(w));
      // Every shipped direct program waits out its peers' accesses itself.
      for (const RankProgram& p : e->programs) EXPECT_FALSE(p.finalExchange) << w << " ranks";
      // The all-pairs packet allreduce fuses into two ops (FERRY_PLAN_FUSE): its puts, and its copy
      // and reduces.
      if (std::string(a->name()) == "plan:allreduce_allpairs_packets")
        for (RankProgram p : e->programs) {
          if (p.ops.size() != 2u) fuseRankProgram(p);  // (fused as loaded where FERRY_PLAN_FUSE=1)
          ASSERT_EQ(p.ops.size(), 2u) << w << " ranks";
          if (w == 2) {  // one put: nothing to fuse it with
            EXPECT_EQ(p.ops[0].kind, static_cast<std::uint8_t>(OpKind::PutPackets));
          } else {
            EXPECT_EQ(p.ops[0].kind, static_cast<std::uint8_t>(FusedKind::PutPacketsToMany));
            EXPECT_EQ(p.ops[0].nsends, w - 1);
          }
          EXPECT_EQ(p.ops[1].kind, static_cast<std::uint8_t>(FusedKind::ReducePacketsFromMany));
          EXPECT_EQ(p.ops[1].nsrcs, w - 1);
        }
    }
  }
}

}  // namespace
}  // namespace ferry::executor
