#pragma once
// The executor's in-memory plan: plain structs mirroring docs/plan-format.md, version 1, and the
// loader that builds them. Everything here has already been validated by the loader, so later steps
// (flattening into a device-side array) can index without checks.
//
// Example:
//   Plan plan = loadPlanFile("allreduce_ring.json");  // throws PlanError (InvalidUsage) if malformed
//   for (const Op& op : plan.ranks[myRank].threadBlocks[0].ops) ...
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/collective.hpp"
#include "ferry/errors.hpp"

namespace ferry::executor {

// The one vocabulary: a plan's collective is ferry's (plans have no reduce).
using ::ferry::Collective;
enum class Protocol : std::uint8_t { Simple, LL };
enum class BufferKind : std::uint8_t { Input, Output, Scratch };
enum class ChannelType : std::uint8_t { Memory, Port, Switch };
enum class OpKind : std::uint8_t {
  Put,
  Get,
  Signal,
  Wait,
  Flush,
  Copy,
  Reduce,
  PutPackets,
  UnpackPackets,
  ReducePackets,
  ReadReduceCopySend,
  Barrier,
};

// Fields an op's kind does not use hold these (a valid reference always has count >= 1).
inline constexpr std::int64_t kNoChannel = -1;

struct ChunkRef {
  BufferKind buffer = BufferKind::Input;
  std::int64_t index = 0;
  std::int64_t count = 0;  // 0: the op has no such reference
  // Set only on a reduce/read_reduce_copy_send source that reads the peer's memory.
  std::int64_t channel = kNoChannel;
  bool present() const { return count > 0; }
};

struct Send {
  std::int64_t channel = kNoChannel;
  ChunkRef dst;
};

struct Op {
  OpKind kind = OpKind::Barrier;
  std::int64_t channel = kNoChannel;
  ChunkRef src;
  ChunkRef dst;
  std::vector<ChunkRef> srcs;
  std::vector<Send> sends;
};

struct ThreadBlock {
  std::int64_t id = 0;
  std::vector<Op> ops;
};

struct Channel {
  ChannelType type = ChannelType::Memory;
  std::int64_t peer = 0;
};

struct RankPlan {
  std::int64_t rank = 0;
  std::vector<Channel> channels;
  std::vector<ThreadBlock> threadBlocks;
};

struct Chunks {
  std::int64_t input = 0, output = 0, scratch = 0;
  std::int64_t of(BufferKind b) const {
    return b == BufferKind::Input ? input : b == BufferKind::Output ? output : scratch;
  }
};

struct Plan {
  std::string name;
  Collective collective = Collective::AllReduce;
  Protocol protocol = Protocol::Simple;
  bool inplace = false;
  std::int64_t worldSize = 0;
  Chunks chunks;
  std::int64_t minBytes = 0, maxBytes = 0;
  std::int64_t root = -1;  // broadcast only
  std::vector<RankPlan> ranks;
};

// A plan that breaks the format (code InvalidUsage). detail() is "<json path>: <message>[ (rank R)]",
// the same text as python/ferry/plan/load.py's PlanError; the fields locate it (-1: not known).
// kind is "out_of_range" for a chunk, channel or peer number past what exists, else "malformed".
class PlanError : public Error {
 public:
  PlanError(std::string path, const std::string& message, std::int64_t rank, std::int64_t threadBlock,
            std::int64_t opIndex, std::string kind);
  std::string path, kind;
  std::int64_t rank, threadBlock, opIndex;
};

// Parse and validate; every failure (bad JSON included) throws PlanError, nothing else escapes.
Plan loadPlan(std::string_view json);
// As loadPlan; an unreadable file or bad JSON names the file.
Plan loadPlanFile(const std::string& path);

}  // namespace ferry::executor
