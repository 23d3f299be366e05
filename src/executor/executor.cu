// The executor's kernel: block b of rank r interprets thread block b of r's program (rank_program.hpp)
// op by op. Every op is done by the whole block; a __syncthreads() after each data op makes it
// complete for the block before the next op (or a signal) starts.
//
// Where the plan's buffers are: input and output are the call's buffers; scratch is this call's half
// of the Comm's scratch (Simple) or packet region (LL), so the two-halves rule of device_context.hpp
// keeps successive calls apart. A plan that touches peers' input or output runs in direct mode: the
// peers' buffers come from the registrations published at the start (direct_call.cuh), and no rank
// leaves the call before every peer is done with its buffers.
//
// Signals: a channel's n-th signal in call m stores signalValue(m, n, 1) in its flag row of the
// peer's flags; the n-th wait waits for at least that. LL packets carry the call number as flag.
// Avg runs the plan with sum and divides each rank's output once at the end.
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_host.hpp"
#include "collectives/direct_call.cuh"
#include "collectives/kernel_util.cuh"
#include "collectives/launch.hpp"
#include "executor/plan_launch.hpp"
#include "ferry/device/copy.hpp"
#include "ferry/device/packet.hpp"

namespace ferry::executor {
namespace {

constexpr int kInput = static_cast<int>(BufferKind::Input);
constexpr int kOutput = static_cast<int>(BufferKind::Output);
constexpr int kScratch = static_cast<int>(BufferKind::Scratch);

struct ExecArgs {
  DeviceProgram program;
  const char* input = nullptr;
  char* output = nullptr;
  CallBuffers mine;  // direct mode: this rank's registrations, published to the peers
  ChunkGeometry geometry;
  std::uint64_t elementBytes = 0;
  std::uint64_t scratchStride = 0;   // bytes from one scratch chunk to the next
  std::uint64_t outputElements = 0;  // for avg
  CopyEngineHandle ce;  // for the ops of port channels (ExecOp::proxy)
  bool merge = false;  // a multi-chunk reference is one contiguous piece everywhere
  bool direct = false;
  bool ll = false;
  bool average = false;
};

// Every rank's three buffers as seen from here (nullptr: not reachable in this mode).
struct Bases {
  char* of[kMaxRanks][3];
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

// Elements of piece [j, j + n) of an op's chunks: input and output chunks say how long they are;
// an op on scratch alone moves whole chunks.
FERRY_DEVICE FERRY_INLINE std::uint64_t pieceElements(const ExecArgs& a, const ExecRef* const* refs, int nrefs,
                                                      std::uint64_t j, std::uint64_t n) {
  if (a.merge) return n * a.geometry.chunkElements;
  for (int i = 0; i < nrefs; ++i)
    if (refs[i]->buffer != kScratch) return a.geometry.length(static_cast<std::uint64_t>(refs[i]->index) + j);
  return a.geometry.chunkElements;
}

// Calls f(j, elements) for each contiguous piece of an op whose references span `count` chunks.
template <class F>
FERRY_DEVICE FERRY_INLINE void forPieces(const ExecArgs& a, const ExecRef* const* refs, int nrefs, int count, F&& f) {
  const std::uint64_t n = static_cast<std::uint64_t>(count);
  const std::uint64_t pieces = a.merge ? 1 : n, per = a.merge ? n : 1;
  for (std::uint64_t p = 0; p < pieces; ++p) f(p * per, pieceElements(a, refs, nrefs, p * per, per));
}

// Blocks of this kernel meet here (the plan's barrier op, and the end of a call). Every block is
// resident at once: a plan has at most kMaxThreadBlocks of them.
FERRY_DEVICE FERRY_INLINE void gridBarrier(const CollectiveContext& c) {
  __syncthreads();
  if (threadIdx.x == 0) {
    CallState* s = c.state;
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

FERRY_DEVICE FERRY_INLINE std::uint64_t* flagCell(std::uint64_t* flags, int slot, int rank) {
  return flags + static_cast<std::size_t>(slot) * kMaxRanks + rank;
}

template <class T, ReduceOp Op>
FERRY_DEVICE FERRY_INLINE void runOp(const ExecOp& op, const ExecArgs& a, const Bases& b, const CollectiveContext& c,
                                     std::uint64_t m) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const std::uint64_t es = a.elementBytes;
  const auto kind = static_cast<OpKind>(op.kind);
  switch (kind) {
    case OpKind::Put:
      if (op.proxy) {  // one thread asks the copy engine; the block goes on
        const ExecRef* refs[2] = {&op.src, &op.dst};
        if (tid == 0)
          forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t n) {
            a.ce.copy(op.peer, chunkAt(b, a, c, op.dst, j), chunkAt(b, a, c, op.src, j), n * es);
          });
        break;
      }
      [[fallthrough]];
    case OpKind::Get:
    case OpKind::Copy: {
      const ExecRef* refs[2] = {&op.src, &op.dst};
      forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t n) {
        copy(chunkAt(b, a, c, op.dst, j), chunkAt(b, a, c, op.src, j), n * es, tid, nt);
      });
      break;
    }
    case OpKind::Signal:
      __syncthreads();
      if (tid == 0 && op.proxy) a.ce.flushStream(op.peer);  // the channel's puts have landed
      if (tid == 0)
        atomicStore(flagCell(c.peerFlags[op.peer], op.slot, c.rank), signalValue(m, op.seq, 1), memory_order_release);
      break;
    case OpKind::Wait:
      if (tid == 0) {
        const std::uint64_t* cell = flagCell(c.flags, op.slot, op.peer);
        const std::uint64_t want = signalValue(m, op.seq, 1);
        spinUntil([&] { return atomicLoad(cell, memory_order_acquire) >= want; }, waitContext(c, op.peer),
                  "plan: wait on a channel", want);
      }
      break;
    case OpKind::Flush:
      if (tid == 0 && op.proxy) a.ce.flushStream(op.peer);
      break;
    case OpKind::Barrier: gridBarrier(c); break;
    case OpKind::PutPackets: {
      const ExecRef* refs[2] = {&op.src, &op.dst};
      forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t n) {
        const char* src = chunkAt(b, a, c, op.src, j);
        auto* packets = reinterpret_cast<LL16Packet*>(chunkAt(b, a, c, op.dst, j));
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
      forPieces(a, refs, 2, op.src.count, [&](std::uint64_t j, std::uint64_t n) {
        const auto* packets = reinterpret_cast<const LL16Packet*>(chunkAt(b, a, c, op.src, j));
        char* dst = chunkAt(b, a, c, op.dst, j);
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
      forPieces(a, refs, nrefs, op.dst.count, [&](std::uint64_t j, std::uint64_t n) {
        const char* src[kMaxOpSources];
        char* dst[kMaxOpDestinations];
        dst[0] = chunkAt(b, a, c, op.dst, j);
        for (int i = 0; i < op.nsrcs; ++i) src[i] = chunkAt(b, a, c, *refs[1 + i], j);
        for (int i = 0; i < op.nsends; ++i) dst[1 + i] = chunkAt(b, a, c, *refs[1 + op.nsrcs + i], j);
        reduceSources<T, Op>(dst, 1 + op.nsends, src, op.nsrcs, c.nranks, n, tid, nt);
      });
      break;
    }
  }
  __syncthreads();
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) executePlan(CollectiveContext c, ExecArgs a) {
  __shared__ DirectBuffers direct;
  __shared__ Bases b;
  std::uint64_t m;
  if (a.direct) {
    m = beginDirect(c, a.mine, a.input, a.output, direct);
  } else {
    m = beginCall(c);
    awaitPeersStarted(c, m);
  }
  const int p = static_cast<int>(threadIdx.x);
  if (p < c.nranks) {
    const bool me = p == c.rank;
    b.of[p][kInput] = me ? const_cast<char*>(a.input) : a.direct ? direct.send[p] : nullptr;
    b.of[p][kOutput] = me ? a.output : a.direct ? direct.recv[p] : nullptr;
    char* region = a.ll ? (me ? c.ll : c.peerLl[p]) : (me ? c.scratch : c.peerScratch[p]);
    b.of[p][kScratch] = a.ll ? llHalf(region, c, m) : scratchHalf(region, c, m);
  }
  __syncthreads();
  const std::uint32_t first = a.program.tbFirst[blockIdx.x], last = a.program.tbFirst[blockIdx.x + 1];
  for (std::uint32_t i = first; i < last; ++i) {
    const ExecOp op = a.program.ops[i];
    runOp<T, Op>(op, a, b, c, m);
  }
  if (a.direct || a.average) gridBarrier(c);
  if (a.direct && blockIdx.x == 0) {
    // Every block of every rank is done: the peers may let their streams reuse their buffers.
    __syncthreads();
    if (p < c.nranks && p != c.rank) {
      atomicStore(flagCell(c.peerFlags[p], kFinalSlot, c.rank), signalValue(m, 0, 7), memory_order_release);
      const std::uint64_t* cell = flagCell(c.flags, kFinalSlot, p);
      spinUntil([&] { return atomicLoad(cell, memory_order_acquire) >= signalValue(m, 0, 7); }, waitContext(c, p),
                "plan: end of call", m);
    }
  }
  if (a.average) {
    if constexpr (Op == ReduceOp::Sum) {
      if (a.direct) gridBarrier(c);  // peers' writes into this output are all in
      const Range part = splitRange(a.outputElements, gridDim.x, blockIdx.x, 1);
      T* out = reinterpret_cast<T*>(a.output);
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
                const CollectiveContext& context, const char* name) {
  ExecArgs a;
  a.program = device;
  a.input = static_cast<const char*>(call.send);
  a.output = static_cast<char*>(call.recv);
  a.geometry = chunkGeometry(plan, call.count);
  a.elementBytes = call.elementBytes();
  const std::uint64_t chunkBytes = a.geometry.chunkElements * a.elementBytes;
  a.ll = plan.protocol == Protocol::LL;
  a.scratchStride = a.ll ? packetBufferBytes<LL16Packet>(chunkBytes) : chunkBytes;
  a.merge = a.geometry.uniform() && (!a.ll || chunkBytes % 8 == 0);
  a.direct = program.touchesPeerBuffers;
  a.average = call.reduces() && call.op == ReduceOp::Avg;
  a.outputElements = call.recvElements();
  if (a.direct) {
    a.mine.sendId = call.usesSend() ? call.sendId : 0;
    a.mine.sendOffset = call.sendOffset;
    a.mine.recvId = call.recvId;
    a.mine.recvOffset = call.recvOffset;
  }
  if (program.usesCopyEngine) {
    if (context.copyEngine == nullptr)
      throw Error(ErrorCode::InternalError, describe(call) + ": " + name + ": the Comm has no copy engine");
    a.ce = context.copyEngine->handle();
  }
  const CollectiveContext c = forCall(context, call);
  const auto grid = static_cast<unsigned>(program.threadBlocks());
  if (!call.reduces()) {
    executePlan<std::uint8_t, ReduceOp::Sum><<<grid, kThreads, 0, call.stream>>>(c, a);
  } else {
    const ReduceOp partial = call.op == ReduceOp::Avg ? ReduceOp::Sum : call.op;
    dispatchTypeOp(call.type, partial, [&]<class T, ReduceOp Op>() {
      if constexpr (Op != ReduceOp::Avg) executePlan<T, Op><<<grid, kThreads, 0, call.stream>>>(c, a);
    });
  }
  checkLaunch(call, name);
}

}  // namespace ferry::executor
