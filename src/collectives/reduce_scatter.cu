// ReduceScatter algorithms:
//   reducescatter_ll    every rank writes block p of its input as LL16 packets into rank p's slot;
//                       each rank reduces the packets that arrived with its own block. One hop.
//   reducescatter_push  the same through the peers' scratch (Simple protocol), with one signal per
//                       block of threads; calls larger than the scratch run in rounds.
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

// bytes: of one block (the output). Wide: float32 accumulation (WordAccumulator).
template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    reduceScatterLL(CollectiveContext c, const char* send, char* recv, std::uint64_t bytes) {
  const int R = c.nranks, r = c.rank;
  const Range part = splitRange((bytes + 7) / 8, gridDim.x, blockIdx.x, 1);
  // Block p of the input goes to rank p, the i-th peer after this rank ((r + i) % R): word i of a
  // thread's round. Every peer's word is loaded before any is stored, the first round's at the
  // call's start (copy_collectives.cu, copyLL).
  const std::uint64_t w0 = part.begin + threadIdx.x;
  std::uint64_t out[kMaxRanks] = {};
  const auto loadRound = [&](std::uint64_t w) {
#pragma unroll
    for (int i = 1; i < kMaxRanks; ++i)
      if (i < R) out[i] = loadWord(send + ((r + i) % R) * bytes, w, bytes);
  };
  const CallStart call = beginCall(c, [&] {
    if (w0 < part.end) loadRound(w0);
  });
  const std::uint64_t m = call.m;
  const auto flag = static_cast<std::uint32_t>(m);
  awaitPeersStarted(c, call);
  for (std::uint64_t w = w0; w < part.end; w += kThreads) {
    if (w != w0) loadRound(w);
#pragma unroll
    for (int i = 1; i < kMaxRanks; ++i) {
      const int p = (r + i) % R;
      if (i < R) slotPackets(c.peerLl[p], c, m, r)[w].write(out[i], flag);
    }
  }
  // Every peer's packet of a word at once, reduced in rank order with this rank's own word
  // (reduceInRankOrder).
  withRankCapacity(R, [&]<int kCap>() {
    for (std::uint64_t w = w0; w < part.end; w += kThreads) {
      const std::uint64_t own = loadWord(send + r * bytes, w, bytes);
      const std::uint64_t sum = reduceInRankOrder<T, Op, kCap, Wide>(
          c, flag, own, [&](int q) { return &slotPackets(c.ll, c, m, q)[w]; });
      storeWord(recv, w, bytes, sum);
    }
  });
  endCall(c, m);
}

// Scratch half: R slots of slotBytes; slot q holds what rank q sent for this rank's block.
template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    reduceScatterPush(CollectiveContext c, const char* send, char* recv, std::uint64_t count,
                      std::uint64_t slotBytes) {
  constexpr std::uint64_t sz = sizeof(T), grain = 16 / sz;
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank;
  const std::uint64_t roundElems = slotBytes / sz;
  const std::uint64_t rounds = (count + roundElems - 1) / roundElems;
  char* mine = scratchHalf(c.scratch, c, m);
  for (std::uint64_t k = 0; k < rounds; ++k) {
    if (k == 0)
      awaitPeersStarted(c, call);
    else
      exchangeSignals(c, signalValue(m, k - 1, 3));
    const std::uint64_t base = k * roundElems, len = min(roundElems, count - base);
    const Range part = roundPart(len, min(roundElems, count), gridDim.x, blockIdx.x, grain);
    for (int i = 1; i < R; ++i) {
      const int p = (r + i) % R;
      copy(scratchHalf(c.peerScratch[p], c, m) + r * slotBytes + part.begin * sz,
           send + (p * count + base + part.begin) * sz, part.size() * sz, threadIdx.x, kThreads);
    }
    exchangeSignals(c, signalValue(m, k, 1));
    const char* src[kMaxRanks];
    for (int q = 0; q < R; ++q)
      src[q] = q == r ? send + (r * count + base + part.begin) * sz : mine + q * slotBytes + part.begin * sz;
    char* dst[1] = {recv + (base + part.begin) * sz};
    reduceSources<T, Op, Wide>(dst, 1, src, R, R, part.size(), threadIdx.x, kThreads);
  }
  endCall(c, m);
}

class ReduceScatterLL final : public Algorithm {
 public:
  const char* name() const override { return "reducescatter_ll"; }
  Collective collective() const override { return Collective::ReduceScatter; }
  bool sumsInFloat32() const override { return true; }
  std::string constraints(const CommLimits& limits) const override {
    return "up to " + std::to_string(limits.llSlotDataBytes) + " bytes per rank (FERRY_LL_BYTES)";
  }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    const std::uint64_t block = call.count * call.elementBytes();
    if (block > limits.llSlotDataBytes)
      return "a block of " + std::to_string(block) + " bytes exceeds the LL slot of " +
             std::to_string(limits.llSlotDataBytes) + " (FERRY_LL_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const std::uint64_t bytes = call.count * call.elementBytes();
    const unsigned grid = gridFor(context, (bytes + 7) / 8, kThreads, 1, 64);
    dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
      launchCollective(context.earlyLaunch, reduceScatterLL<T, Op, Wide>, grid, kThreads, call.stream,
                       forCall(context, call), static_cast<const char*>(call.send),
                       static_cast<char*>(call.recv), bytes);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryAccumulation([&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(reduceScatterLL<T, Op, Wide>); });
  }
};

class ReduceScatterPush final : public Algorithm {
 public:
  const char* name() const override { return "reducescatter_push"; }
  Collective collective() const override { return Collective::ReduceScatter; }
  bool sumsInFloat32() const override { return true; }
  std::string whyNot(const CollectiveCall&, const CommLimits& limits) const override {
    if (slotBytes(limits.scratchHalfBytes, limits.worldSize) < 16)
      return "the scratch is too small (FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const std::uint64_t slot = slotBytes(context.scratchHalfBytes, context.nranks);
    const std::uint64_t blockBytes = std::min<std::uint64_t>(slot, call.count * call.elementBytes());
    const unsigned grid = gridFor(context, blockBytes, 8 << 10, 1, 64);
    dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
      launchCollective(context.earlyLaunch, reduceScatterPush<T, Op, Wide>, grid, kThreads, call.stream,
                       forCall(context, call), static_cast<const char*>(call.send),
                       static_cast<char*>(call.recv), call.count, slot);
    });
    checkLaunch(call, name());
  }
  void preload() const override {
    forEveryAccumulation([&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(reduceScatterPush<T, Op, Wide>); });
  }

 private:
  static std::uint64_t slotBytes(std::uint64_t half, int worldSize) {
    return half / static_cast<std::uint64_t>(worldSize) / 16 * 16;
  }
};

}  // namespace

std::vector<const Algorithm*> reduceScatterAlgorithms() {
  static const ReduceScatterLL ll;
  static const ReduceScatterPush push;
  return {&ll, &push, &reduceScatterRingAlgorithm()};
}

}  // namespace ferry
