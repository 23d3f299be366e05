// Chain algorithms, for large calls: the ranks in a chain, the message flowing along it in pieces.
//   reduce_chain     root + 1 -> root + 2 -> ... -> root - 1 -> root: each rank adds its input to
//                    the partial sum of a piece that its predecessor wrote into its scratch and
//                    writes the result into its successor's scratch; the root writes the total into
//                    its output. reduce_two_shot brings 2 (R - 1) / R of the message into the root
//                    (its share of the reduce-scatter, then every other rank's reduced chunk), in
//                    phases that follow each other: on 4 H200 it reached 0.63 of the best NCCL's
//                    time from 64 MiB (docs/measurements/h200x4-2026-11-26-issue24.md).
//   broadcast_chain  root -> root + 1 -> ... -> root - 1: each rank copies the piece its
//                    predecessor wrote into its scratch into its output and into its successor's
//                    scratch, reading it once. broadcast_scatter reached 0.78-0.82 of the best NCCL
//                    from 64 MiB in the same run.
//   reducescatter_ring  R chains at once, one per output: chunk c's runs c + 1 -> ... -> c. Rank r
//                    starts chain r - 1 with its own input, adds its input to the partial sums of
//                    the chains that pass it, and ends chain r in its output; the pieces of all
//                    chains go to the successor as one stream of messages. reducescatter_push
//                    copies in, waits, and reduces out in turns: 0.86-0.90 of the best NCCL from
//                    64 MiB in the same run.
//   allreduce_ring_pipelined  the same on R chunks of the buffer, each chunk's total then going
//                    on around the ring (c -> c + 1 -> ... -> c - 1), each rank copying it into its
//                    output and on to its successor, in the same stream. allreduce_two_shot and
//                    allreduce_ring (rounds, each a whole exchange) reached 0.93-0.96 from 256 MiB.
// Either way every link carries the message once (the ring: (R - 1) / R of the input), and all of
// them at once once the chain is full (R - 1 pieces in).
//
// A scratch half holds kSlots piece buffers, used by pieces in turn. Per block (a block moves the
// same bytes of every piece: ranges.hpp's roundPart rule), at signalValue(call, message, phase),
// a message being a piece in the chains and one step's piece of a chunk in the rings:
//   phase 1, rank -> successor: the piece is in the successor's buffer;
//   phase 2, rank -> predecessor: it has read the piece's buffer, which the predecessor may fill
//            again (with piece + kSlots). It publishes no data: a relaxed store after the block's
//            barrier, as the send/recv kernel's "slot freed" (docs/architecture.md, "Latency"), so
//            a piece costs each block one system-scope fence, not two.
// Phase 1 goes on the block's row (1 + block), phase 2 on a row of its own (freedRow): a rank
// signals both phases to its neighbours, which with two ranks are the same rank, and each row's
// values must keep rising.
#include <algorithm>

#include "collectives/builtin.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/ranges.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kSlots = 4;
// Pieces of at least this size keep the per-piece handshake small beside the piece's transfer
// (256 KiB at about 350 GB/s: 0.7 us, against about 1 us per handshake, which the pipeline hides).
constexpr std::uint64_t kMinPieceBytes = 256 << 10;
// Pieces per message: the chain fills in R - 1 pieces, so a message of at least 32 wastes at most
// (R - 1) / 32 of its time on the fill.
constexpr std::uint64_t kPiecesPerMessage = 32;

struct ChainArgs {
  const char* send;
  char* recv;
  std::uint64_t count;       // elements
  std::uint64_t pieceBytes;  // a multiple of 16
  int root;
  bool inPlace;
  std::uint64_t chunkElems = 0;  // the rings: one chunk (reducescatter_ring: count)
};

// The flag row of a block's phase-2 signals: past every block's own row.
FERRY_DEVICE FERRY_INLINE int freedRow() { return 1 + kMaxBlocks + static_cast<int>(blockIdx.x); }

// One step's handshake, before and after its work (every thread of the block calls both): message
// `in` from the predecessor (if it receives) and the successor's slot for message `out` (if it
// sends) are waited for; then the successor is told of `out` and the predecessor that `in`'s slot
// is free again.
FERRY_DEVICE FERRY_INLINE void awaitStep(const CollectiveContext& c, std::uint64_t m, bool receives,
                                         std::uint64_t in, bool sends, std::uint64_t out) {
  const int R = c.nranks, next = (c.rank + 1) % R, prev = (c.rank + R - 1) % R;
  if (threadIdx.x == 0) {
    if (receives) waitPeer(c, prev, signalValue(m, in, 1));
    if (sends && out >= kSlots)
      rowSemaphore(c, freedRow(), next).waitAt(signalValue(m, out - kSlots, 2), collectiveName(c.op));
  }
  __syncthreads();
}
FERRY_DEVICE FERRY_INLINE void endStep(const CollectiveContext& c, std::uint64_t m, bool receives,
                                       std::uint64_t in, bool sends, std::uint64_t out) {
  const int R = c.nranks, next = (c.rank + 1) % R, prev = (c.rank + R - 1) % R;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (sends) signalPeer(c, next, signalValue(m, out, 1));
    if (receives) rowSemaphore(c, freedRow(), prev).relaxedSignalAt(signalValue(m, in, 2));
  }
}

// The chain's walk for this rank, piece by piece (piece k is message k both ways): runs
// `work(piece, elements of this block, offset in a buffer)` between the handshakes. head: no
// predecessor; tail: no successor. Every thread of the block calls it.
template <class Work>
FERRY_DEVICE FERRY_INLINE void walkChain(const CollectiveContext& c, const CallStart& call, const ChainArgs& a,
                                         std::uint64_t elementBytes, bool head, bool tail, Work work) {
  const std::uint64_t grain = 16 / elementBytes, pieceElems = a.pieceBytes / elementBytes;
  const std::uint64_t pieces = (a.count + pieceElems - 1) / pieceElems;
  const std::uint64_t m = call.m;
  // Only the successor's scratch is written: it must have left the call that last used this half.
  awaitPeersStarted(c, call, tail ? 0u : 1u << (c.rank + 1) % c.nranks);
  for (std::uint64_t k = 0; k < pieces; ++k) {
    const std::uint64_t base = k * pieceElems, len = min(pieceElems, a.count - base);
    const Range part = roundPart(len, pieceElems, gridDim.x, blockIdx.x, grain);
    awaitStep(c, m, !head, k, !tail, k);
    work(Range{base + part.begin, base + part.end}, (k % kSlots) * a.pieceBytes + part.begin * elementBytes);
    endStep(c, m, !head, k, !tail, k);
  }
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) reduceChain(CollectiveContext c, ChainArgs a) {
  constexpr std::uint64_t sz = sizeof(T);
  constexpr ReduceOp Partial = Op == ReduceOp::Avg ? ReduceOp::Sum : Op;  // divide once, at the root
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank;
  const bool head = (r + R - 1) % R == a.root, atRoot = r == a.root;
  const char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[(r + 1) % R], c, m);
  walkChain(c, call, a, sz, head, atRoot, [&](Range el, std::uint64_t at) {
    const char* src[2] = {a.send + el.begin * sz, mine + at};
    char* dst[1] = {atRoot ? a.recv + el.begin * sz : theirs + at};
    if (atRoot)
      reduceSources<T, Op>(dst, 1, src, 2, R, el.size(), threadIdx.x, kThreads);
    else
      reduceSources<T, Partial>(dst, 1, src, head ? 1 : 2, R, el.size(), threadIdx.x, kThreads);
  });
  endCall(c, m);
}

// The input holds R chunks of a.chunkElems (the last may be shorter, or empty, in an allreduce);
// the output one (reduce-scatter: a.count == a.chunkElems) or R (AllGather: allreduce, a.count
// elements in all). Messages to the successor are numbered in the order they are sent (out), those
// from the predecessor in the order they are taken (in); message n uses slot n % kSlots of the
// receiver. For piece k of every chunk, step s of rank r:
//   s = 0             sends its input of chunk r - 1;
//   s = 1 .. R - 2    receives chunk r - 1 - s, adds its input, sends;
//   s = R - 1         receives chunk r, adds its input: the total, into its output (AllGather:
//                     and to the successor);
//   s = R .. 2R - 2   (AllGather) receives the total of chunk r - (s - R + 1), copies it into its
//                     output and, but for the last, on to the successor.
// An empty piece (past a short last chunk) is still a message, so both ends count alike. Every wait
// is for a message or a slot of a step that comes earlier in every rank's order, so the ring cannot
// deadlock.
template <class T, ReduceOp Op, bool AllGather>
__global__ void __launch_bounds__(kThreads) ringPipeline(CollectiveContext c, ChainArgs a) {
  constexpr std::uint64_t sz = sizeof(T), grain = 16 / sz;
  constexpr ReduceOp Partial = Op == ReduceOp::Avg ? ReduceOp::Sum : Op;  // divide once, at the end
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank, next = (r + 1) % R;
  const int last = AllGather ? 2 * R - 2 : R - 1;
  const std::uint64_t pieceElems = a.pieceBytes / sz;
  const std::uint64_t pieces = (a.chunkElems + pieceElems - 1) / pieceElems;
  const std::uint64_t elements = AllGather ? a.count : static_cast<std::uint64_t>(R) * a.count;
  const char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[next], c, m);
  awaitPeersStarted(c, call, 1u << next);
  std::uint64_t out = 0, in = 0;
  for (std::uint64_t k = 0; k < pieces; ++k) {
    for (int s = 0; s <= last; ++s) {
      const int chunk = s <= R - 1 ? (r - 1 - s + 2 * R) % R : (r - (s - R + 1) + 2 * R) % R;
      const bool receives = s > 0, sends = s < last;
      // This piece of the chunk, cut at the buffer's end; the block's part of it.
      const std::uint64_t at = static_cast<std::uint64_t>(chunk) * a.chunkElems + k * pieceElems;
      const std::uint64_t len = at < elements ? min(pieceElems, elements - at) : 0;
      const Range part = roundPart(min(len, a.chunkElems - k * pieceElems), pieceElems, gridDim.x, blockIdx.x, grain);
      awaitStep(c, m, receives, in, sends, out);
      const char* slot = mine + (in % kSlots) * a.pieceBytes + part.begin * sz;
      char* onward = theirs + (out % kSlots) * a.pieceBytes + part.begin * sz;
      // The output: reduce-scatter's is one chunk, allreduce's the whole buffer.
      char* output = a.recv + ((AllGather ? at : k * pieceElems) + part.begin) * sz;
      const char* src[2] = {a.send + (at + part.begin) * sz, slot};
      if (s < R - 1) {
        char* dst[1] = {onward};
        reduceSources<T, Partial>(dst, 1, src, receives ? 2 : 1, R, part.size(), threadIdx.x, kThreads);
      } else if (s == R - 1) {
        char* dst[2] = {output, onward};
        reduceSources<T, Op>(dst, sends ? 2 : 1, src, 2, R, part.size(), threadIdx.x, kThreads);
      } else {
        char* dst[2] = {output, onward};
        copyToMany(dst, sends ? 2 : 1, slot, part.size() * sz, threadIdx.x, kThreads);
      }
      endStep(c, m, receives, in, sends, out);
      out += sends ? 1 : 0;
      in += receives ? 1 : 0;
    }
  }
  endCall(c, m);
}

// Bytes, as the broadcast kernels move them (ChainArgs::count is in bytes here).
__global__ void __launch_bounds__(kThreads) broadcastChain(CollectiveContext c, ChainArgs a) {
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank, next = (r + 1) % R;
  const bool atRoot = r == a.root, tail = next == a.root;
  const char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[next], c, m);
  walkChain(c, call, a, 1, atRoot, tail, [&](Range el, std::uint64_t at) {
    char* dst[2];
    int nd = 0;
    if (!tail) dst[nd++] = theirs + at;
    if (!(atRoot && a.inPlace)) dst[nd++] = a.recv + el.begin;
    copyToMany(dst, nd, atRoot ? a.send + el.begin : mine + at, el.size(), threadIdx.x, kThreads);
  });
  endCall(c, m);
}

// A multiple of 16 bytes (every type's element and the kernels' grain): a 32nd of the message, at
// least kMinPieceBytes, at most a slot of the scratch half, and no larger than the message (blocks
// split a piece by its full size: a piece larger than the call would leave blocks idle).
std::uint64_t pieceBytes(std::uint64_t bytes, std::uint64_t scratchHalf) {
  const std::uint64_t slot = scratchHalf / kSlots / 16 * 16;
  const std::uint64_t want = std::max(kMinPieceBytes, (bytes / kPiecesPerMessage + 15) / 16 * 16);
  return std::min({want, slot, std::max<std::uint64_t>(16, (bytes + 15) / 16 * 16)});
}

// bytes: what is cut into pieces (the message; for the ring, one rank's output). messagesPerPiece:
// what a rank sends its successor per piece (the round field of a signal counts them).
std::string whyNotChain(std::uint64_t bytes, const CommLimits& limits, std::uint64_t messagesPerPiece) {
  if (limits.worldSize < 2) return "one rank: nothing to send";
  const std::uint64_t piece = pieceBytes(bytes, limits.scratchHalfBytes);
  if (piece < 16) return "the scratch is too small (FERRY_SCRATCH_BYTES)";
  if ((bytes + piece - 1) / piece * messagesPerPiece >= 1u << 17)
    return "it needs more than 131071 messages (raise FERRY_SCRATCH_BYTES)";
  return {};
}

ChainArgs chainArgs(const CollectiveCall& call, const CollectiveContext& context, std::uint64_t count,
                    std::uint64_t bytes) {
  return {static_cast<const char*>(call.send), static_cast<char*>(call.recv), count,
          pieceBytes(bytes, context.scratchHalfBytes), call.root, call.inPlace()};
}

// Blocks by the bytes of a piece, as the other scratch algorithms.
unsigned chainGrid(std::uint64_t bytes, const CollectiveContext& context) {
  return gridFor(context, pieceBytes(bytes, context.scratchHalfBytes), 8 << 10, 1, 64);
}

class ReduceChain final : public Algorithm {
 public:
  const char* name() const override { return "reduce_chain"; }
  Collective collective() const override { return Collective::Reduce; }
  bool reducesInRankOrder() const override { return false; }  // in chain order, from root + 1
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    return whyNotChain(call.bytes(), limits, 1);
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const ChainArgs args = chainArgs(call, context, call.count, call.bytes());
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      launchCollective(context.earlyLaunch, reduceChain<T, Op>, chainGrid(call.bytes(), context), kThreads,
                       call.stream, forCall(context, call), args);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(reduceChain<T, Op>); });
  }
};

// The output (one rank's chunk) is what is cut into pieces.
class ReduceScatterRing final : public Algorithm {
  static std::uint64_t outputBytes(const CollectiveCall& call) { return call.count * call.elementBytes(); }

 public:
  const char* name() const override { return "reducescatter_ring"; }
  Collective collective() const override { return Collective::ReduceScatter; }
  bool reducesInRankOrder() const override { return false; }  // each chunk's sum starts at the rank after it
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    return whyNotChain(outputBytes(call), limits, static_cast<std::uint64_t>(std::max(1, limits.worldSize - 1)));
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    ChainArgs args = chainArgs(call, context, call.count, outputBytes(call));
    args.chunkElems = call.count;
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      launchCollective(context.earlyLaunch, ringPipeline<T, Op, false>, chainGrid(outputBytes(call), context),
                       kThreads, call.stream, forCall(context, call), args);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(ringPipeline<T, Op, false>); });
  }
};

// R chunks of whole 16-byte grains (the last shorter, or empty); a chunk is cut into pieces.
class AllReduceRingPipelined final : public Algorithm {
  static std::uint64_t chunkElems(const CollectiveCall& call, int ranks) {
    return partSize(call.count, static_cast<std::uint64_t>(ranks), 16 / call.elementBytes());
  }
  static std::uint64_t chunkBytes(const CollectiveCall& call, int ranks) {
    return chunkElems(call, ranks) * call.elementBytes();
  }

 public:
  const char* name() const override { return "allreduce_ring_pipelined"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool reducesInRankOrder() const override { return false; }  // each chunk's sum starts at the rank after it
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    const int ranks = std::max(1, limits.worldSize);
    return whyNotChain(chunkBytes(call, ranks), limits, 2 * static_cast<std::uint64_t>(ranks - 1));
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    ChainArgs args = chainArgs(call, context, call.count, chunkBytes(call, context.nranks));
    args.chunkElems = chunkElems(call, context.nranks);
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      launchCollective(context.earlyLaunch, ringPipeline<T, Op, true>,
                       chainGrid(chunkBytes(call, context.nranks), context), kThreads, call.stream,
                       forCall(context, call), args);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(ringPipeline<T, Op, true>); });
  }
};

class BroadcastChain final : public Algorithm {
 public:
  const char* name() const override { return "broadcast_chain"; }
  Collective collective() const override { return Collective::Broadcast; }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    return whyNotChain(call.bytes(), limits, 1);
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    launchCollective(context.earlyLaunch, broadcastChain, chainGrid(call.bytes(), context), kThreads, call.stream,
                     forCall(context, call), chainArgs(call, context, call.bytes(), call.bytes()));
    checkLaunch(call, name());
  }
  void preload() const override { preloadKernel(broadcastChain); }
};

}  // namespace

const Algorithm& reduceChainAlgorithm() {
  static const ReduceChain algorithm;
  return algorithm;
}

const Algorithm& reduceScatterRingAlgorithm() {
  static const ReduceScatterRing algorithm;
  return algorithm;
}

const Algorithm& allReduceRingPipelinedAlgorithm() {
  static const AllReduceRingPipelined algorithm;
  return algorithm;
}

const Algorithm& broadcastChainAlgorithm() {
  static const BroadcastChain algorithm;
  return algorithm;
}

}  // namespace ferry
