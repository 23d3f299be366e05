// The executor's kernel: block b of rank r interprets thread block b of r's program (rank_program.hpp)
// op by op. Every op is done by the whole block; a __syncthreads() after each data op makes it
// complete for the block before the next op (or a signal) starts.
//
// Where the plan's buffers are: input and output are the call's buffers; scratch is this call's half
// of the Comm's scratch (Simple) or packet region (LL), so the two-halves rule of device_context.hpp
// keeps successive calls apart. A plan that touches peers' input or output runs in direct mode: the
// peers' buffers come from the registrations published at the start (direct_call.cuh), and no rank
// leaves the call before every peer is done with its buffers: the plan's own waits see to that
// where they can (peersWaitOutAccesses), else an exchange at the end of the call.
//
// Signals: a channel's n-th signal in call m stores signalValue(m, n, 1) in its flag row of the
// peer's flags; the n-th wait waits for at least that. LL packets carry the call number as flag.
// Avg runs the plan with sum and divides each rank's output once at the end.
//
// Lanes (rank_program.hpp): with L lanes, block b runs thread block b / L of the program as lane
// b % L, on part b % L of every chunk, with channel rows of its own.
#include "kernels/direct_call.cuh"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/port_peers.hpp"
#include "executor/plan_launch.hpp"
#include "ferry/device/copy.hpp"
#include "ferry/device/packet.hpp"

namespace ferry::executor {
namespace {

static_assert(laneFlagRow(kMaxChannelSlots, kMaxLanes - 1) < kFlagSlots,
              "the lanes' channel rows must fit the flags");

constexpr int kInput = static_cast<int>(BufferKind::Input);
constexpr int kOutput = static_cast<int>(BufferKind::Output);
constexpr int kScratch = static_cast<int>(BufferKind::Scratch);

struct ExecArgs {
  DeviceProgram program;
  PlanState* state = nullptr;  // the plan's own in this Comm (PlanAlgorithm::deviceStateBytes)
  const char* input = nullptr;
  char* output = nullptr;
  CallBuffers mine;  // direct mode: this rank's registrations, published to the peers
  ChunkGeometry geometry;
  std::uint64_t elementBytes = 0;
  std::uint64_t scratchStride = 0;   // bytes from one scratch chunk to the next
  std::uint64_t outputElements = 0;  // for avg: this round's
  std::uint64_t roundOffset = 0;     // bytes from each group's start to this round's part (PlanRounds)
  // For the ops of port channels (ExecOp::proxy): the Comm's, per peer. Null when the Comm runs them
  // as memory-channel ops (FERRY_PLAN_PORTS=memory): then a put is the block's own stores.
  PortPeers* ports = nullptr;
  int lanes = 1;
  bool merge = false;  // a multi-chunk reference is one contiguous piece everywhere
  bool direct = false;
  bool finalExchange = false;  // RankProgram::finalExchange
  bool ll = false;
  bool average = false;
};

// Every rank's three buffers as seen from here (nullptr: not reachable in this mode), and, for port
// channels, the memory of the Comm's PortChannelService that holds each, from memoryBase on.
struct Bases {
  char* of[kMaxRanks][3];
  std::uint32_t memory[kMaxRanks][3];
  const char* memoryBase[kMaxRanks][3];
};

FERRY_DEVICE FERRY_INLINE int owner(const CollectiveContext& c, const ExecRef& r) {
  return r.rank == kLocal ? c.rank : r.rank;
}

FERRY_DEVICE FERRY_INLINE char* chunkAt(const Bases& b, const ExecArgs& a, const CollectiveContext& c,
                                        const ExecRef& r, std::uint64_t j) {
  char* base = b.of[owner(c, r)][r.buffer];
  const std::uint64_t k = static_cast<std::uint64_t>(r.index) + j;
  if (r.buffer == kScratch) return base + k * a.scratchStride;
  return base + a.geometry.offset(k) * a.elementBytes;
}

// Element `at` of chunk j of a reference; for packets, the packet that carries it (lanes start on
// 16-byte grains, so on a whole packet).
FERRY_DEVICE FERRY_INLINE char* elementOf(const Bases& b, const ExecArgs& a, const CollectiveContext& c,
                                          const ExecRef& r, std::uint64_t j, std::uint64_t at) {
  return chunkAt(b, a, c, r, j) + at * a.elementBytes;
}
FERRY_DEVICE FERRY_INLINE LL16Packet* packetsOf(const Bases& b, const ExecArgs& a, const CollectiveContext& c,
                                                const ExecRef& r, std::uint64_t j, std::uint64_t at) {
  return reinterpret_cast<LL16Packet*>(chunkAt(b, a, c, r, j)) + at * a.elementBytes / 8;
}

// Elements of piece [j, j + n) of an op's chunks: input and output chunks say how long they are;
// an op on scratch alone moves whole chunks.
FERRY_DEVICE FERRY_INLINE std::uint64_t pieceElements(const ExecArgs& a, const ExecRef* const* refs, int nrefs,
                                                      std::uint64_t j, std::uint64_t n) {
  if (a.merge) return n * a.geometry.chunkElements;
  for (int i = 0; i < nrefs; ++i)
    if (refs[i]->buffer != kScratch) return a.geometry.length(static_cast<std::uint64_t>(refs[i]->index) + j);
  return a.geometry.chunkElements;
}

// Calls f(j, first, elements) for each contiguous piece of this lane's part of an op whose
// references span `count` chunks: elements [first, first + elements) from the start of chunk j.
// One lane takes a piece whole; with several, each chunk is cut the same way in every op (by the
// full chunk length, whatever this chunk holds), so an element belongs to the same lane throughout.
template <class F>
FERRY_DEVICE FERRY_INLINE void forPieces(const ExecArgs& a, const ExecRef* const* refs, int nrefs, int count, F&& f) {
  const std::uint64_t n = static_cast<std::uint64_t>(count);
  if (a.lanes == 1) {
    const std::uint64_t pieces = a.merge ? 1 : n, per = a.merge ? n : 1;
    // An empty piece (a chunk past the end of a short call) is skipped: a proxy put of it would name
    // an offset past the peer's buffer, which the connection refuses.
    for (std::uint64_t p = 0; p < pieces; ++p) {
      const std::uint64_t len = pieceElements(a, refs, nrefs, p * per, per);
      if (len > 0) f(p * per, 0, len);
    }
    return;
  }
  const std::uint64_t lane = blockIdx.x % static_cast<unsigned>(a.lanes);
  const std::uint64_t grain = 16 / a.elementBytes;
  for (std::uint64_t j = 0; j < n; ++j) {
    const std::uint64_t len = a.merge ? a.geometry.chunkElements : pieceElements(a, refs, nrefs, j, 1);
    const Range part = roundPart(len, a.geometry.chunkElements, static_cast<unsigned>(a.lanes), lane, grain);
    if (part.size() > 0) f(j, part.begin, part.size());
  }
}

// Blocks of this kernel meet here (the plan's barrier op, and the end of a call). Every block is
// resident at once: a plan has at most kMaxThreadBlocks of them.
FERRY_DEVICE FERRY_INLINE void gridBarrier(const CollectiveContext& c, const ExecArgs& a) {
  __syncthreads();
  if (threadIdx.x == 0) {
    PlanState* s = a.state;
    const std::uint32_t generation =
        atomicLoad<std::uint32_t, cuda::thread_scope_device>(&s->barrierGeneration, memory_order_acquire);
    const std::uint32_t arrived =
        atomicFetchAdd<std::uint32_t, cuda::thread_scope_device>(&s->barrierArrived, 1u, memory_order_acq_rel);
    if (arrived + 1 == gridDim.x) {
      s->barrierArrived = 0;
      atomicStore<std::uint32_t, cuda::thread_scope_device>(&s->barrierGeneration, generation + 1,
                                                            memory_order_release);
    } else {
      spinUntil(
          [&] {
            return atomicLoad<std::uint32_t, cuda::thread_scope_device>(&s->barrierGeneration,
                                                                        memory_order_acquire) != generation;
          },
          waitContext(c, c.rank), "plan: barrier of the thread blocks", generation);
    }
  }
  __syncthreads();
}

// Calls f.template operator()<kCap>() with 2 or 4 (kMaxFusedRun), the smallest at least `n`: a fused
// op's loop unrolled over its run (registers: docs/executor.md, "Fused ops").
template <class F>
FERRY_DEVICE FERRY_INLINE void withFusedCapacity(int n, F&& f) {
  static_assert(kMaxFusedRun == 4, "a capacity for each run length up to kMaxFusedRun");
  if (n <= 2)
    f.template operator()<2>();
  else
    f.template operator()<4>();
}

// The fused ops (rank_program.hpp, FusedKind), out of line: their unrolled loops would otherwise
// raise the register count and the spills of the whole interpreter, which every op pays for.
FERRY_DEVICE __noinline__ void putPacketsToMany(const ExecOp& op, const ExecArgs& a, const Bases& b,
                                                const CollectiveContext& c, std::uint64_t m) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const std::uint64_t es = a.elementBytes;
  const ExecRef* refs[1 + kMaxFusedRun];
  refs[0] = &op.src;
  for (int i = 0; i < op.nsends; ++i) refs[1 + i] = &a.program.refs[op.firstRef + i];
  forPieces(a, refs, 1 + op.nsends, op.src.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
    const char* src = elementOf(b, a, c, op.src, j, at);
    const std::uint64_t bytes = n * es;
    // Over a capacity, unrolled, so that the destinations stay in registers.
    withFusedCapacity(op.nsends, [&]<int kCap>() {
      LL16Packet* to[kCap];
#pragma unroll
      for (int i = 0; i < kCap; ++i) to[i] = packetsOf(b, a, c, *refs[1 + (i < op.nsends ? i : 0)], j, at);
      for (std::uint64_t w = tid; w < (bytes + 7) / 8; w += nt) {
        const std::uint64_t v = loadWord(src, w, bytes);
#pragma unroll
        for (int i = 0; i < kCap; ++i)
          if (i < op.nsends) to[i][w].write(v, static_cast<std::uint32_t>(m));
      }
    });
  });
}

template <class T, ReduceOp Op>
FERRY_DEVICE __noinline__ void reducePacketsFromMany(const ExecOp& op, const ExecArgs& a, const Bases& b,
                                                     const CollectiveContext& c, std::uint64_t m) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const std::uint64_t es = a.elementBytes;
  // refs: dst (its chunks measure the pieces), the starting value, then the packets.
  const ExecRef* refs[2 + kMaxFusedRun];
  ExecRef packetRefs[kMaxFusedRun];
  refs[0] = &op.dst;
  refs[1] = &op.src;
  for (int i = 0; i < op.nsrcs; ++i) {
    packetRefs[i] = a.program.refs[op.firstRef + i];
    packetRefs[i].rank = kLocal;  // the packets lie in this rank's scratch (rank held the sender)
    refs[2 + i] = &packetRefs[i];
  }
  const std::uint32_t flag = static_cast<std::uint32_t>(m);
  forPieces(a, refs, 2 + op.nsrcs, op.dst.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
    const char* start = elementOf(b, a, c, op.src, j, at);
    char* dst = elementOf(b, a, c, op.dst, j, at);
    const std::uint64_t bytes = n * es;
    withFusedCapacity(op.nsrcs, [&]<int kCap>() {
      // Every slot of the capacity names a source (the first one past nsrcs), unrolled, so that
      // readPackets' addresses stay in registers; only the first nsrcs are reduced.
      const LL16Packet* from[kCap];
      int sender[kCap];
#pragma unroll
      for (int q = 0; q < kCap; ++q) {
        const int i = q < op.nsrcs ? q : 0;
        from[q] = packetsOf(b, a, c, packetRefs[i], j, at);
        sender[q] = a.program.refs[op.firstRef + i].rank;
      }
      for (std::uint64_t w = tid; w < (bytes + 7) / 8; w += nt) {
        std::uint64_t v[kCap] = {};
        readPackets(
            (1u << kCap) - 1, flag, v, [&](int q) { return from[q] + w; },
            [&](int q) { return waitContext(c, sender[q]); });
        std::uint64_t acc = loadWord(start, w, bytes);
#pragma unroll
        for (int q = 0; q < kCap; ++q)
          if (q < op.nsrcs) acc = reduceWord<T, Op>(acc, v[q]);
        storeWord(dst, w, bytes, acc);
      }
    });
  });
}

// `fenced`: the op before this one was a signal on a memory channel, made as a release fence and a
// relaxed store. A signal right after it needs no fence of its own: nothing was written or acquired
// since, and a strong store after that fence forms a release with it (PTX: a release pattern is a
// fence followed by a strong write, to any address; a release store alone would not do). So a
// program that makes all its puts and then all its signals pays one system-scope fence (about 1.5
// us, docs/architecture.md) rather than one per peer. Any other op (a write, a wait's acquire, a
// barrier, a proxy's flush) clears it.
template <class T, ReduceOp Op>
FERRY_DEVICE FERRY_INLINE void runOp(const ExecOp& op, const ExecArgs& a, const Bases& b, const CollectiveContext& c,
                                     std::uint64_t m, bool& fenced) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const int row = laneFlagRow(op.slot, static_cast<int>(blockIdx.x % static_cast<unsigned>(a.lanes)));
  const std::uint64_t es = a.elementBytes;
  const auto kind = static_cast<OpKind>(op.kind);
  const auto elementAt = [&](const ExecRef& r, std::uint64_t j, std::uint64_t at) {
    return elementOf(b, a, c, r, j, at);
  };
  const auto packetsAt = [&](const ExecRef& r, std::uint64_t j, std::uint64_t at) {
    return packetsOf(b, a, c, r, j, at);
  };
  switch (static_cast<FusedKind>(op.kind)) {  // (docs/executor.md, "Fused ops")
    case FusedKind::PutPacketsToMany:
      putPacketsToMany(op, a, b, c, m);
      fenced = false;
      __syncthreads();
      return;
    case FusedKind::ReducePacketsFromMany:
      reducePacketsFromMany<T, Op>(op, a, b, c, m);
      fenced = false;
      __syncthreads();
      return;
    case FusedKind::WaitOnMany:  // thread k waits on the k-th channel; the barrier hands on what each acquired
      if (tid < op.nsrcs) {
        const ExecRef w = a.program.refs[op.firstRef + tid];
        const int lane = static_cast<int>(blockIdx.x % static_cast<unsigned>(a.lanes));
        rowSemaphore(c, laneFlagRow(w.count, lane), w.rank)
            .waitAt(signalValue(m, static_cast<std::uint32_t>(w.index), 1), "plan: wait on a channel");
      }
      fenced = false;
      __syncthreads();
      return;
    default: break;
  }
  switch (kind) {
    case OpKind::Put:
      if (op.proxy && a.ports != nullptr) {  // one thread asks the proxy; the block goes on
        const ExecRef* refs[2] = {&op.src, &op.dst};
        const int o = owner(c, op.dst);
        if (tid == 0)
          forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
            const char* dst = elementAt(op.dst, j, at);
            a.ports->channel[op.peer].put(b.memory[o][op.dst.buffer],
                                          static_cast<std::uint64_t>(dst - b.memoryBase[o][op.dst.buffer]), kLocalPointer,
                                          reinterpret_cast<std::uint64_t>(elementAt(op.src, j, at)), n * es);
          });
        break;
      }
      [[fallthrough]];
    case OpKind::Get:
    case OpKind::Copy: {
      const ExecRef* refs[2] = {&op.src, &op.dst};
      forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
        copy(elementAt(op.dst, j, at), elementAt(op.src, j, at), n * es, tid, nt);
      });
      break;
    }
    case OpKind::Signal: {
      const bool proxy = op.proxy && a.ports != nullptr;
      __syncthreads();
      if (tid == 0 && proxy) a.ports->channel[op.peer].flush();  // the channel's puts have landed
      // A proxy's flush acquires what the copy engine wrote: that needs a fence of its own.
      if (tid == 0 && (!fenced || proxy)) atomicFence(memory_order_release);
      if (tid == 0) rowSemaphore(c, row, op.peer).relaxedSignalAt(signalValue(m, op.seq, 1));
      fenced = !proxy;
      __syncthreads();
      return;
    }
    case OpKind::Wait:
      if (tid == 0) rowSemaphore(c, row, op.peer).waitAt(signalValue(m, op.seq, 1), "plan: wait on a channel");
      break;
    case OpKind::Flush:
      if (tid == 0 && op.proxy && a.ports != nullptr) a.ports->channel[op.peer].flush();
      break;
    case OpKind::Barrier: gridBarrier(c, a); break;
    case OpKind::PutPackets: {
      const ExecRef* refs[2] = {&op.src, &op.dst};
      forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
        const char* src = elementAt(op.src, j, at);
        LL16Packet* packets = packetsAt(op.dst, j, at);
        const std::uint64_t bytes = n * es;
        for (std::uint64_t w = tid; w < (bytes + 7) / 8; w += nt)
          packets[w].write(loadWord(src, w, bytes), static_cast<std::uint32_t>(m));
      });
      break;
    }
    case OpKind::UnpackPackets:
    case OpKind::ReducePackets: {
      const ExecRef* refs[2] = {&op.src, &op.dst};
      const WaitContext ctx = waitContext(c, op.peer);
      forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
        const LL16Packet* packets = packetsAt(op.src, j, at);
        char* dst = elementAt(op.dst, j, at);
        const std::uint64_t bytes = n * es;
        for (std::uint64_t w = tid; w < (bytes + 7) / 8; w += nt) {
          std::uint64_t v = packets[w].read(static_cast<std::uint32_t>(m), ctx);
          if (kind == OpKind::ReducePackets) v = reduceWord<T, Op>(loadWord(dst, w, bytes), v);
          storeWord(dst, w, bytes, v);
        }
      });
      break;
    }
    case OpKind::Reduce:
    case OpKind::ReadReduceCopySend: {
      const ExecRef* refs[kMaxOpSources + kMaxOpDestinations];
      int nrefs = 0;
      refs[nrefs++] = &op.dst;
      for (int i = 0; i < op.nsrcs + op.nsends; ++i) refs[nrefs++] = &a.program.refs[op.firstRef + i];
      forPieces(a, refs, nrefs, op.dst.count, [&](std::uint64_t j, std::uint64_t at, std::uint64_t n) {
        const char* src[kMaxOpSources];
        char* dst[kMaxOpDestinations];
        dst[0] = elementAt(op.dst, j, at);
        for (int i = 0; i < op.nsrcs; ++i) src[i] = elementAt(*refs[1 + i], j, at);
        for (int i = 0; i < op.nsends; ++i) dst[1 + i] = elementAt(*refs[1 + op.nsrcs + i], j, at);
        reduceSources<T, Op>(dst, 1 + op.nsends, src, op.nsrcs, c.nranks, n, tid, nt);
      });
      break;
    }
  }
  fenced = false;
  __syncthreads();
}

// A thread block's first kStagedOps ops are copied into shared memory at the kernel's start, while
// the start handshake is still to come: each op is then read from there, not from global memory by
// every thread (a dependent load of some 40 bytes per op, which on 4 H200 left the small plans at 2-3
// times the native kernels' time: docs/measurements/h200x4-2026-11-26-issue24.md).
constexpr std::uint32_t kStagedOps = 128;
static_assert(sizeof(ExecOp) % 4 == 0 && alignof(ExecOp) <= 4, "ops are staged as 4-byte words");

// The parameters are __grid_constant__: the fused ops, out of line, take them by reference, and
// the address of a plain kernel parameter is that of a copy in each thread's local memory (1168
// bytes a thread, written by all 512 threads of every block at the start of every call: ptxas -v,
// sm_90); the address of a grid constant is the parameter itself.
template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads)
    executePlan(const __grid_constant__ CollectiveContext c, const __grid_constant__ ExecArgs a) {
  __shared__ DirectBuffers direct;
  __shared__ Bases b;
  __shared__ std::uint32_t staged[kStagedOps * sizeof(ExecOp) / 4];
  const unsigned tb = blockIdx.x / static_cast<unsigned>(a.lanes);
  const std::uint32_t first = a.program.tbFirst[tb], last = a.program.tbFirst[tb + 1];
  const std::uint32_t nstaged = min(last - first, kStagedOps);
  {
    const auto* from = reinterpret_cast<const std::uint32_t*>(a.program.ops + first);
    for (std::uint32_t w = threadIdx.x; w < nstaged * sizeof(ExecOp) / 4; w += blockDim.x) staged[w] = from[w];
  }  // (visible to the block after the __syncthreads below)
  std::uint64_t m;
  if (a.direct) {
    m = beginDirect(c, a.mine, a.input, a.output, direct);
  } else {
    const CallStart call = beginCall(c);
    m = call.m;
    awaitPeersStarted(c, call);
  }
  const int p = static_cast<int>(threadIdx.x);
  if (p < c.nranks) {
    const bool me = p == c.rank;
    char* input = me ? const_cast<char*>(a.input) : a.direct ? direct.send[p] : nullptr;
    char* output = me ? a.output : a.direct ? direct.recv[p] : nullptr;
    b.of[p][kInput] = input == nullptr ? nullptr : input + a.roundOffset;
    b.of[p][kOutput] = output == nullptr ? nullptr : output + a.roundOffset;
    char* region = a.ll ? (me ? c.ll : c.peerLl[p]) : (me ? c.scratch : c.peerScratch[p]);
    b.of[p][kScratch] = a.ll ? llHalf(region, c, m) : scratchHalf(region, c, m);
    if (a.ports != nullptr) {
      b.memory[p][kScratch] = a.ports->region[p];
      b.memoryBase[p][kScratch] = reinterpret_cast<const char*>(me ? c.state : c.peerState[p]);
      const RegEntry* entries[2] = {a.direct ? direct.sendEntry[p] : nullptr, a.direct ? direct.recvEntry[p] : nullptr};
      for (int k = 0; k < 2; ++k) {
        b.memory[p][k] = entries[k] != nullptr ? static_cast<std::uint32_t>(entries[k]->memory) : 0;
        b.memoryBase[p][k] = entries[k] != nullptr ? reinterpret_cast<const char*>(entries[k]->base) : nullptr;
      }
    }
  }
  __syncthreads();
  bool fenced = false;
  for (std::uint32_t i = first; i < last; ++i) {
    const ExecOp op = i - first < nstaged ? reinterpret_cast<const ExecOp*>(staged)[i - first] : a.program.ops[i];
    runOp<T, Op>(op, a, b, c, m, fenced);
  }
  if (a.finalExchange || a.average) gridBarrier(c, a);
  if (a.finalExchange && blockIdx.x == 0) {
    // Every block of every rank is done: the peers may let their streams reuse their buffers.
    __syncthreads();
    if (p < c.nranks && p != c.rank) {
      const SemaphoreDeviceHandle end = rowSemaphore(c, kFinalSlot, p);
      end.signalAt(signalValue(m, 0, 7));
      end.waitAt(signalValue(m, 0, 7), "plan: end of call");
    }
  }
  if (a.average) {
    if constexpr (Op == ReduceOp::Sum) {
      if (a.finalExchange) gridBarrier(c, a);  // peers' writes into this output are all in
      const Range part = splitRange(a.outputElements, gridDim.x, blockIdx.x, 1);
      T* out = reinterpret_cast<T*>(a.output + a.roundOffset);
      for (std::uint64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x)
        out[i] = finishOp<ReduceOp::Avg>(out[i], c.nranks);
    }
  }
  endCall(c, m);
}

}  // namespace

void preloadPlanKernels() {
  preloadKernel(executePlan<std::uint8_t, ReduceOp::Sum>);
  forEveryTypeOp([&]<class T, ReduceOp Op>() {
    if constexpr (Op != ReduceOp::Avg) preloadKernel(executePlan<T, Op>);
  });
}

void launchPlan(const Plan& plan, const RankProgram& program, const DeviceProgram& device, const CollectiveCall& call,
                const CollectiveContext& context, PlanState* state, const char* name) {
  if (state == nullptr)
    throw Error(ErrorCode::InternalError, describe(call) + ": " + name + ": the Comm gave the plan no device state");
  ExecArgs a;
  a.program = device;
  a.state = state;
  a.input = static_cast<const char*>(call.send);
  a.output = static_cast<char*>(call.recv);
  a.elementBytes = call.elementBytes();
  a.ll = plan.protocol == Protocol::LL;
  a.direct = program.touchesPeerBuffers;
  a.finalExchange = program.finalExchange;
  a.average = call.reduces() && call.op == ReduceOp::Avg;
  if (a.direct) {
    a.mine.sendId = call.usesSend() ? call.sendId : 0;
    a.mine.sendOffset = call.sendOffset;
    a.mine.recvId = call.recvId;
    a.mine.recvOffset = call.recvOffset;
  }
  // Port channels through the proxy, unless the Comm agreed to run them as memory channels (every
  // peer's memory is mapped here, as the native kernels need: FERRY_PLAN_PORTS).
  const bool portsOnProxy = !context.planPortsAsMemory;
  if (program.usesPortChannels && portsOnProxy) {
    if (context.ports == nullptr)
      throw Error(ErrorCode::InternalError, describe(call) + ": " + name + ": the Comm has no port channels");
    a.ports = const_cast<PortPeers*>(context.ports->start());
  }
  const CollectiveContext c = forCall(context, call);
  const std::uint64_t room =
      a.ll ? context.llSlotBytes * static_cast<std::uint64_t>(context.nranks) : context.scratchHalfBytes;
  const PlanRounds rounds = planRounds(plan, call.count, a.elementBytes, room);
  for (std::uint64_t r = 0; r < rounds.count; ++r) {
    const std::uint64_t first = r * rounds.elements;
    const std::uint64_t elements = std::min(rounds.elements, call.count - first);
    a.geometry = chunkGeometry(plan, call.count, elements);
    a.roundOffset = first * a.elementBytes;
    const std::uint64_t chunkBytes = a.geometry.chunkElements * a.elementBytes;
    a.scratchStride = a.ll ? packetBufferBytes<LL16Packet>(chunkBytes) : chunkBytes;
    a.merge = a.geometry.uniform() && (!a.ll || chunkBytes % 8 == 0);
    a.outputElements = call.recvElements() / call.count * elements;  // avg: one group's part
    a.lanes = planLanes(program, call.bytes() / call.count * elements, context.planLanes, context.maxBlocks,
                        portsOnProxy);
    const auto grid = static_cast<unsigned>(program.threadBlocks() * a.lanes);
    if (!call.reduces()) {
      launchCollective(context.earlyLaunch, executePlan<std::uint8_t, ReduceOp::Sum>, grid, kThreads,
                       call.stream, c, a);
    } else {
      const ReduceOp partial = call.op == ReduceOp::Avg ? ReduceOp::Sum : call.op;
      dispatchTypeOp(call.type, partial, [&]<class T, ReduceOp Op>() {
        if constexpr (Op != ReduceOp::Avg)
          launchCollective(context.earlyLaunch, executePlan<T, Op>, grid, kThreads, call.stream, c, a);
      });
    }
    checkLaunch(call, name);
  }
}

}  // namespace ferry::executor
