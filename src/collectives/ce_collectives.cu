// The copy-engine algorithms: on registered buffers (as the direct ones), the bytes between GPUs
// move through the Comm's PortChannels (kernels/port_peers.hpp): the proxy hands each put to the
// channel's connection, which over CUDA IPC is a copy on the GPU's copy engines; SM stores top out
// below the copy engines' rate on NVSwitch, and the SMs stay free for the caller's work. Over any
// other connection the same kernels run unchanged. One thread of each kernel, the driver, asks for
// the puts; a put's signal tells the peer its bytes have landed.
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
// only, q's round-j put to rank r; r reduces piece j only after that put's signal came (the bytes
// landed, so the read is over), and only then writes its reduced piece j into q's output.
#include "collectives/builtin.hpp"
#include "kernels/direct_call.cuh"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/port_peers.hpp"
#include "core/text.hpp"

namespace ferry {
namespace {

constexpr int kMoveThreads = 32;   // >= kMaxRanks: one thread per peer for the start and end signals
constexpr int kReduceBlocks = 16;  // reducer blocks of the reducing kernels, besides the driver's
// The round of the end signal: above every real round, so a flag only ever grows (device_context.hpp).
constexpr std::uint64_t kLastRound = (1u << 17) - 1;

// The end of a copy-engine reduction, block 0: every rank flushed its puts before this signal, so
// once every peer's has come, every byte of the call is in this rank's output and no peer touches it.
FERRY_DEVICE FERRY_INLINE void finishCe(const CollectiveContext& c, std::uint64_t m) {
  exchangeSignals(c, signalValue(m, kLastRound, 7));
  endCall(c, m);
}

// Where `at` lies in a registered buffer, as a port channel names it.
FERRY_DEVICE FERRY_INLINE std::uint64_t offsetIn(const RegEntry* e, const char* at) {
  return static_cast<std::uint64_t>(at - reinterpret_cast<const char*>(e->base));
}
// Where `at` lies in rank q's shared allocation (PortPeers::region).
FERRY_DEVICE FERRY_INLINE std::uint64_t regionOffset(const CollectiveContext& c, int q, const char* at) {
  const auto* base = reinterpret_cast<const char*>(q == c.rank ? c.state : c.peerState[q]);
  return static_cast<std::uint64_t>(at - base);
}
FERRY_DEVICE FERRY_INLINE std::uint64_t address(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

// What the blocks of one reducing kernel tell each other (the algorithm's own state in the Comm,
// Algorithm::deviceStateBytes): rounds whose inputs are all here, and pieces reduced so far. Zero
// between calls.
struct CeReduceState {
  std::uint32_t arrived;
  std::uint32_t reduced;
};

// Driver: flushes every peer's channel, the flushes overlapping.
FERRY_DEVICE FERRY_INLINE void flushAll(const CollectiveContext& c, PortPeers& ports) {
  std::uint64_t slot[kMaxRanks];
  for (int q = 0; q < c.nranks; ++q)
    if (q != c.rank) slot[q] = ports.channel[q].pushFlush();
  for (int q = 0; q < c.nranks; ++q)
    if (q != c.rank) ports.channel[q].awaitFlush(slot[q]);
}

enum class Move { AllGather, AllToAll };

// Every put to a peer carries a signal: once each peer's has come, its bytes are in this rank's
// output, and once this rank's puts are flushed its input has been read; so no end-of-call
// exchange is needed.
template <Move Kind>
__global__ void __launch_bounds__(kMoveThreads)
    moveCe(CollectiveContext c, PortPeers* ports, CallBuffers mine, const char* send, char* recv, std::uint64_t bytes) {
  __shared__ DirectBuffers b;
  const std::uint64_t m = beginDirect(c, mine, send, recv, b);
  const int R = c.nranks, r = c.rank;
  if (threadIdx.x == 0 && !abortRaised(c)) {
    PortPeers& px = *ports;
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;  // a different first peer on every rank
      const char* src = Kind == Move::AllGather ? send : send + q * bytes;
      px.channel[q].putWithSignal(static_cast<MemoryId>(b.recvEntry[q]->memory),
                                  offsetIn(b.recvEntry[q], b.recv[q] + r * bytes), kLocalPointer, address(src), bytes);
    }
    const char* src = Kind == Move::AllGather ? send : send + r * bytes;
    char* dst = recv + r * bytes;
    if (dst != src)  // in place, this rank's own block stays; else a copy within this rank
      px.channel[(r + 1) % R].put(static_cast<MemoryId>(b.recvEntry[r]->memory), offsetIn(b.recvEntry[r], dst),
                                  kLocalPointer, address(src), bytes);
    flushAll(c, px);
    for (int i = 1; i < R; ++i) px.channel[(r + i) % R].wait();
  }
  endCall(c, m);
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

// The driver: thread 0 of block 0. A round's put to each peer carries a signal on the peer's
// channel, "my round-j piece for you has landed"; and on block 0's flag row, (m, j, 2) says "I
// reduced round j: your slots of parity j are free, my piece j is final".
template <class T>
FERRY_DEVICE void driveReduce(const CollectiveContext& c, PortPeers& px, CeReduceState& st, const DirectBuffers& b,
                              const char* send, char* recv, const CeShape& s, std::uint64_t m) {
  constexpr std::uint64_t sz = sizeof(T);
  const int R = c.nranks, r = c.rank;
  const auto scatter = [&](std::uint64_t j) {
    for (int i = 1; i < R; ++i) {
      const int q = (r + i) % R;
      const Range e = pieceOf(s, q, j);
      const char* slot = ceSlot(scratchHalf(c.peerScratch[q], c, m), s, R, j, r, sz);
      px.channel[q].putWithSignal(px.region[q], regionOffset(c, q, slot), kLocalPointer,
                                  address(send + e.begin * sz), e.size() * sz);
    }
  };
  const auto eachPeer = [&](auto&& f) {
    for (int i = 1; i < R; ++i) f((r + i) % R);
  };
  if (!abortRaised(c)) {
    scatter(0);
    if (s.rounds > 1) scatter(1);
  }
  for (std::uint64_t j = 0; j < s.rounds && !abortRaised(c); ++j) {
    eachPeer([&](int q) { px.channel[q].wait(); });  // every peer's round-j piece is here
    atomicStore<std::uint32_t, cuda::thread_scope_device>(&st.arrived, static_cast<std::uint32_t>(j + 1),
                                                          memory_order_release);
    const auto reduced = static_cast<std::uint32_t>((j + 1) * (gridDim.x - 1));
    spinUntil([&] {
      return atomicLoad<std::uint32_t, cuda::thread_scope_device>(&st.reduced, memory_order_acquire) >= reduced;
    }, waitContext(c, r), "copy-engine reduce: this rank's reducer blocks", j);
    eachPeer([&](int q) { signalPeer(c, q, signalValue(m, j, 2)); });
    if (s.gather) {
      const Range e = pieceOf(s, r, j);
      eachPeer([&](int q) {
        px.channel[q].put(static_cast<MemoryId>(b.recvEntry[q]->memory), offsetIn(b.recvEntry[q], b.recv[q] + e.begin * sz),
                          kLocalPointer, address(recv + e.begin * sz), e.size() * sz);
      });
    }
    if (j + 2 < s.rounds) {
      eachPeer([&](int q) { waitPeer(c, q, signalValue(m, j, 2)); });
      scatter(j + 2);
    }
  }
  flushAll(c, px);
  st.arrived = 0;  // every reducer block is done (or the call was aborted)
  st.reduced = 0;
}

// Blocks 1..G: reduce their share of this rank's piece j once the driver says its inputs are here.
// Wide: float32 accumulation (WordAccumulator).
template <class T, ReduceOp Op, bool Wide>
FERRY_DEVICE void reducePieces(const CollectiveContext& c, CeReduceState& st, const char* send, char* recv,
                               const CeShape& s, std::uint64_t m) {
  constexpr std::uint64_t sz = sizeof(T);
  const int R = c.nranks, r = c.rank;
  const std::uint64_t G = gridDim.x - 1, g = blockIdx.x - 1;
  // allreduce: the reduced chunk stays at its place in the output; reducescatter: the output is the chunk.
  const std::uint64_t outFirst = s.gather ? 0 : r * s.chunk;
  char* half = scratchHalf(c.scratch, c, m);
  for (std::uint64_t j = 0; j < s.rounds; ++j) {
    if (threadIdx.x == 0)
      spinUntil([&] {
        return atomicLoad<std::uint32_t, cuda::thread_scope_device>(&st.arrived, memory_order_acquire) >= j + 1;
      }, waitContext(c, r), "copy-engine reduce: the driver's inputs of a round", j);
    __syncthreads();
    const Range e = pieceOf(s, r, j);
    const Range part = splitRange(e.size(), G, g, 16 / sz);
    const char* src[kMaxRanks];
    for (int q = 0; q < R; ++q)
      src[q] = q == r ? send + (e.begin + part.begin) * sz : ceSlot(half, s, R, j, q, sz) + part.begin * sz;
    char* dst[1] = {recv + (e.begin - outFirst + part.begin) * sz};
    reduceSources<T, Op, Wide>(dst, 1, src, R, R, part.size(), threadIdx.x, kThreads);
    __syncthreads();
    if (threadIdx.x == 0)
      atomicFetchAdd<std::uint32_t, cuda::thread_scope_device>(&st.reduced, 1u, memory_order_release);
  }
}

template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    reduceCe(CollectiveContext c, PortPeers* ports, CeReduceState* st, CallBuffers mine, const char* send, char* recv,
             CeShape s) {
  __shared__ DirectBuffers b;
  const std::uint64_t m = beginDirect(c, mine, send, recv, b);
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) driveReduce<T>(c, *ports, *st, b, send, recv, s, m);
    finishCe(c, m);
  } else {
    reducePieces<T, Op, Wide>(c, *st, send, recv, s, m);
    endCall(c, m);
  }
}

// The Comm's port channels (device memory: the drivers update the channels' semaphore counts in
// it), their proxy running.
PortPeers* portsOf(const CollectiveContext& context, const CollectiveCall& call, const char* algorithm) {
  if (context.ports == nullptr)
    throw Error(ErrorCode::InternalError, describe(call) + ": " + algorithm + ": the Comm has no port channels");
  return const_cast<PortPeers*>(context.ports->start());
}

class MoveCeAlgorithm final : public Algorithm {
 public:
  MoveCeAlgorithm(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  std::string whyNot(const CollectiveCall& call, const CommLimits&) const override { return whyNotZeroCopy(call); }
  std::string constraints(const CommLimits&) const override { return "registered buffers only"; }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    PortPeers* ports = portsOf(context, call, name_);
    const CollectiveContext c = forCall(context, call);
    const auto* send = static_cast<const char*>(call.send);
    auto* recv = static_cast<char*>(call.recv);
    const std::uint64_t bytes = call.count * call.elementBytes();
    if (collective_ == Collective::AllGather)
      moveCe<Move::AllGather><<<1, kMoveThreads, 0, call.stream>>>(c, ports, published(call), send, recv, bytes);
    else
      moveCe<Move::AllToAll><<<1, kMoveThreads, 0, call.stream>>>(c, ports, published(call), send, recv, bytes);
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
  // Each element is reduced in one place (reducePieces), from every rank's input.
  bool sumsInFloat32() const override { return true; }
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
  std::size_t deviceStateBytes() const override { return sizeof(CeReduceState); }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void* state) const override {
    PortPeers* ports = portsOf(context, call, name_);
    auto* st = static_cast<CeReduceState*>(state);
    if (st == nullptr)
      throw Error(ErrorCode::InternalError, describe(call) + ": " + name_ + ": the Comm gave it no device state");
    const CollectiveContext c = forCall(context, call);
    CommLimits limits;
    limits.worldSize = call.worldSize;
    limits.scratchHalfBytes = context.scratchHalfBytes;
    const CeShape s = shape(call, limits);
    const auto* send = static_cast<const char*>(call.send);
    auto* recv = static_cast<char*>(call.recv);
    dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
      reduceCe<T, Op, Wide>
          <<<1 + kReduceBlocks, kThreads, 0, call.stream>>>(c, ports, st, published(call), send, recv, s);
    });
    checkLaunch(call, name_);
  }
  void preload() const override {
    forEveryAccumulation([&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(reduceCe<T, Op, Wide>); });
  }

 private:
  // Pieces as large as two rounds of R slots allow in one scratch half, in whole 16-byte words.
  CeShape shape(const CollectiveCall& call, const CommLimits& limits) const {
    const std::uint64_t R = static_cast<std::uint64_t>(call.worldSize), sz = call.elementBytes();
    const std::uint64_t grain = 16 / sz;
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
