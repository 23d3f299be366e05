// AllReduce algorithms:
//   allreduce_ll        one shot with LL16 packets: every rank writes its whole input into every
//                       peer's packet slot, then reduces what arrived. One hop, no separate signal:
//                       for small calls, where latency is everything.
//   allreduce_two_shot  reduce-scatter then all-gather through the peers' scratch (Simple protocol):
//                       rank r pushes chunk j of its input to rank j, reduces its own chunk from
//                       what arrived, pushes the result to every peer and copies theirs out. Calls
//                       larger than the scratch run in rounds.
//   allreduce_ring      the textbook ring, for comparison: R - 1 reduce-scatter steps then R - 1
//                       all-gather steps, each rank writing only into the next rank's scratch. Its
//                       sums run in ring order, not rank order, so float results may differ from the
//                       other algorithms' in the last bits (every rank still gets the same bits).
//
// Reduce algorithms, the first two on the same kernels with a root (root < 0: allreduce):
//   reduce_ll           every rank but the root writes its input into the root's packet slot; the
//                       root reduces what arrived.
//   reduce_two_shot     reduce-scatter as above, then every rank pushes its reduced chunk to the
//                       root only, so the root's links carry each byte twice rather than R - 1 times.
// (reduce_chain, in chain.cu, brings each byte into the root once.)
#include "collectives/builtin.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/packet_reduce.cuh"
#include "ferry/device/copy.hpp"
#include "ferry/device/packet.hpp"

namespace ferry {
namespace {

FERRY_DEVICE FERRY_INLINE LL16Packet* slotPackets(char* region, const CollectiveContext& c, std::uint64_t m,
                                                  int slot) {
  return reinterpret_cast<LL16Packet*>(llHalf(region, c, m) + static_cast<std::uint64_t>(slot) * c.llSlotBytes);
}

// The peers a rank sends its input (or reduced chunk) to: every one, or a reduce's root.
FERRY_DEVICE FERRY_INLINE unsigned receiversOf(int rank, int root) {
  return root < 0 ? ~0u : rank == root ? 0u : 1u << root;
}

// Wide: float32 accumulation (WordAccumulator).
template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    allReduceLL(CollectiveContext c, const char* send, char* recv, std::uint64_t bytes, int root) {
  const int R = c.nranks, r = c.rank;
  const unsigned receivers = receiversOf(r, root);
  const Range part = splitRange((bytes + 7) / 8, gridDim.x, blockIdx.x, 1);
  // This thread's first word is loaded beside the call's count and the peers' start words (at
  // small sizes it is every word).
  const std::uint64_t w0 = part.begin + threadIdx.x;
  std::uint64_t first = 0;
  const CallStart call = beginCall(c, [&] {
    if (w0 < part.end) first = loadWord(send, w0, bytes);
  });
  const std::uint64_t m = call.m;
  const auto flag = static_cast<std::uint32_t>(m);
  if (receivers != 0) awaitPeersStarted(c, call, receivers);
  for (std::uint64_t w = w0; w < part.end; w += kThreads) {
    const std::uint64_t v = w == w0 ? first : loadWord(send, w, bytes);
    for (int i = 1; i < R; ++i) {
      const int p = (r + i) % R;
      if (receivers >> p & 1) slotPackets(c.peerLl[p], c, m, r)[w].write(v, flag);
    }
  }
  if (root >= 0 && r != root) {
    endCall(c, m);
    return;
  }
  // Every peer's packet of a word at once, reduced in rank order with this rank's own word
  // (reduceInRankOrder).
  withRankCapacity(R, [&]<int kCap>() {
    for (std::uint64_t w = w0; w < part.end; w += kThreads) {
      const std::uint64_t own = w == w0 ? first : loadWord(send, w, bytes);
      const std::uint64_t sum = reduceInRankOrder<T, Op, kCap, Wide>(
          c, flag, own, [&](int q) { return &slotPackets(c.ll, c, m, q)[w]; });
      storeWord(recv, w, bytes, sum);
    }
  });
  endCall(c, m);
}

// Scratch half: [phase-1 slots: R x slotBytes][phase-2 slots: R x slotBytes]. Slot q of phase 1
// holds the part of this rank's chunk that rank q sent; slot q of phase 2, rank q's reduced chunk.
// root >= 0 (reduce): phase 2 goes to the root only, and only the root copies out. Wide: float32
// accumulation (WordAccumulator): every element of a chunk is reduced in one place, from all ranks.
template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    allReduceTwoShot(CollectiveContext c, const char* send, char* recv, std::uint64_t count,
                     std::uint64_t slotBytes, int root) {
  constexpr std::uint64_t sz = sizeof(T), grain = 16 / sz;
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank;
  const unsigned receivers = receiversOf(r, root);
  const bool outputHere = root < 0 || r == root;
  const std::uint64_t roundElems = slotBytes / sz * R;
  const std::uint64_t rounds = (count + roundElems - 1) / roundElems;
  const std::uint64_t fullChunk = partSize(min(roundElems, count), R, grain);
  char* mine = scratchHalf(c.scratch, c, m);
  for (std::uint64_t k = 0; k < rounds; ++k) {
    if (k == 0)
      awaitPeersStarted(c, call);
    else
      exchangeSignals(c, signalValue(m, k - 1, 3));  // peers are done with the previous round's slots
    const std::uint64_t base = k * roundElems, len = min(roundElems, count - base);
    const std::uint64_t chunk = partSize(len, R, grain);
    const Range part = roundPart(chunk, fullChunk, gridDim.x, blockIdx.x, grain);
    // Elements [begin, end) of chunk j handled by this block, clipped to the round.
    auto clip = [&](int j) {
      const std::uint64_t b = min(j * chunk + part.begin, len), e = min(j * chunk + part.end, len);
      return Range{base + b, base + e};
    };
    for (int i = 1; i < R; ++i) {
      const int j = (r + i) % R;
      const Range el = clip(j);
      copy(scratchHalf(c.peerScratch[j], c, m) + r * slotBytes + part.begin * sz, send + el.begin * sz,
           el.size() * sz, threadIdx.x, kThreads);
    }
    exchangeSignals(c, signalValue(m, k, 1));
    {
      const Range el = clip(r);
      const char* src[kMaxRanks];
      char* dst[kMaxRanks + 1];
      for (int q = 0; q < R; ++q) src[q] = q == r ? send + el.begin * sz : mine + q * slotBytes + part.begin * sz;
      int nd = 0;
      if (outputHere) dst[nd++] = recv + el.begin * sz;
      for (int i = 1; i < R; ++i) {
        const int p = (r + i) % R;
        if (receivers >> p & 1)
          dst[nd++] = scratchHalf(c.peerScratch[p], c, m) + (R + r) * slotBytes + part.begin * sz;
      }
      reduceSources<T, Op, Wide>(dst, nd, src, R, R, el.size(), threadIdx.x, kThreads);
    }
    // Each receiver waits for every rank that sends it a reduced chunk.
    signalAndWait(c, signalValue(m, k, 2), receivers, outputHere ? ~0u : 0u);
    if (!outputHere) continue;
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;
      const Range el = clip(q);
      copy(recv + el.begin * sz, mine + (R + q) * slotBytes + part.begin * sz, el.size() * sz, threadIdx.x,
           kThreads);
    }
  }
  endCall(c, m);
}

// Scratch half: 2R - 2 slots, one per step; step s of a round writes slot s of the next rank.
// Flags: this block writes to the next rank "step s of round k is in your slot s" (phase 1 of
// sub-round 16k + s) and to the previous rank "I have read all of round k" (16k + 15); both rise
// monotonically per (writer, reader) pair, also when the two ranks are the same (two ranks).
template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads)
    allReduceRing(CollectiveContext c, const char* send, char* recv, std::uint64_t count, std::uint64_t slotBytes) {
  constexpr std::uint64_t sz = sizeof(T), grain = 16 / sz;
  constexpr ReduceOp Partial = Op == ReduceOp::Avg ? ReduceOp::Sum : Op;  // divide once, at the end
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank, next = (r + 1) % R, prev = (r + R - 1) % R;
  const std::uint64_t roundElems = slotBytes / sz * R;
  const std::uint64_t rounds = (count + roundElems - 1) / roundElems;
  const std::uint64_t fullChunk = partSize(min(roundElems, count), R, grain);
  char* mine = scratchHalf(c.scratch, c, m);
  char* theirs = scratchHalf(c.peerScratch[next], c, m);
  auto dataReady = [&](std::uint64_t k, int step) { return signalValue(m, 16 * k + step, 1); };
  auto waitPrev = [&](std::uint64_t value) {
    if (threadIdx.x == 0) waitPeer(c, prev, value);
    __syncthreads();
  };
  auto signal = [&](int peer, std::uint64_t value) {
    __syncthreads();
    if (threadIdx.x == 0) signalPeer(c, peer, value);
  };
  awaitPeersStarted(c, call, 1u << next);
  for (std::uint64_t k = 0; k < rounds; ++k) {
    if (k > 0) {
      if (threadIdx.x == 0) waitPeer(c, next, signalValue(m, 16 * (k - 1) + 15, 1));
      __syncthreads();
    }
    const std::uint64_t base = k * roundElems, len = min(roundElems, count - base);
    const std::uint64_t chunk = partSize(len, R, grain);
    const Range part = roundPart(chunk, fullChunk, gridDim.x, blockIdx.x, grain);
    auto clip = [&](int j) {
      const std::uint64_t b = min(j * chunk + part.begin, len), e = min(j * chunk + part.end, len);
      return Range{base + b, base + e};
    };
    auto slot = [&](char* region, int step) { return region + step * slotBytes + part.begin * sz; };
    // Reduce-scatter: at step s this rank adds its part of chunk r - s to what came from prev.
    for (int s = 0; s < R - 1; ++s) {
      const Range el = clip((r - s + R) % R);
      if (s > 0) waitPrev(dataReady(k, s - 1));
      const char* src[2] = {send + el.begin * sz, s > 0 ? slot(mine, s - 1) : nullptr};
      char* dst[1] = {slot(theirs, s)};
      reduceSources<T, Partial>(dst, 1, src, s > 0 ? 2 : 1, R, el.size(), threadIdx.x, kThreads);
      signal(next, dataReady(k, s));
    }
    // The last addition completes chunk r + 1: into recv, and to next as all-gather step 0.
    {
      const Range el = clip((r + 1) % R);
      waitPrev(dataReady(k, R - 2));
      const char* src[2] = {send + el.begin * sz, slot(mine, R - 2)};
      char* dst[2] = {recv + el.begin * sz, slot(theirs, R - 1)};
      reduceSources<T, Op>(dst, 2, src, 2, R, el.size(), threadIdx.x, kThreads);
      signal(next, dataReady(k, R - 1));
    }
    // All-gather step t brings chunk r - t from prev (slot R - 1 + t); all but the last go on.
    for (int t = 0; t < R - 1; ++t) {
      const Range el = clip((r - t + R) % R);
      const bool forward = t < R - 2;
      waitPrev(dataReady(k, R - 1 + t));
      const char* src[1] = {slot(mine, R - 1 + t)};
      char* dst[2] = {recv + el.begin * sz, slot(theirs, R + t)};
      reduceSources<T, ReduceOp::Sum>(dst, forward ? 2 : 1, src, 1, R, el.size(), threadIdx.x, kThreads);
      if (forward) signal(next, dataReady(k, R + t));
    }
    signal(prev, signalValue(m, 16 * k + 15, 1));  // done reading this round's slots
  }
  endCall(c, m);
}

// A reduce's root, or -1 for an allreduce: what the shared kernels take.
int rootOf(const CollectiveCall& call) { return call.collective == Collective::Reduce ? call.root : -1; }

class AllReduceLL final : public Algorithm {
 public:
  AllReduceLL(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  bool sumsInFloat32() const override { return true; }
  std::string constraints(const CommLimits& limits) const override {
    return "up to " + std::to_string(limits.llSlotDataBytes) + " bytes (FERRY_LL_BYTES)";
  }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    if (call.bytes() > limits.llSlotDataBytes)
      return std::to_string(call.bytes()) + " bytes exceed the LL slot of " +
             std::to_string(limits.llSlotDataBytes) + " (FERRY_LL_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const std::uint64_t bytes = call.bytes();
    const unsigned grid = gridFor(context, (bytes + 7) / 8, kThreads, 1, 64);
    dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
      launchCollective(context.earlyLaunch, allReduceLL<T, Op, Wide>, grid, kThreads, call.stream,
                       forCall(context, call), static_cast<const char*>(call.send),
                       static_cast<char*>(call.recv), bytes, rootOf(call));
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryAccumulation([&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(allReduceLL<T, Op, Wide>); });
  }

 private:
  const char* name_;
  Collective collective_;
};

class AllReduceRing final : public Algorithm {
 public:
  const char* name() const override { return "allreduce_ring"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool reducesInRankOrder() const override { return false; }  // each chunk's sum starts at its own rank
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    const std::uint64_t slot = slotBytes(limits);
    if (slot < 16) return "the scratch is too small (FERRY_SCRATCH_BYTES)";
    // 16 flag values per round within the 17 bits of a signal's round field.
    const std::uint64_t roundBytes = slot * static_cast<std::uint64_t>(limits.worldSize);
    if ((call.bytes() + roundBytes - 1) / roundBytes >= (1u << 17) / 16)
      return "it needs more than 8191 scratch rounds (raise FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const std::uint64_t slot = slotBytes({context.nranks, 0, context.scratchHalfBytes});
    const std::uint64_t chunkBytes = std::min<std::uint64_t>(slot, call.bytes() / context.nranks + 16);
    const unsigned grid = gridFor(context, chunkBytes, 8 << 10, 1, 32);
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      launchCollective(context.earlyLaunch, allReduceRing<T, Op>, grid, kThreads, call.stream,
                       forCall(context, call), static_cast<const char*>(call.send),
                       static_cast<char*>(call.recv), call.count, slot);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(allReduceRing<T, Op>); });
  }

 private:
  // 2R - 2 slots of one step each.
  static std::uint64_t slotBytes(const CommLimits& limits) {
    return limits.scratchHalfBytes / (2 * static_cast<std::uint64_t>(limits.worldSize) - 2) / 16 * 16;
  }
};

class AllReduceTwoShot final : public Algorithm {
 public:
  AllReduceTwoShot(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  bool sumsInFloat32() const override { return true; }
  std::string whyNot(const CollectiveCall&, const CommLimits& limits) const override {
    if (slotBytes(limits) < 16) return "the scratch is too small (FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const std::uint64_t slot = slotBytes({context.nranks, 0, context.scratchHalfBytes});
    const std::uint64_t chunkBytes = std::min<std::uint64_t>(slot, call.bytes() / context.nranks + 16);
    const unsigned grid = gridFor(context, chunkBytes, 8 << 10, 1, 64);
    dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
      launchCollective(context.earlyLaunch, allReduceTwoShot<T, Op, Wide>, grid, kThreads, call.stream,
                       forCall(context, call), static_cast<const char*>(call.send),
                       static_cast<char*>(call.recv), call.count, slot, rootOf(call));
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryAccumulation(
        [&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(allReduceTwoShot<T, Op, Wide>); });
  }

 private:
  const char* name_;
  Collective collective_;
  static std::uint64_t slotBytes(const CommLimits& limits) {
    return limits.scratchHalfBytes / (2 * static_cast<std::uint64_t>(limits.worldSize)) / 16 * 16;
  }
};

}  // namespace

std::vector<const Algorithm*> allReduceAlgorithms() {
  static const AllReduceLL ll("allreduce_ll", Collective::AllReduce);
  static const AllReduceTwoShot twoShot("allreduce_two_shot", Collective::AllReduce);
  static const AllReduceRing ring;
  return {&ll, &twoShot, &ring, &allReduceRingPipelinedAlgorithm()};
}

std::vector<const Algorithm*> reduceAlgorithms() {
  static const AllReduceLL ll("reduce_ll", Collective::Reduce);
  static const AllReduceTwoShot twoShot("reduce_two_shot", Collective::Reduce);
  return {&ll, &twoShot, &reduceChainAlgorithm()};
}

}  // namespace ferry
