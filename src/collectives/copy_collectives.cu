// The collectives that only move data: AllGather, AllToAll and Broadcast, two algorithms each on
// one pair of kernels that differ only in which block goes where (CopyPlan):
//   *_ll    one hop of LL16 packets into each receiver's packet slot for the sender; the receiver
//           unpacks as packets arrive. For small calls.
//   *_push  the sender copies into the receiver's scratch slot for it and signals; the receiver
//           copies out. Calls larger than a slot run in rounds, each receiver telling its senders
//           when a slot is free again.
#include "collectives/builtin.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "ferry/device/copy.hpp"
#include "ferry/device/packet.hpp"

namespace ferry {
namespace {

// Which bytes go where, for one rank. `bytes` is one block: what one rank sends one peer.
struct CopyPlan {
  const char* send;
  char* recv;
  std::uint64_t bytes;
  int collective;  // Collective
  int root;
  bool inPlace;

  FERRY_HOST_DEVICE bool isBroadcast() const { return collective == static_cast<int>(Collective::Broadcast); }
  // Whether each peer gets a block of its own (all-to-all); else every peer gets the same one.
  FERRY_HOST_DEVICE bool perPeer() const { return collective == static_cast<int>(Collective::AllToAll); }
  // What this rank sends to rank p, and where rank q's block lands here.
  FERRY_HOST_DEVICE const char* source(int p) const {
    return perPeer() ? send + p * bytes : send;
  }
  FERRY_HOST_DEVICE char* dest(int q) const { return isBroadcast() ? recv : recv + q * bytes; }
  // Peers this rank sends to / receives from (bit p).
  FERRY_HOST_DEVICE unsigned sendMask(int rank) const { return !isBroadcast() || rank == root ? ~0u : 0u; }
  FERRY_HOST_DEVICE unsigned recvMask(int rank) const {
    return !isBroadcast() ? ~0u : rank == root ? 0u : 1u << root;
  }
  // This rank's own block, copied locally (not in place).
  FERRY_HOST_DEVICE bool copiesOwn(int rank) const { return !inPlace && (!isBroadcast() || rank == root); }
};

FERRY_DEVICE FERRY_INLINE LL16Packet* slotPackets(char* region, const CollectiveContext& c, std::uint64_t m,
                                                  int slot) {
  return reinterpret_cast<LL16Packet*>(llHalf(region, c, m) + static_cast<std::uint64_t>(slot) * c.llSlotBytes);
}

__global__ void __launch_bounds__(kThreads) copyLL(CollectiveContext c, CopyPlan plan) {
  const int R = c.nranks, r = c.rank;
  const unsigned sendMask = plan.sendMask(r), recvMask = plan.recvMask(r);
  const std::uint64_t bytes = plan.bytes;
  const Range part = splitRange((bytes + 7) / 8, gridDim.x, blockIdx.x, 1);
  // A thread's round of loads: word i (i >= 1) goes to the i-th peer after this rank ((r + i) % R, an
  // order that differs on every rank, so that no rank is every sender's first); word 0 is this rank's
  // own block, which goes into its output from the same loads (not in place), so that its copy adds
  // no round trip of its own before the receives. An all-to-all's words lie in different lines and
  // are all loaded before any is stored (loaded between the stores, each would wait for the one
  // before); an all-gather's or a broadcast's peers all get word 0: one load. The first round is
  // loaded at the call's start, with its count of calls done (allreduce.cu, allReduceLL).
  const std::uint64_t w0 = part.begin + threadIdx.x;
  const bool own = plan.copiesOwn(r), perPeer = plan.perPeer();
  std::uint64_t out[kMaxRanks] = {};
  const auto loadRound = [&](std::uint64_t w) {
    if (!perPeer) {
      out[0] = loadWord(plan.send, w, bytes);
      return;
    }
    if (own) out[0] = loadWord(plan.source(r), w, bytes);
#pragma unroll
    for (int i = 1; i < kMaxRanks; ++i)
      if (i < R && (sendMask >> ((r + i) % R) & 1)) out[i] = loadWord(plan.source((r + i) % R), w, bytes);
  };
  const CallStart call = beginCall(c, [&] {
    if ((sendMask || own) && w0 < part.end) loadRound(w0);
  });
  const std::uint64_t m = call.m;
  const auto flag = static_cast<std::uint32_t>(m);
  if (sendMask) awaitPeersStarted(c, call, sendMask);
  if (sendMask || own)
    for (std::uint64_t w = w0; w < part.end; w += kThreads) {
      if (w != w0) loadRound(w);
#pragma unroll
      for (int i = 1; i < kMaxRanks; ++i) {
        const int p = (r + i) % R;
        if (i < R && (sendMask >> p & 1))
          slotPackets(c.peerLl[p], c, m, r)[w].write(perPeer ? out[i] : out[0], flag);
      }
      if (own) storeWord(plan.dest(r), w, bytes, out[0]);
    }
  // Every sender's packet of a word at once (readPackets).
  const std::uint32_t senders = recvMask & ((1u << R) - 1) & ~(1u << r);
  if (senders != 0)
    withRankCapacity(R, [&]<int kCap>() {
      for (std::uint64_t w = part.begin + threadIdx.x; w < part.end; w += kThreads) {
        std::uint64_t in[kCap] = {};
        readPackets(
            senders, flag, in, [&](int q) { return &slotPackets(c.ll, c, m, q)[w]; },
            [&](int q) { return waitContext(c, q); });
#pragma unroll
        for (int q = 0; q < kCap; ++q)
          if (senders >> q & 1) storeWord(plan.dest(q), w, bytes, in[q]);
      }
    });
  endCall(c, m);
}

// Scratch half: R slots of slotBytes; slot q holds what rank q sent this rank in this round.
// NVLink idles while a round is copied out (about 325 GB/s at 1 GiB on 2 H100, where a put from
// every SM reaches 364). Splitting each block's warps into 384 that store and 128 that copy out,
// each at its own pace through a ring of chunks, was slower (2316 against 1653 us for a 1 GiB
// all-gather): the stores a block can keep in flight scale with its threads, so every thread
// stores here while the copy-in lasts.
__global__ void __launch_bounds__(kThreads) copyPush(CollectiveContext c, CopyPlan plan, std::uint64_t slotBytes) {
  const CallStart call = beginCall(c);
  const std::uint64_t m = call.m;
  const int R = c.nranks, r = c.rank;
  const unsigned sendMask = plan.sendMask(r), recvMask = plan.recvMask(r);
  const std::uint64_t rounds = (plan.bytes + slotBytes - 1) / slotBytes;
  char* mine = scratchHalf(c.scratch, c, m);
  for (std::uint64_t k = 0; k < rounds; ++k) {
    if (k == 0) {
      if (sendMask) awaitPeersStarted(c, call, sendMask);
    } else {
      // Receivers free their slots for the next round; senders wait for that.
      signalAndWait(c, signalValue(m, k - 1, 3), recvMask, sendMask);
    }
    const std::uint64_t off = k * slotBytes, len = min(slotBytes, plan.bytes - off);
    const Range part = roundPart(len, min(slotBytes, plan.bytes), gridDim.x, blockIdx.x, 16);
    for (int i = 1; i < R; ++i) {
      const int p = (r + i) % R;
      if (sendMask >> p & 1)
        copy(scratchHalf(c.peerScratch[p], c, m) + r * slotBytes + part.begin, plan.source(p) + off + part.begin,
             part.size(), threadIdx.x, kThreads);
    }
    if (plan.copiesOwn(r))
      copy(plan.dest(r) + off + part.begin, plan.source(r) + off + part.begin, part.size(), threadIdx.x, kThreads);
    signalAndWait(c, signalValue(m, k, 1), sendMask, recvMask);
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;
      if (recvMask >> q & 1)
        copy(plan.dest(q) + off + part.begin, mine + q * slotBytes + part.begin, part.size(), threadIdx.x, kThreads);
    }
  }
  endCall(c, m);
}

CopyPlan planFor(const CollectiveCall& call) {
  return CopyPlan{static_cast<const char*>(call.send), static_cast<char*>(call.recv), call.count * call.elementBytes(),
                  static_cast<int>(call.collective), call.root, call.inPlace()};
}

class CopyLL final : public Algorithm {
 public:
  CopyLL(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
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
    const CopyPlan plan = planFor(call);
    const unsigned grid = gridFor(context, (plan.bytes + 7) / 8, kThreads, 1, 64);
    launchCollective(context.earlyLaunch, copyLL, grid, kThreads, call.stream, forCall(context, call), plan);
    checkLaunch(call, name_);
  }
  void preload() const override { preloadKernel(copyLL); }

 private:
  const char* name_;
  Collective collective_;
};

class CopyPush final : public Algorithm {
 public:
  CopyPush(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  std::string whyNot(const CollectiveCall&, const CommLimits& limits) const override {
    if (slotBytes(limits.scratchHalfBytes, limits.worldSize) < 16)
      return "the scratch is too small (FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const CopyPlan plan = planFor(call);
    const std::uint64_t slot = slotBytes(context.scratchHalfBytes, context.nranks);
    const unsigned grid = gridFor(context, std::min(slot, plan.bytes), 8 << 10, 1, 64);
    launchCollective(context.earlyLaunch, copyPush, grid, kThreads, call.stream, forCall(context, call), plan,
                     slot);
    checkLaunch(call, name_);
  }
  void preload() const override { preloadKernel(copyPush); }

 private:
  static std::uint64_t slotBytes(std::uint64_t half, int worldSize) {
    return half / static_cast<std::uint64_t>(worldSize) / 16 * 16;
  }
  const char* name_;
  Collective collective_;
};

}  // namespace

std::vector<const Algorithm*> allGatherAlgorithms() {
  static const CopyLL ll("allgather_ll", Collective::AllGather);
  static const CopyPush push("allgather_push", Collective::AllGather);
  return {&ll, &push};
}

std::vector<const Algorithm*> allToAllAlgorithms() {
  static const CopyLL ll("alltoall_ll", Collective::AllToAll);
  static const CopyPush push("alltoall_push", Collective::AllToAll);
  return {&ll, &push};
}

std::vector<const Algorithm*> broadcastAlgorithms() {
  static const CopyLL ll("broadcast_ll", Collective::Broadcast);
  static const CopyPush push("broadcast_push", Collective::Broadcast);
  return {&ll, &push, &broadcastScatterAlgorithm(), &broadcastChainAlgorithm()};
}

}  // namespace ferry
