// The copy-engine algorithms: on registered buffers (as the direct ones), the bytes between GPUs
// move by the copy engines, which the Comm's CopyEngine proxy drives at a kernel's request
// (copy_engine.hpp); SM stores top out below the copy engines' rate on NVSwitch, and the SMs stay
// free for the caller's work. One thread of each kernel, the driver, asks for the copies.
//   allgather_ce      rank r's input is copied into block r of every rank's output.
//   alltoall_ce       block p of rank r's input is copied into block r of rank p's output (out of
//                     place only, as alltoall_direct).
//   reducescatter_ce  in rounds: every rank copies its part of chunk q into a scratch slot of rank
//                     q; rank q's reducer blocks (kReduceBlocks, the only SMs in use) reduce the
//                     slots and its own part in rank order into its output. Two rounds are in
//                     flight at once (two sets of slots), so copies and reductions overlap.
//   allreduce_ce      the same into chunk r of the output, then each reduced piece is copied
//                     straight into every peer's output (the all-gather), overlapping later rounds.
//
// Why overwriting in place is safe (allreduce_ce): rank q's piece j of chunk r is read by one copy
// only, q's round-j copy to rank r; r reduces piece j only after q's round-j copies are flushed and
// signalled, and only then writes its reduced piece j into q's output.
#include "collectives/builtin.hpp"
#include "kernels/copy_engine.hpp"
#include "kernels/copy_engine_host.hpp"
#include "kernels/direct_call.cuh"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"

namespace ferry {
namespace {

constexpr int kMoveThreads = 32;   // >= kMaxRanks: one thread per peer for the start and end signals
constexpr int kReduceBlocks = 16;  // reducer blocks of the reducing kernels, besides the driver's
// The round of the end signal: above every real round, so a flag only ever grows (device_context.hpp).
constexpr std::uint64_t kLastRound = (1u << 17) - 1;

// The end of a copy-engine call, block 0: every rank flushed its copies before this signal, so once
// every peer's has come, every byte of the call is in this rank's output and no peer touches it.
FERRY_DEVICE FERRY_INLINE void finishCe(const CollectiveContext& c, std::uint64_t m) {
  exchangeSignals(c, signalValue(m, kLastRound, 7));
  endCall(c, m);
}

enum class Move { AllGather, AllToAll };

template <Move Kind>
__global__ void __launch_bounds__(kMoveThreads)
    moveCe(CollectiveContext c, CopyEngineHandle ce, CallBuffers mine, const char* send, char* recv, std::uint64_t bytes) {
  __shared__ DirectBuffers b;
  const std::uint64_t m = beginDirect(c, mine, send, recv, b);
  const int R = c.nranks, r = c.rank;
  if (threadIdx.x == 0 && !abortRaised(c)) {
    for (int i = 1; i <= R; ++i) {
      const int q = (r + i) % R;  // a different first peer on every rank; this rank's own block last
      const char* src = Kind == Move::AllGather ? send : send + q * bytes;
      char* dst = b.recv[q] + r * bytes;
      if (dst != src) ce.copy(q, dst, src, bytes);  // in place, this rank's own block stays
    }
    ce.flushAll();
  }
  finishCe(c, m);
}

// Elements of a reduction through the copy engine: `count` input elements cut into R chunks of
// `chunk` (clamped at count), each chunk into `rounds` pieces of `piece`.
struct CeShape {
  std::uint64_t count = 0;
  std::uint64_t chunk = 0;
  std::uint64_t piece = 0;
  std::uint64_t rounds = 0;
  bool gather = false;  // allreduce: each reduced piece goes to every peer's output too
};

FERRY_HOST_DEVICE FERRY_INLINE Range pieceOf(const CeShape& s, int q, std::uint64_t j) {
  const auto lesser = [](std::uint64_t a, std::uint64_t b) { return a < b ? a : b; };
  const std::uint64_t end = lesser((q + 1) * s.chunk, s.count);
  const std::uint64_t begin = lesser(q * s.chunk + j * s.piece, end);
  return {begin, lesser(begin + s.piece, end)};
}

// Round j's slot for sender q in a rank's scratch half: two sets of R slots, one per round parity.
FERRY_DEVICE FERRY_INLINE char* ceSlot(char* half, const CeShape& s, int R, std::uint64_t j, int q, std::uint64_t sz) {
  return half + ((j & 1) * R + q) * s.piece * sz;
}

// The driver: thread 0 of block 0. Signals on block 0's row: (m, j, 1) "my round-j copies to you
// have landed", (m, j, 2) "I reduced round j: your slots of parity j are free, my piece j is final".
template <class T>
FERRY_DEVICE void driveReduce(const CollectiveContext& c, const CopyEngineHandle& ce, const DirectBuffers& b,
                              const char* send, char* recv, const CeShape& s, std::uint64_t m) {
  constexpr std::uint64_t sz = sizeof(T);
  const int R = c.nranks, r = c.rank;
  const auto scatter = [&](std::uint64_t j) {
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;
      const Range e = pieceOf(s, q, j);
      ce.copy(q, ceSlot(scratchHalf(c.peerScratch[q], c, m), s, R, j, r, sz), send + e.begin * sz, e.size() * sz);
    }
    ce.mark(static_cast<int>(j % kCeMarks));
  };
  const auto eachPeer = [&](auto&& f) {
    for (int i = 1; i < R; ++i) f((r + i) % R);
  };
  if (!abortRaised(c)) {
    scatter(0);
    if (s.rounds > 1) scatter(1);
  }
  for (std::uint64_t j = 0; j < s.rounds && !abortRaised(c); ++j) {
    ce.flush(static_cast<int>(j % kCeMarks));
    eachPeer([&](int q) { signalPeer(c, q, signalValue(m, j, 1)); });
    eachPeer([&](int q) { waitPeer(c, q, signalValue(m, j, 1)); });
    atomicStore<std::uint32_t, cuda::thread_scope_device>(&c.state->ceArrived, static_cast<std::uint32_t>(j + 1),
                                                          memory_order_release);
    const auto reduced = static_cast<std::uint32_t>((j + 1) * (gridDim.x - 1));
    spinUntil([&] {
      return atomicLoad<std::uint32_t, cuda::thread_scope_device>(&c.state->ceReduced, memory_order_acquire) >= reduced;
    }, waitContext(c, r), "copy-engine reduce: this rank's reducer blocks", j);
    eachPeer([&](int q) { signalPeer(c, q, signalValue(m, j, 2)); });
    if (s.gather) {
      const Range e = pieceOf(s, r, j);
      eachPeer([&](int q) { ce.copy(q, b.recv[q] + e.begin * sz, recv + e.begin * sz, e.size() * sz); });
    }
    if (j + 2 < s.rounds) {
      eachPeer([&](int q) { waitPeer(c, q, signalValue(m, j, 2)); });
      scatter(j + 2);
    }
  }
  ce.flushAll();
  c.state->ceArrived = 0;  // every reducer block is done (or the call was aborted)
  c.state->ceReduced = 0;
}

// Blocks 1..G: reduce their share of this rank's piece j once the driver says its inputs are here.
template <class T, ReduceOp Op>
FERRY_DEVICE void reducePieces(const CollectiveContext& c, const char* send, char* recv, const CeShape& s,
                               std::uint64_t m) {
  constexpr std::uint64_t sz = sizeof(T);
  const int R = c.nranks, r = c.rank;
  const std::uint64_t G = gridDim.x - 1, g = blockIdx.x - 1;
  // allreduce: the reduced chunk stays at its place in the output; reducescatter: the output is the chunk.
  const std::uint64_t outFirst = s.gather ? 0 : r * s.chunk;
  char* half = scratchHalf(c.scratch, c, m);
  for (std::uint64_t j = 0; j < s.rounds; ++j) {
    if (threadIdx.x == 0)
      spinUntil([&] {
        return atomicLoad<std::uint32_t, cuda::thread_scope_device>(&c.state->ceArrived, memory_order_acquire) >= j + 1;
      }, waitContext(c, r), "copy-engine reduce: the driver's inputs of a round", j);
    __syncthreads();
    const Range e = pieceOf(s, r, j);
    const Range part = splitRange(e.size(), G, g, 16 / sz);
    const char* src[kMaxRanks];
    for (int q = 0; q < R; ++q)
      src[q] = q == r ? send + (e.begin + part.begin) * sz : ceSlot(half, s, R, j, q, sz) + part.begin * sz;
    char* dst[1] = {recv + (e.begin - outFirst + part.begin) * sz};
    reduceSources<T, Op>(dst, 1, src, R, R, part.size(), threadIdx.x, kThreads);
    __syncthreads();
    if (threadIdx.x == 0)
      atomicFetchAdd<std::uint32_t, cuda::thread_scope_device>(&c.state->ceReduced, 1u, memory_order_release);
  }
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads)
    reduceCe(CollectiveContext c, CopyEngineHandle ce, CallBuffers mine, const char* send, char* recv, CeShape s) {
  __shared__ DirectBuffers b;
  const std::uint64_t m = beginDirect(c, mine, send, recv, b);
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) driveReduce<T>(c, ce, b, send, recv, s, m);
    finishCe(c, m);
  } else {
    reducePieces<T, Op>(c, send, recv, s, m);
    endCall(c, m);
  }
}

CopyEngineHandle engineOf(const CollectiveContext& context, const CollectiveCall& call, const char* algorithm) {
  if (context.copyEngine == nullptr)
    throw Error(ErrorCode::InternalError, describe(call) + ": " + algorithm + ": the Comm has no copy engine");
  return context.copyEngine->handle();
}

class MoveCeAlgorithm final : public Algorithm {
 public:
  MoveCeAlgorithm(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  std::string whyNot(const CollectiveCall& call, const CommLimits&) const override { return whyNotZeroCopy(call); }
  std::string constraints(const CommLimits&) const override { return "registered buffers only"; }
  void launch(const CollectiveCall& call, const CollectiveContext& context) const override {
    const CopyEngineHandle ce = engineOf(context, call, name_);
    const CollectiveContext c = forCall(context, call);
    const auto* send = static_cast<const char*>(call.send);
    auto* recv = static_cast<char*>(call.recv);
    const std::uint64_t bytes = call.count * call.elementBytes();
    if (collective_ == Collective::AllGather)
      moveCe<Move::AllGather><<<1, kMoveThreads, 0, call.stream>>>(c, ce, published(call), send, recv, bytes);
    else
      moveCe<Move::AllToAll><<<1, kMoveThreads, 0, call.stream>>>(c, ce, published(call), send, recv, bytes);
    checkLaunch(call, name_);
  }
  void preload() const override {
    if (collective_ == Collective::AllGather)
      preloadKernel(moveCe<Move::AllGather>);
    else
      preloadKernel(moveCe<Move::AllToAll>);
  }

 private:
  const char* name_;
  Collective collective_;
};

class ReduceCeAlgorithm final : public Algorithm {
 public:
  ReduceCeAlgorithm(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  std::string constraints(const CommLimits&) const override {
    return "registered buffers only; " + std::to_string(1 + kReduceBlocks) + " thread blocks";
  }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override {
    if (std::string why = notRegistered(call); !why.empty()) return why;
    if (limits.maxBlocks < 1 + kReduceBlocks)
      return "it needs " + std::to_string(1 + kReduceBlocks) + " thread blocks; the Comm allows " +
             std::to_string(limits.maxBlocks) + " (CommOptions::maxBlocks, maxCTAs)";
    const CeShape s = shape(call, limits);
    if (s.piece == 0)
      return "the scratch buffer (FERRY_SCRATCH_BYTES) is too small for two rounds of " +
             std::to_string(call.worldSize) + " slots";
    if (s.rounds >= kLastRound) return "it would take more rounds than a call can count (raise FERRY_SCRATCH_BYTES)";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context) const override {
    const CopyEngineHandle ce = engineOf(context, call, name_);
    const CollectiveContext c = forCall(context, call);
    CommLimits limits;
    limits.worldSize = call.worldSize;
    limits.scratchHalfBytes = context.scratchHalfBytes;
    const CeShape s = shape(call, limits);
    const auto* send = static_cast<const char*>(call.send);
    auto* recv = static_cast<char*>(call.recv);
    dispatchTypeOp(call.type, call.op, [&]<class T, ReduceOp Op>() {
      reduceCe<T, Op><<<1 + kReduceBlocks, kThreads, 0, call.stream>>>(c, ce, published(call), send, recv, s);
    });
    checkLaunch(call, name_);
  }
  void preload() const override {
    forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(reduceCe<T, Op>); });
  }

 private:
  // Pieces as large as two rounds of R slots allow in one scratch half, in whole 16-byte words.
  CeShape shape(const CollectiveCall& call, const CommLimits& limits) const {
    const std::uint64_t R = static_cast<std::uint64_t>(call.worldSize), sz = call.elementBytes();
    const std::uint64_t grain = 16 / sz;
    const auto roundUp = [](std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; };
    CeShape s;
    s.gather = collective_ == Collective::AllReduce;
    if (s.gather) {
      s.count = call.count;
      s.chunk = roundUp((call.count + R - 1) / R, grain);
    } else {
      s.count = call.count * R;
      s.chunk = call.count;
    }
    const std::uint64_t fit = limits.scratchHalfBytes / (2 * R) / sz / grain * grain;
    s.piece = std::min(fit, roundUp(s.chunk, grain));
    s.rounds = s.piece == 0 ? 0 : (s.chunk + s.piece - 1) / s.piece;
    return s;
  }

  const char* name_;
  Collective collective_;
};

}  // namespace

std::vector<const Algorithm*> copyEngineAlgorithms() {
  static const MoveCeAlgorithm moves[] = {{"allgather_ce", Collective::AllGather}, {"alltoall_ce", Collective::AllToAll}};
  static const ReduceCeAlgorithm reductions[] = {{"allreduce_ce", Collective::AllReduce},
                                                 {"reducescatter_ce", Collective::ReduceScatter}};
  std::vector<const Algorithm*> v;
  for (const auto& a : reductions) v.push_back(&a);
  for (const auto& a : moves) v.push_back(&a);
  return v;
}

}  // namespace ferry
