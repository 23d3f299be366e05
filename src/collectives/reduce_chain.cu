// reduce_chain: a reduce for large calls, where reduce_two_shot is bound by the root's incoming link.
//
// reduce_two_shot brings 2 (R - 1) / R of the message into the root (its share of the
// reduce-scatter, then every other rank's reduced chunk), in phases that follow each other: on 4
// H200 it reached 0.63 of the best NCCL's time from 64 MiB (docs/measurements/
// h200x4-2026-11-26-issue24.md). Here the ranks form a chain that ends at the root,
// root + 1 -> root + 2 -> ... -> root - 1 -> root, and the message flows along it in pieces: each
// rank adds its input to the partial sum of a piece that its predecessor wrote into its scratch and
// writes the result into its successor's scratch; the root writes the total into its output. Every
// link carries the message once, and all of them at once once the chain is full (R - 1 pieces in).
//
// A scratch half holds kSlots piece buffers, used by pieces in turn. Per block (a block adds the
// same bytes of every piece: ranges.hpp's roundPart rule), at signalValue(call, piece, phase):
//   phase 1, rank -> successor: the partial sum of the piece is in the successor's buffer;
//   phase 2, rank -> predecessor: it has read the piece's buffer, which the predecessor may fill
//            again (with piece + kSlots).
// Each directed pair carries one phase, so its values rise monotonically.
// The partial sums run in chain order, not rank order (reducesInRankOrder() is false).
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

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads)
    reduceChain(CollectiveContext c, const char* send, char* recv, std::uint64_t count, std::uint64_t pieceBytes,
                int root) {
  constexpr std::uint64_t sz = sizeof(T), grain = 16 / sz;
  constexpr ReduceOp Partial = Op == ReduceOp::Avg ? ReduceOp::Sum : Op;  // divide once, at the root
  const std::uint64_t m = beginCall(c);
  const int R = c.nranks, r = c.rank, next = (r + 1) % R, prev = (r + R - 1) % R;
  const bool head = prev == root, atRoot = r == root;
  const std::uint64_t pieceElems = pieceBytes / sz;
  const std::uint64_t pieces = (count + pieceElems - 1) / pieceElems;
  const char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[next], c, m);
  // Only the successor's scratch is written: it must have left the call that last used this half.
  awaitPeersStarted(c, m, atRoot ? 0u : 1u << next);
  for (std::uint64_t k = 0; k < pieces; ++k) {
    const std::uint64_t base = k * pieceElems, len = min(pieceElems, count - base);
    const Range part = roundPart(len, pieceElems, gridDim.x, blockIdx.x, grain);
    const std::uint64_t at = (k % kSlots) * pieceBytes + part.begin * sz;
    if (threadIdx.x == 0) {
      if (!head) waitPeer(c, prev, signalValue(m, k, 1));
      if (!atRoot && k >= kSlots) waitPeer(c, next, signalValue(m, k - kSlots, 2));
    }
    __syncthreads();
    const char* src[2] = {send + (base + part.begin) * sz, mine + at};
    char* dst[1] = {atRoot ? recv + (base + part.begin) * sz : theirs + at};
    if (atRoot)
      reduceSources<T, Op>(dst, 1, src, 2, R, part.size(), threadIdx.x, kThreads);
    else
      reduceSources<T, Partial>(dst, 1, src, head ? 1 : 2, R, part.size(), threadIdx.x, kThreads);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (!atRoot) signalPeer(c, next, signalValue(m, k, 1));
      if (!head) signalPeer(c, prev, signalValue(m, k, 2));
    }
  }
  endCall(c, m);
}

class ReduceChain final : public Algorithm {
 public:
  const char* name() const override { return "reduce_chain"; }
  Collective collective() const override { return Collective::Reduce; }
  bool reducesInRankOrder() const override { return false; }  // in chain order, from root + 1
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    if (limits.worldSize < 2) return "one rank: nothing to reduce";
    const std::uint64_t piece = pieceBytes(call.bytes(), limits.scratchHalfBytes);
    if (piece < 16) return "the scratch is too small (FERRY_SCRATCH_BYTES)";
    if ((call.bytes() + piece - 1) / piece >= 1u << 17)
      return "it needs more than 131071 pieces (raise FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const std::uint64_t piece = pieceBytes(call.bytes(), context.scratchHalfBytes);
    const unsigned grid = gridFor(context, std::min(piece, call.bytes()), 8 << 10, 1, 64);
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      launchCollective(context.earlyLaunch, reduceChain<T, Op>, grid, kThreads, call.stream, forCall(context, call),
                       static_cast<const char*>(call.send), static_cast<char*>(call.recv), call.count, piece,
                       call.root);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(reduceChain<T, Op>); });
  }

  // A multiple of 16 bytes (every type's element and the kernels' grain): a 32nd of the message,
  // at least kMinPieceBytes, at most a slot of the scratch half.
  static std::uint64_t pieceBytes(std::uint64_t bytes, std::uint64_t scratchHalf) {
    const std::uint64_t slot = scratchHalf / kSlots / 16 * 16;
    const std::uint64_t want = std::max(kMinPieceBytes, (bytes / kPiecesPerMessage + 15) / 16 * 16);
    return std::min(want, slot);
  }
};

}  // namespace

const Algorithm& reduceChainAlgorithm() {
  static const ReduceChain algorithm;
  return algorithm;
}

}  // namespace ferry
