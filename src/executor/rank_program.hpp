#pragma once
// One rank's part of a plan, flattened for the executor's kernel: every thread block's ops in one
// array, with each op's peer, flag slot and sequence number worked out on the host, so that the
// kernel only follows pointers. compileRankProgram also refuses what the kernel cannot run (the
// rules are listed beside it); the plan itself was checked by the loader and, for correctness, by
// the verifier.
//
//   RankProgram p = compileRankProgram(plan, rank);      // throws PlanError naming rank, tb and op
//   // upload p.ops, p.refs, p.tbFirst; launch p.threadBlocks() blocks
#include <cstdint>
#include <vector>

#include "ferry/device/macros.hpp"
#include "executor/plan.hpp"

namespace ferry::executor {

inline constexpr int kLocal = -1;  // ExecRef::rank of this rank's own buffer

// A chunk reference with the rank whose buffer it names resolved (kLocal or a peer).
struct ExecRef {
  std::int8_t buffer = 0;  // BufferKind
  std::int8_t rank = kLocal;
  std::int32_t index = 0;
  std::int32_t count = 0;
};

struct ExecOp {
  std::uint8_t kind = 0;  // OpKind
  std::int8_t peer = -1;  // the channel's peer; for unpack/reduce_packets, the packets' sender
  std::uint16_t slot = 0; // signal/wait: the channel's flag row (see rank_program.cpp)
  std::uint32_t seq = 0;  // signal/wait: 1 for the channel's first in this call, 2 for the next...
  ExecRef src, dst;
  std::uint32_t firstRef = 0;  // reduce/read_reduce_copy_send: refs[firstRef, +nsrcs) are the
  std::uint16_t nsrcs = 0;     // sources, then refs[firstRef + nsrcs, +nsends) the sends' peer
  std::uint16_t nsends = 0;    // destinations; the fused kinds (FusedKind, below) use them too
  std::uint8_t proxy = 0;      // put/signal/flush on a port channel: through the Comm's PortChannel to the peer
};

// Flag rows a plan's channels may use: rows 1 .. kMaxChannelSlots of the Comm's flags (row 0 is
// the call-start row; the last row, kFinalSlot, is the executor's own end-of-call exchange).
inline constexpr int kMaxChannelSlots = 126;
inline constexpr int kFinalSlot = 127;
// Sources of one reduce, and destinations of one read_reduce_copy_send (its dst plus sends).
inline constexpr int kMaxOpSources = 8;
inline constexpr int kMaxOpDestinations = 9;
inline constexpr int kMaxThreadBlocks = 128;
// The most ops one fused op stands for (fuseRankProgram): the executor unrolls a fused op over its
// run, and a longer run costs registers (docs/executor.md, "Fused ops").
inline constexpr int kMaxFusedRun = 4;

// Lanes: a plan's thread block may run as several CUDA blocks (lanes), lane l doing part l of every
// chunk each op touches (roundPart of the chunk, in whole 16-byte grains) and signalling and waiting
// on channel rows of its own, paired with lane l of the peer's thread block. Every element of a
// chunk then belongs to one lane in every op on every rank, so each lane is the plan itself run on
// a slice of the data, and the verifier's proof holds lane by lane.
// 64, as the native kernels' blocks: with 32, a one-thread-block plan ran on half their blocks
// (allreduce_two_shot 1.7 times allreduce_direct's time from 16 MiB on 4 H200).
inline constexpr int kMaxLanes = 64;
inline constexpr std::uint64_t kLaneBytes = 256 << 10;  // call bytes per lane
// LL plans take calls of at most a packet half (256 KiB by default): at kLaneBytes they ran on one
// block a thread block, and a 256 KiB all-pairs allreduce took 18 times the native LL kernel's time
// on 4 H200 (docs/measurements/h200x4-2026-11-26-issue24.md), which spreads words over up to 64 blocks.
inline constexpr std::uint64_t kLaneBytesLL = 8 << 10;

// The flag row of channel row `slot` (1 .. kMaxChannelSlots) in lane `lane`: lane 0 keeps the row;
// the others take rows past kFinalSlot.
FERRY_HOST_DEVICE constexpr int laneFlagRow(int slot, int lane) {
  return lane == 0 ? slot : kFinalSlot + 1 + (lane - 1) * kMaxChannelSlots + (slot - 1);
}

struct RankProgram {
  std::vector<ExecOp> ops;
  std::vector<ExecRef> refs;
  std::vector<std::uint32_t> tbFirst;  // thread block b runs ops[tbFirst[b], tbFirst[b + 1])
  // Some op of some rank reads or writes a peer's input or output (set for every rank by
  // PlanAlgorithm::add): the call's buffers must be registered (or staged: staging.hpp), and the
  // kernel learns the peers' addresses at its start (direct mode).
  bool touchesPeerBuffers = false;
  // Direct mode and not every access to a peer's buffers is waited out by that peer: the call then
  // ends with every rank telling every other that it is done. compileRankProgram sets it with
  // touchesPeerBuffers; PlanAlgorithm::add sets it for every rank alike, from peersWaitOutAccesses.
  bool finalExchange = false;
  bool usesPortChannels = false;  // some op of this rank puts, signals or flushes on a port channel
  // The whole plan's, alike on every rank (what planLanes and the block limit go by): the thread
  // blocks of the rank with the most, and whether any rank has a port channel.
  int widestRank = 1;
  bool planHasPortChannels = false;
  bool ll = false;  // the plan's protocol is LL (its lanes are kLaneBytesLL)
  int threadBlocks() const { return static_cast<int>(tbFirst.size()) - 1; }
};

// The lanes a call of `bytes` runs each thread block of `program`'s plan in, the same on every rank:
// one per kLaneBytes (kLaneBytesLL for LL plans), at most `maxLanes` (FERRY_PLAN_LANES, agreed by the
// Comm), and within `maxBlocks` (CommOptions) and kMaxThreadBlocks for the plan's widest rank. 1 for
// plans whose port channels go through the proxy (`portsOnProxy`): each lane's part of a put would be
// a request of its own, and on 4 H200 (2026-11-27), in lanes of 4 MiB, the hierarchical allgather
// and alltoall plans took 1.8 and 3.4 times their one-lane time at 1 GiB (allreduce 0.24 times:
// docs/executor.md, "Port channels on one host").
int planLanes(const RankProgram& program, std::uint64_t bytes, int maxLanes, int maxBlocks, bool portsOnProxy);

// Kinds the executor makes of runs of a plan's ops (fuseRankProgram), past the format's OpKind.
enum class FusedKind : std::uint8_t {
  // src's words as packets into every ref of refs[firstRef, +nsends) (peers' scratch): each word is
  // loaded once for all of them.
  PutPacketsToMany = 32,
  // dst = src reduced, in order, with the packets of refs[firstRef, +nsrcs), which lie in this
  // rank's scratch; each such ref's `rank` is the packets' sender (for the wait's error), not the
  // buffer's owner. Every sender's packet of a word is waited for at once (readPackets).
  ReducePacketsFromMany = 33,
  // The waits of refs[firstRef, +nsrcs), all at once (thread k waits on the k-th): each ref is one
  // wait, its `rank` the channel's peer, `count` its slot, `index` its seq (ExecOp's fields).
  WaitOnMany = 34,
};
// The most waits one WaitOnMany stands for: a thread each, and a block has at least this many.
inline constexpr int kMaxWaitRun = 32;

// Runs of ops of one thread block made one op each, with the same effect on every element as the
// run; the block barrier between the run's ops goes with them, and an LL plan's packets from many
// peers cost one memory round trip, not one each (docs/executor.md, "Fused ops"):
// - put_packets of one source (the same reference) to several peers' scratch, at most kMaxFusedRun;
// - a copy between the same chunks (index and count) of two local buffers, or nothing, then at most
//   kMaxFusedRun reduce_packets into that copy's destination (a run without a copy: at least two);
// - two to kMaxWaitRun waits, which then cost one flag round trip, not one each.
// Signals, barriers and every other op stay as they are. What peersWaitOutAccesses finds is taken
// before fusing (a fused run touches the buffers the run touched, and waits for what it waited
// for). Applied where FERRY_PLAN_FUSE=1.
void fuseRankProgram(RankProgram& program);

// Rules beyond the format, each refused with a PlanError naming rank, thread block and op:
// - a channel end is signalled from one thread block only and waited on from one thread block only
//   (the n-th signal is then well defined), at most 2^17 - 1 times per call;
// - at most 63 channels of one type from a rank to one peer (flag rows);
// - LL plans: a scratch chunk receives put_packets at most once per call and from one sender,
//   and scratch is touched by packet ops only (it lives in the packet region, where only packets
//   may be written); Simple plans have no packet ops;
// - no switch channels (NVLink multicast is never run by the executor);
// - a reduce has at most 8 sources, a read_reduce_copy_send at most 8 sends, each on a memory
//   channel;
// - at most 128 thread blocks.
RankProgram compileRankProgram(const Plan& plan, int rank);

// Whether the plan's own signals already keep every rank in the call until its peers are done with
// its input and output: for each thread block that reads or writes peer X's input or output, a
// later op of that block signals X, and X waits for that very signal. The executor then leaves
// out its end-of-call exchange (one round trip between the ranks). `programs`: every rank's, in
// rank order. A port-channel put counts as done once a later port-channel signal or flush of the
// block to that peer has flushed the channel.
bool peersWaitOutAccesses(const std::vector<RankProgram>& programs);

// Where chunks of a call lie. Input and output are made of groups (one per rank block where the
// collective has them: allgather's output, reducescatter's input, alltoall's both) of `groupChunks`
// chunks covering `groupElements` elements, `groupStride` elements apart; each chunk holds
// `chunkElements` = ceil(groupElements / groupChunks) except the last ones of a group, which hold
// what is left (possibly nothing). Scratch chunks are all `chunkElements` long. A round of a call
// (PlanRounds) is the same geometry over part of every group: its groupElements, the call's stride.
struct ChunkGeometry {
  std::uint64_t groupElements = 0;
  std::uint64_t groupChunks = 1;
  std::uint64_t chunkElements = 0;
  std::uint64_t groupStride = 0;
  FERRY_HOST_DEVICE bool uniform() const {
    return groupElements == groupChunks * chunkElements && groupStride == groupElements;
  }
  // First element of chunk k of the input or output.
  FERRY_HOST_DEVICE std::uint64_t offset(std::uint64_t k) const {
    return k / groupChunks * groupStride + k % groupChunks * chunkElements;
  }
  // Elements of chunk k of the input or output.
  FERRY_HOST_DEVICE std::uint64_t length(std::uint64_t k) const {
    const std::uint64_t begin = k % groupChunks * chunkElements;
    if (begin >= groupElements) return 0;
    const std::uint64_t left = groupElements - begin;
    return left < chunkElements ? left : chunkElements;
  }
};

// The geometry of a call of `count` elements (the API's count, as CollectiveCall has it), or of
// a round of `elements` of each group of such a call.
ChunkGeometry chunkGeometry(const Plan& plan, std::uint64_t count);
ChunkGeometry chunkGeometry(const Plan& plan, std::uint64_t count, std::uint64_t elements);

// A call whose scratch does not fit the room the Comm has for one call runs as several rounds, one
// kernel each: round i is the plan run on elements [i * elements, +elements) of every group (the
// last round takes what is left). Every collective a plan can have is element-wise across the
// groups' positions, so the rounds together compute the call; each round is a call of its own on
// the device (its own call number, signals and scratch half), so consecutive rounds are kept apart
// exactly as consecutive calls are. `elements` is 0 when even a round of one 16-byte grain per
// chunk does not fit.
struct PlanRounds {
  std::uint64_t elements = 0;  // per group, per round
  std::uint64_t count = 1;
};

// `room`: the bytes one call may use, a scratch half for Simple plans, the packet half (packets
// included) for LL plans.
PlanRounds planRounds(const Plan& plan, std::uint64_t count, std::uint64_t elementBytes, std::uint64_t room);

}  // namespace ferry::executor
