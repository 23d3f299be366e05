// The C++ plan loader against docs/plan-format.md: small valid plans load, each kind of malformed
// input is InvalidUsage naming its JSON path and rank, and (CompiledPlans) every plan the Python DSL
// compiles loads here too.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "executor/plan.hpp"

using namespace ferry;
using namespace ferry::executor;
using Json = nlohmann::ordered_json;

namespace {

// Two ranks, allreduce in two chunks: each rank puts its half, then reduces (one read from peer).
const char* kAllreduce = R"({
  "format": "ferry-plan", "version": 1, "name": "ar", "collective": "allreduce", "protocol": "Simple",
  "inplace": false, "world_size": 2, "chunks": {"input": 2, "output": 2, "scratch": 2},
  "min_bytes": 0, "max_bytes": 1024,
  "ranks": [
    {"rank": 0, "channels": [{"type": "memory", "peer": 1}, {"type": "port", "peer": 1}],
     "thread_blocks": [{"id": 0, "ops": [
       {"op": "put", "channel": 0, "src": {"buffer": "input", "index": 1, "count": 1},
        "dst": {"buffer": "scratch", "index": 0, "count": 1}},
       {"op": "signal", "channel": 0}, {"op": "wait", "channel": 0}, {"op": "flush", "channel": 1},
       {"op": "reduce", "srcs": [{"buffer": "input", "index": 0, "count": 1},
                                 {"buffer": "input", "index": 0, "count": 1, "channel": 0}],
        "dst": {"buffer": "output", "index": 0, "count": 1}},
       {"op": "read_reduce_copy_send", "srcs": [{"buffer": "scratch", "index": 1, "count": 1}],
        "dst": {"buffer": "output", "index": 1, "count": 1},
        "sends": [{"channel": 0, "dst": {"buffer": "output", "index": 1, "count": 1}}]},
       {"op": "barrier"}]}]},
    {"rank": 1, "channels": [{"type": "port", "peer": 0}, {"type": "memory", "peer": 0}],
     "thread_blocks": [{"id": 0, "ops": [{"op": "barrier"}]},
                       {"id": 1, "ops": [{"op": "get", "channel": 1,
                         "src": {"buffer": "input", "index": 0, "count": 2},
                         "dst": {"buffer": "output", "index": 0, "count": 2}}]}]}]})";

// LL broadcast from rank 1 of 2.
const char* kBroadcast = R"({
  "format": "ferry-plan", "version": 1, "name": "bc", "collective": "broadcast", "root": 1,
  "protocol": "LL", "inplace": true, "world_size": 2,
  "chunks": {"input": 1, "output": 1, "scratch": 1}, "min_bytes": 8, "max_bytes": 8,
  "ranks": [
    {"rank": 0, "channels": [{"type": "memory", "peer": 1}], "thread_blocks": [{"id": 0, "ops": [
      {"op": "unpack_packets", "src": {"buffer": "scratch", "index": 0, "count": 1},
       "dst": {"buffer": "output", "index": 0, "count": 1}},
      {"op": "reduce_packets", "src": {"buffer": "scratch", "index": 0, "count": 1},
       "dst": {"buffer": "output", "index": 0, "count": 1}},
      {"op": "copy", "src": {"buffer": "output", "index": 0, "count": 1},
       "dst": {"buffer": "input", "index": 0, "count": 1}}]}]},
    {"rank": 1, "channels": [{"type": "memory", "peer": 0}], "thread_blocks": [{"id": 0, "ops": [
      {"op": "put_packets", "channel": 0, "src": {"buffer": "input", "index": 0, "count": 1},
       "dst": {"buffer": "scratch", "index": 0, "count": 1}}]}]}]})";

// Four ranks, allgather, no channels at all.
const char* kAllgather = R"({
  "format": "ferry-plan", "version": 1, "name": "ag", "collective": "allgather", "protocol": "Simple",
  "inplace": false, "world_size": 4, "chunks": {"input": 1, "output": 4, "scratch": 0},
  "min_bytes": 0, "max_bytes": 0, "ranks": [
    {"rank": 0, "channels": [], "thread_blocks": [{"id": 0, "ops": []}]},
    {"rank": 1, "channels": [], "thread_blocks": [{"id": 0, "ops": []}]},
    {"rank": 2, "channels": [], "thread_blocks": [{"id": 0, "ops": []}]},
    {"rank": 3, "channels": [], "thread_blocks": [{"id": 0, "ops": []}]}]})";

// The loader's error detail for `text`, or "" if it loaded.
std::string errorOf(const std::string& text) {
  try {
    loadPlan(text);
  } catch (const PlanError& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    return e.detail();
  }
  return "";
}

std::string mutated(const char* base, const std::function<void(Json&)>& edit) {
  Json j = Json::parse(base);
  edit(j);
  return j.dump();
}

}  // namespace

TEST(PlanLoader, ValidPlansLoad) {
  Plan a = loadPlan(kAllreduce);
  EXPECT_EQ(a.collective, Collective::AllReduce);
  EXPECT_EQ(a.worldSize, 2);
  ASSERT_EQ(a.ranks[0].threadBlocks[0].ops.size(), 7u);
  const Op& reduce = a.ranks[0].threadBlocks[0].ops[4];
  EXPECT_EQ(reduce.kind, OpKind::Reduce);
  EXPECT_EQ(reduce.srcs[1].channel, 0);
  EXPECT_FALSE(reduce.src.present());
  EXPECT_EQ(a.ranks[0].threadBlocks[0].ops[5].sends.size(), 1u);
  EXPECT_EQ(a.ranks[1].threadBlocks[1].ops[0].src.count, 2);
  Plan b = loadPlan(kBroadcast);
  EXPECT_EQ(b.root, 1);
  EXPECT_EQ(b.protocol, Protocol::LL);
  EXPECT_EQ(b.ranks[1].threadBlocks[0].ops[0].dst.buffer, BufferKind::Scratch);
  Plan c = loadPlan(kAllgather);
  EXPECT_EQ(c.chunks.output, 4);
  EXPECT_EQ(c.root, -1);
}

TEST(PlanLoader, MalformedInputNamesPathAndRank) {
  struct Case {
    const char* base;
    std::function<void(Json&)> edit;
    std::string expected;
  };
  auto op0 = [](Json& j) -> Json& { return j["ranks"][0]["thread_blocks"][0]["ops"][0]; };
  std::vector<Case> cases{
      {kAllreduce, [](Json& j) { j["version"] = 2; }, "version: version 2 is not supported"},
      {kAllreduce, [](Json& j) { j["format"] = "x"; }, "format: expected 'ferry-plan', found 'x'"},
      {kAllreduce, [](Json& j) { j["extra"] = 1; }, "extra: unknown field"},
      {kAllreduce, [](Json& j) { j.erase("name"); }, "name: missing field"},
      {kAllreduce, [](Json& j) { j["collective"] = "gather"; }, "collective: unknown value 'gather'"},
      {kAllreduce, [](Json& j) { j["inplace"] = 1; }, "inplace: expected a boolean, found an integer"},
      {kAllreduce, [](Json& j) { j["world_size"] = 0; }, "world_size: 0 is below the minimum 1"},
      {kAllreduce, [](Json& j) { j["chunks"]["output"] = 3; }, "chunks.output: allreduce needs as many"},
      {kAllgather, [](Json& j) { j["chunks"]["output"] = 3; },
       "chunks.output: allgather needs world_size * input = 4"},
      {kAllreduce, [](Json& j) { j["max_bytes"] = -1; }, "max_bytes: -1 is below the minimum 0"},
      {kAllreduce, [](Json& j) { j["min_bytes"] = 2048; }, "max_bytes: 1024 is below min_bytes 2048"},
      {kAllreduce, [](Json& j) { j["root"] = 0; }, "root: only broadcast has a root, not allreduce"},
      {kBroadcast, [](Json& j) { j["root"] = 2; }, "root: rank 2 does not exist (world_size 2)"},
      {kAllreduce, [](Json& j) { j["world_size"] = 3; }, "ranks: has 2 entries, world_size is 3"},
      {kAllreduce, [](Json& j) { j["ranks"][1]["rank"] = 0; },
       "ranks[1].rank: is 0, expected its position 1 (rank 1)"},
      {kAllreduce, [](Json& j) { j["ranks"][1]["channels"][0]["peer"] = 1; },
       "ranks[1].channels[0].peer: peer 1 is this rank itself (rank 1)"},
      {kAllreduce, [](Json& j) { j["ranks"][1]["channels"][0]["type"] = "memory"; },
       "ranks[0].channels[0]: memory channel to rank 1 has no pair: this rank has 1 memory channels to rank "
       "1, rank 1 has 2 back (rank 0)"},
      {kAllreduce, [](Json& j) { j["ranks"][1]["thread_blocks"] = Json::array(); },
       "ranks[1].thread_blocks: must not be empty (rank 1)"},
      {kAllreduce, [](Json& j) { j["ranks"][1]["thread_blocks"][1]["id"] = 3; },
       "ranks[1].thread_blocks[1].id: is 3, expected its position 1 (rank 1)"},
      {kAllreduce, [&](Json& j) { op0(j).erase("op"); },
       "ranks[0].thread_blocks[0].ops[0].op: missing field (rank 0)"},
      {kAllreduce, [&](Json& j) { op0(j)["op"] = "send"; }, "ops[0].op: unknown value 'send'"},
      {kAllreduce, [&](Json& j) { op0(j)["srcs"] = Json::array(); }, "ops[0].srcs: unknown field (rank 0)"},
      {kAllreduce, [&](Json& j) { op0(j).erase("dst"); }, "ops[0].dst: missing field (rank 0)"},
      {kAllreduce, [&](Json& j) { op0(j)["channel"] = 2; },
       "ops[0].channel: channel 2 does not exist (this rank has 2) (rank 0)"},
      {kAllreduce, [&](Json& j) { op0(j)["src"]["index"] = 6; },
       "ops[0].src.index: 6 is out of range for buffer \"input\" of 2 chunks (rank 0)"},
      {kAllreduce, [&](Json& j) { op0(j)["src"]["count"] = 2; },
       "ops[0].src.count: chunks [1, 3) run past buffer \"input\" of 2 chunks"},
      {kAllreduce,
       [&](Json& j) {
         op0(j)["src"]["index"] = 0;
         op0(j)["src"]["count"] = 2;
       },
       "ops[0]: references of one op must have the same count, found [1, 2] (rank 0)"},
      {kAllreduce, [&](Json& j) { op0(j)["src"]["channel"] = 0; }, "ops[0].src.channel: unknown field"},
      {kAllreduce, [&](Json& j) { op0(j)["src"]["index"] = 1.5; },
       "ops[0].src.index: expected an integer, found a number"},
      {kAllreduce, [](Json& j) { j["ranks"][0]["thread_blocks"][0]["ops"][3]["channel"] = 0; },
       "ops[3].channel: channel 0 is a memory channel; this needs port"},
      {kAllreduce, [](Json& j) { j["ranks"][0]["thread_blocks"][0]["ops"][4]["srcs"][1]["channel"] = 1; },
       "ops[4].srcs[1].channel: channel 1 is a port channel; this needs memory"},
      {kAllreduce, [](Json& j) { j["ranks"][0]["thread_blocks"][0]["ops"][5]["sends"][0]["extra"] = 0; },
       "ops[5].sends[0].extra: unknown field"},
      {kAllreduce, [](Json& j) { j["ranks"][1]["thread_blocks"][1]["ops"][0]["channel"] = 0; },
       "ranks[1].thread_blocks[1].ops[0].channel: channel 0 is a port channel; this needs memory (rank 1)"},
      {kBroadcast, [](Json& j) { j["ranks"][1]["thread_blocks"][0]["ops"][0]["dst"]["buffer"] = "output"; },
       "ops[0].dst.buffer: unknown value 'output' (expected one of scratch)"},
      {kBroadcast, [](Json& j) { j["ranks"][0]["thread_blocks"][0]["ops"][0]["src"]["buffer"] = "input"; },
       "ops[0].src.buffer: unknown value 'input' (expected one of scratch)"},
      {kAllgather, [](Json& j) { j["ranks"] = 7; }, "ranks: expected an array, found an integer"},
      {kAllgather, [](Json& j) { j["ranks"][2] = nullptr; },
       "ranks[2]: expected an object, found null (rank 2)"},
      {kAllgather, [](Json& j) { j["version"] = Json::parse("18446744073709551615"); },
       "version: 18446744073709551615 is too large"},
  };
  for (const auto& c : cases) {
    std::string detail = errorOf(mutated(c.base, c.edit));
    EXPECT_NE(detail.find(c.expected), std::string::npos)
        << "expected \"" << c.expected << "\" in \"" << detail << "\"";
  }
}

// One op's threads work on all of its chunks at once: a local source and the destination must be
// the same chunks or none in common (python/ferry/plan/load.py applies the same rule).
TEST(PlanLoader, AnOpWhoseSourceAndDestinationOverlapAtAnOffsetIsRefused) {
  const auto copy = [](int src, int dst, int count) {
    return [=](Json& j) {
      j["chunks"]["scratch"] = 4;
      j["ranks"][0]["thread_blocks"][0]["ops"].push_back(
          {{"op", "copy"}, {"src", {{"buffer", "scratch"}, {"index", src}, {"count", count}}},
           {"dst", {{"buffer", "scratch"}, {"index", dst}, {"count", count}}}});
    };
  };
  EXPECT_EQ(errorOf(mutated(kAllreduce, copy(1, 0, 3))),
            "ranks[0].thread_blocks[0].ops[7]: a source scratch[1, 4) and the destination scratch[0, 3) overlap "
            "without being the same chunks; the op's threads would read chunks others write (a race): use "
            "disjoint chunks, or the very same ones to work in place (rank 0)");
  EXPECT_EQ(errorOf(mutated(kAllreduce, copy(0, 0, 3))), "");  // in place
  EXPECT_EQ(errorOf(mutated(kAllreduce, copy(0, 2, 2))), "");  // disjoint
  // A reduce's local source too; one read through a channel is the peer's memory, never a conflict.
  const std::string reduce = mutated(kAllreduce, [](Json& j) {
    j["ranks"][0]["thread_blocks"][0]["ops"][4]["dst"] = {{"buffer", "input"}, {"index", 0}, {"count", 1}};
  });
  EXPECT_EQ(errorOf(reduce), "");
  const std::string shifted = mutated(kAllreduce, [](Json& j) {
    auto& op = j["ranks"][0]["thread_blocks"][0]["ops"][4];
    op["srcs"][0] = {{"buffer", "input"}, {"index", 0}, {"count", 2}};
    op["srcs"][1] = {{"buffer", "input"}, {"index", 0}, {"count", 2}, {"channel", 0}};
    op["dst"] = {{"buffer", "input"}, {"index", 0}, {"count", 2}};
    j["chunks"]["input"] = 3;
    j["chunks"]["output"] = 3;
    op["dst"]["index"] = 1;
  });
  EXPECT_NE(errorOf(shifted).find("a source input[0, 2) and the destination input[1, 3) overlap"), std::string::npos)
      << errorOf(shifted);
}

// A hostile file costs a bounded amount before its error: no wait on a FIFO, no endless read of a
// device, no memory per level of brackets nested a million deep.
TEST(PlanLoader, FilesThatAreNotPlansFailFastAndBounded) {
  const std::string fifo = ::testing::TempDir() + "/ferry_plan_fifo.json";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), ::testing::TempDir()}) {
    try {
      loadPlanFile(path);
      ADD_FAILURE() << path << " loaded";
    } catch (const PlanError& e) {
      EXPECT_EQ(e.detail(), path + ": not a regular file");
    }
  }
  ::unlink(fifo.c_str());
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  EXPECT_EQ(errorOf(deep), "plan: not valid JSON: nested more than 64 levels deep");
  // Brackets inside strings do not count.
  EXPECT_EQ(errorOf(mutated(kAllgather, [](Json& j) { j["name"] = std::string(100, '['); })), "");
}

TEST(PlanLoader, NotJsonOrNotAnObject) {
  EXPECT_NE(errorOf("{").find("plan: not valid JSON: parse error at line 1, column 2"), std::string::npos);
  EXPECT_EQ(errorOf("[]"), "plan: expected an object, found an array");
  EXPECT_NE(errorOf("\xEF\xBB\xBF{}").find("BOM"), std::string::npos);
  try {
    loadPlanFile("/nonexistent/plan.json");
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_EQ(e.detail(), "/nonexistent/plan.json: cannot read: No such file or directory");
  }
}

// Run by ctest with FERRY_PLAN_DIR holding <program>_<ranks>.json from `python -m ferry.dsl compile`.
TEST(CompiledPlans, LoadAndMatchName) {
  const char* dir = std::getenv("FERRY_PLAN_DIR");
  if (!dir) GTEST_SKIP() << "FERRY_PLAN_DIR not set (the plan_compiled ctest sets it)";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::string stem = entry.path().stem().string();  // e.g. allreduce_ring_4
    SCOPED_TRACE(stem);
    Plan plan = loadPlanFile(entry.path().string());
    EXPECT_EQ(std::to_string(plan.worldSize), stem.substr(stem.rfind('_') + 1));
    EXPECT_EQ(plan.ranks.size(), std::size_t(plan.worldSize));
    // Program files are named after their collective.
    const char* names[] = {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast"};
    EXPECT_EQ(stem.rfind(names[int(plan.collective)], 0), 0u);
    ++n;
  }
  EXPECT_EQ(n, std::atoi(std::getenv("FERRY_PLAN_COUNT") ? std::getenv("FERRY_PLAN_COUNT") : "0"));
}
