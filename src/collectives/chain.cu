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
// Either way every link carries the message once, and all of them at once once the chain is full
// (R - 1 pieces in): as a pipelined ring, with the ring's one hop per piece and rank.
//
// A scratch half holds kSlots piece buffers, used by pieces in turn. Per block (a block moves the
// same bytes of every piece: ranges.hpp's roundPart rule), at signalValue(call, piece, phase):
//   phase 1, rank -> successor: the piece is in the successor's buffer;
//   phase 2, rank -> predecessor: it has read the piece's buffer, which the predecessor may fill
//            again (with piece + kSlots). It publishes no data: a relaxed store after the block's
//            barrier, as the send/recv kernel's "slot freed" (docs/architecture.md, "Latency"), so
//            a piece costs each block one system-scope fence, not two.
// Each directed pair carries one phase, so its values rise monotonically.
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
};

// The chain's walk for this rank, piece by piece: waits for the piece (from the predecessor) and
// for the successor's buffer, runs `work(piece, elements of this block, offset in a buffer)`, then
// tells both. head: no predecessor; tail: no successor. Every thread of the block calls it.
template <class Work>
FERRY_DEVICE FERRY_INLINE void walkChain(const CollectiveContext& c, std::uint64_t m, const ChainArgs& a,
                                         std::uint64_t elementBytes, bool head, bool tail, Work work) {
  const int R = c.nranks, next = (c.rank + 1) % R, prev = (c.rank + R - 1) % R;
  const std::uint64_t grain = 16 / elementBytes, pieceElems = a.pieceBytes / elementBytes;
  const std::uint64_t pieces = (a.count + pieceElems - 1) / pieceElems;
  // Only the successor's scratch is written: it must have left the call that last used this half.
  awaitPeersStarted(c, m, tail ? 0u : 1u << next);
  for (std::uint64_t k = 0; k < pieces; ++k) {
    const std::uint64_t base = k * pieceElems, len = min(pieceElems, a.count - base);
    const Range part = roundPart(len, pieceElems, gridDim.x, blockIdx.x, grain);
    if (threadIdx.x == 0) {
      if (!head) waitPeer(c, prev, signalValue(m, k, 1));
      if (!tail && k >= kSlots) waitPeer(c, next, signalValue(m, k - kSlots, 2));
    }
    __syncthreads();
    work(Range{base + part.begin, base + part.end}, (k % kSlots) * a.pieceBytes + part.begin * elementBytes);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (!tail) signalPeer(c, next, signalValue(m, k, 1));
      if (!head) rowSemaphore(c, 1 + static_cast<int>(blockIdx.x), prev).relaxedSignalAt(signalValue(m, k, 2));
    }
  }
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) reduceChain(CollectiveContext c, ChainArgs a) {
  constexpr std::uint64_t sz = sizeof(T);
  constexpr ReduceOp Partial = Op == ReduceOp::Avg ? ReduceOp::Sum : Op;  // divide once, at the root
  const std::uint64_t m = beginCall(c);
  const int R = c.nranks, r = c.rank;
  const bool head = (r + R - 1) % R == a.root, atRoot = r == a.root;
  const char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[(r + 1) % R], c, m);
  walkChain(c, m, a, sz, head, atRoot, [&](Range el, std::uint64_t at) {
    const char* src[2] = {a.send + el.begin * sz, mine + at};
    char* dst[1] = {atRoot ? a.recv + el.begin * sz : theirs + at};
    if (atRoot)
      reduceSources<T, Op>(dst, 1, src, 2, R, el.size(), threadIdx.x, kThreads);
    else
      reduceSources<T, Partial>(dst, 1, src, head ? 1 : 2, R, el.size(), threadIdx.x, kThreads);
  });
  endCall(c, m);
}

// Bytes, as the broadcast kernels move them (ChainArgs::count is in bytes here).
__global__ void __launch_bounds__(kThreads) broadcastChain(CollectiveContext c, ChainArgs a) {
  const std::uint64_t m = beginCall(c);
  const int R = c.nranks, r = c.rank, next = (r + 1) % R;
  const bool atRoot = r == a.root, tail = next == a.root;
  const char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[next], c, m);
  walkChain(c, m, a, 1, atRoot, tail, [&](Range el, std::uint64_t at) {
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

std::string whyNotChain(const CollectiveCall& call, const CommLimits& limits) {
  if (limits.worldSize < 2) return "one rank: nothing to send";
  const std::uint64_t piece = pieceBytes(call.bytes(), limits.scratchHalfBytes);
  if (piece < 16) return "the scratch is too small (FERRY_SCRATCH_BYTES)";
  if ((call.bytes() + piece - 1) / piece >= 1u << 17)
    return "it needs more than 131071 pieces (raise FERRY_SCRATCH_BYTES)";
  return {};
}

ChainArgs chainArgs(const CollectiveCall& call, const CollectiveContext& context, std::uint64_t count) {
  return {static_cast<const char*>(call.send), static_cast<char*>(call.recv), count,
          pieceBytes(call.bytes(), context.scratchHalfBytes), call.root, call.inPlace()};
}

// Blocks by the bytes of a piece, as the other scratch algorithms.
unsigned chainGrid(const CollectiveCall& call, const CollectiveContext& context) {
  return gridFor(context, pieceBytes(call.bytes(), context.scratchHalfBytes), 8 << 10, 1, 64);
}

class ReduceChain final : public Algorithm {
 public:
  const char* name() const override { return "reduce_chain"; }
  Collective collective() const override { return Collective::Reduce; }
  bool reducesInRankOrder() const override { return false; }  // in chain order, from root + 1
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    return whyNotChain(call, limits);
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const ChainArgs args = chainArgs(call, context, call.count);
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      launchCollective(context.earlyLaunch, reduceChain<T, Op>, chainGrid(call, context), kThreads, call.stream,
                       forCall(context, call), args);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(reduceChain<T, Op>); });
  }
};

class BroadcastChain final : public Algorithm {
 public:
  const char* name() const override { return "broadcast_chain"; }
  Collective collective() const override { return Collective::Broadcast; }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    return whyNotChain(call, limits);
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    launchCollective(context.earlyLaunch, broadcastChain, chainGrid(call, context), kThreads, call.stream,
                     forCall(context, call), chainArgs(call, context, call.bytes()));
    checkLaunch(call, name());
  }
  void preload() const override { preloadKernel(broadcastChain); }
};

}  // namespace

const Algorithm& reduceChainAlgorithm() {
  static const ReduceChain algorithm;
  return algorithm;
}

const Algorithm& broadcastChainAlgorithm() {
  static const BroadcastChain algorithm;
  return algorithm;
}

}  // namespace ferry
