// broadcast_scatter: a broadcast for large calls, where broadcast_push is bound by the root's
// outgoing link (it sends the whole message to every peer: R - 1 copies).
//
// Each round's chunk is cut into one piece per non-root rank (its owner). The root writes each
// piece once, into its owner's scratch (scatter); each owner then writes its piece into every other
// non-root's scratch (all-gather) and every non-root copies the chunk out. So the root sends the
// message once and every link carries at most the message once, as in a pipelined ring, with no
// ring's hops: a piece reaches every rank in two.
//
// The two phases overlap: a scratch half holds two chunk buffers, used by alternate rounds, so the
// root scatters round k + 1 while the owners exchange round k. The signals, per block (a block
// moves the same bytes of each piece every round: ranges.hpp's roundPart rule), at
// signalValue(call, round, phase):
//   phase 1, root -> owners: the round's pieces are in the owners' buffers;
//   phase 2, owner -> other owners: its piece is in their buffers;
//   phase 3, non-root -> everyone who writes to it: it copied the round out, its buffer is free
//            (the writer waits for round k - 2's before it writes round k, which uses that buffer).
#include "collectives/builtin.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/ranges.hpp"
#include "ferry/device/copy.hpp"

namespace ferry {
namespace {

struct BroadcastArgs {
  const char* send;  // the root's data (== recv in place)
  char* recv;
  std::uint64_t bytes;
  std::uint64_t chunkBytes;  // one round; a scratch half holds two
  int root;
  bool inPlace;
};

// The bytes of piece `owner` (of `owners` pieces of a full chunk) that this block moves, cut at a
// round of `len` bytes; the same place in the buffer every round.
FERRY_DEVICE FERRY_INLINE Range blockPart(const BroadcastArgs& a, int owner, int owners, std::uint64_t len) {
  const Range piece = splitRange(a.chunkBytes, owners, owner, 16);
  const Range sub = splitRange(piece.size(), gridDim.x, blockIdx.x, 16);
  const std::uint64_t b = piece.begin + sub.begin, e = piece.begin + sub.end;
  return {b < len ? b : len, e < len ? e : len};
}

// The whole block: signal the peers in `mask` at `value`, after every write of the block so far.
FERRY_DEVICE FERRY_INLINE void signalPeers(const CollectiveContext& c, std::uint64_t value, unsigned mask) {
  signalAndWait(c, value, mask, 0u);
}
// The whole block: wait until every peer in `mask` reached `value`.
FERRY_DEVICE FERRY_INLINE void waitPeers(const CollectiveContext& c, std::uint64_t value, unsigned mask) {
  signalAndWait(c, value, 0u, mask);
}

__global__ void __launch_bounds__(kThreads) broadcastScatter(CollectiveContext c, BroadcastArgs a) {
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank, owners = R - 1;
  const unsigned nonRoots = ((1u << R) - 1) & ~(1u << a.root);
  const unsigned otherOwners = nonRoots & ~(1u << r);  // the root: every owner
  const auto ownerOf = [&](int rank) { return (rank - a.root - 1 + R) % R; };
  const std::uint64_t rounds = (a.bytes + a.chunkBytes - 1) / a.chunkBytes;
  char* const mine = scratchHalf(c.scratch, c, m);
  // Peers whose halves of call m this rank writes must have started call m - 1.
  awaitPeersStarted(c, call, otherOwners);
  for (std::uint64_t k = 0; k < rounds; ++k) {
    const std::uint64_t off = k * a.chunkBytes, len = min(a.chunkBytes, a.bytes - off);
    const std::uint64_t buffer = (k & 1) * a.chunkBytes;
    if (r == a.root) {
      if (k >= 2) waitPeers(c, signalValue(m, k - 2, 3), nonRoots);
      for (int i = 1; i < R; ++i) {
        const int j = (r + i) % R;
        const Range p = blockPart(a, ownerOf(j), owners, len);
        copy(scratchHalf(c.peerScratch[j], c, m) + buffer + p.begin, a.send + off + p.begin, p.size(), threadIdx.x,
             kThreads);
      }
      if (!a.inPlace)
        for (int o = 0; o < owners; ++o) {
          const Range p = blockPart(a, o, owners, len);
          copy(a.recv + off + p.begin, a.send + off + p.begin, p.size(), threadIdx.x, kThreads);
        }
      signalPeers(c, signalValue(m, k, 1), nonRoots);
      continue;
    }
    waitPeers(c, signalValue(m, k, 1), 1u << a.root);
    if (k >= 2) waitPeers(c, signalValue(m, k - 2, 3), otherOwners);
    const Range p = blockPart(a, ownerOf(r), owners, len);
    const char* piece = mine + buffer + p.begin;
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;
      if (otherOwners >> q & 1)
        copy(scratchHalf(c.peerScratch[q], c, m) + buffer + p.begin, piece, p.size(), threadIdx.x, kThreads);
    }
    copy(a.recv + off + p.begin, piece, p.size(), threadIdx.x, kThreads);
    signalAndWait(c, signalValue(m, k, 2), otherOwners, otherOwners);
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;
      if (!(otherOwners >> q & 1)) continue;
      const Range pq = blockPart(a, ownerOf(q), owners, len);
      copy(a.recv + off + pq.begin, mine + buffer + pq.begin, pq.size(), threadIdx.x, kThreads);
    }
    signalPeers(c, signalValue(m, k, 3), otherOwners | 1u << a.root);
  }
  endCall(c, m);
}

class BroadcastScatter final : public Algorithm {
 public:
  const char* name() const override { return "broadcast_scatter"; }
  Collective collective() const override { return Collective::Broadcast; }
  std::string whyNot(const CollectiveCall&, const CommLimits& limits) const override {
    if (limits.worldSize < 2) return "one rank: nothing to send";
    if (chunkBytes(limits.scratchHalfBytes, limits.worldSize) < 16)
      return "the scratch is too small (FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const BroadcastArgs args{static_cast<const char*>(call.send),
                             static_cast<char*>(call.recv),
                             call.count * call.elementBytes(),
                             chunkBytes(context.scratchHalfBytes, context.nranks),
                             call.root,
                             call.inPlace()};
    // Blocks by the bytes of one owner's piece: what a non-root sends each peer per round.
    const std::uint64_t piece =
        std::min(args.chunkBytes, args.bytes) / static_cast<std::uint64_t>(std::max(1, context.nranks - 1));
    const unsigned grid = gridFor(context, piece, 8 << 10, 1, 64);
    launchCollective(context.earlyLaunch, broadcastScatter, grid, kThreads, call.stream,
                     forCall(context, call), args);
    checkLaunch(call, name());
  }
  void preload() const override { preloadKernel(broadcastScatter); }

 private:
  // Two chunk buffers per scratch half; a multiple of 16 per owner's piece.
  static std::uint64_t chunkBytes(std::uint64_t half, int worldSize) {
    const auto grain = 16 * static_cast<std::uint64_t>(std::max(1, worldSize - 1));
    return half / 2 / grain * grain;
  }
};

}  // namespace

const Algorithm& broadcastScatterAlgorithm() {
  static const BroadcastScatter algorithm;
  return algorithm;
}

}  // namespace ferry
