#pragma once
// What every collective kernel gets (by value): where this rank's and each peer's shared buffers
// are, and the call counter. One allocation per rank (CommResources) holds, in order:
//
//   CallState   the abort word, and the calls completed, once per block index (loadCallsDone)
//   flags       uint64 inbound flags: slot 0 holds "peer p started call m" (the start row: startWord),
//               slot 1 + b is block b's signal row; flags[slot * kMaxRanks + p] is written by peer p only
//   descriptors two halves of one DirectDescriptor per peer: where a direct (zero-copy) call's
//               buffers are, as LL packets the peer writes before its start flag (registration.hpp)
//   LL region   two halves; each holds one packet slot per sending rank
//   scratch     two halves, for Simple-protocol algorithms
//
// Why two halves, and the one rule that makes reuse safe: call m uses half m % 2 of a region. A rank
// writes into a peer's half (or into its own half that peers read) only after the peer has started
// call m - 1, which it announces in its epoch row at kernel start; a kernel starts only after the
// previous one on its stream finished, so the peer is done with call m - 2, the last user of that
// half. Symmetric algorithms find that already true; for a broadcast root it is a real wait.
//
// Signal values are (epoch << 20) | (round << 3) | phase, increasing over a Comm's life, so a flag
// is never reset and a wait is `flag >= value`.
//
// A start word carries, below the call's number, a digest of the call's arguments (its shape:
// collective, count, type, op, root). Ranks whose calls differ would otherwise exchange
// mismatched data, or write past a peer's buffer: each rank compares the shape of every peer it
// hears from with its own, before a direct call touches a peer's buffers and at the end of every
// call, and stops the kernel with a report on a difference. The check rides on stores and loads
// the call makes anyway.
#include <cstdint>
#include <cstdio>

#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/macros.hpp"
#include "ferry/device/semaphore.hpp"
#include "ferry/device/timeout.hpp"
#include "kernels/phase_stamps.hpp"

namespace ferry {

inline constexpr int kMaxRanks = 8;
inline constexpr int kMaxBlocks = 128;
// Flag rows: 0 for call starts, 1 + b for block b of a native kernel, and the executor's rows for
// its channels in every lane (executor/rank_program.hpp), which take the most.
inline constexpr int kFlagSlots = 8192;  // a plan's 64 lanes of channel rows (executor.cu)

// What every algorithm of the Comm shares: the call counter and the abort word. State of one
// algorithm's own lives elsewhere (Algorithm::deviceStateBytes).
struct CallState {
  std::uint32_t aborted;  // raised by Comm::abort on any rank; every wait then gives up
  std::uint32_t unused;
  // The calls completed on this rank, once per block index: block b of a call reads calls[b] and
  // no other (loadCallsDone), so no block of a call waits for another's count (endCall).
  std::uint64_t calls[kMaxBlocks];
};

inline constexpr int kShapeBits = 24;
inline constexpr std::uint64_t kShapeMask = (std::uint64_t{1} << kShapeBits) - 1;

// The start word of call m with the given shape, and the call number in one.
FERRY_HOST_DEVICE constexpr std::uint64_t startWord(std::uint64_t m, std::uint64_t shape) {
  return m << kShapeBits | (shape & kShapeMask);
}
FERRY_HOST_DEVICE constexpr std::uint64_t startedCall(std::uint64_t word) { return word >> kShapeBits; }

struct DirectDescriptor;
struct RegTable;
class PortPeersSource;
struct P2PLauncher;
namespace executor {
class DevicePlans;
}

struct CollectiveContext {
  int rank = 0;
  int nranks = 1;
  CallState* state = nullptr;
  CallState* peerState[kMaxRanks] = {};  // for Comm::abort, which raises every rank's flag
  std::uint64_t* flags = nullptr;  // [kFlagSlots][kMaxRanks], this rank's
  std::uint64_t* peerFlags[kMaxRanks] = {};
  DirectDescriptor* descriptors = nullptr;  // [2][kMaxRanks], this rank's
  DirectDescriptor* peerDescriptors[kMaxRanks] = {};
  const RegTable* regs = nullptr;  // this rank's table of every rank's registered buffers
  char* ll = nullptr;              // this rank's LL region (both halves)
  char* peerLl[kMaxRanks] = {};
  char* scratch = nullptr;         // this rank's scratch (both halves)
  char* peerScratch[kMaxRanks] = {};
  std::uint64_t llHalfBytes = 0;       // nranks packet slots
  std::uint64_t llSlotBytes = 0;       // packet bytes of one slot (twice the data it carries)
  std::uint64_t scratchHalfBytes = 0;
  std::uint64_t timeoutNs = 0;
  int op = 0;  // which collective, for timeout reports (Collective)
  // The call's shape (see startWord) and its count, for the report when a peer's shape differs.
  std::uint64_t shape = 0;
  std::uint64_t count = 0;
  int minBlocks = 1;           // host only: bounds on a kernel's blocks (CommOptions)
  int maxBlocks = kMaxBlocks;
  int planLanes = 1;  // host only: the most lanes a plan's thread block may run in (FERRY_PLAN_LANES)
  bool planPortsAsMemory = false;  // host only: a plan's port-channel puts are stores (FERRY_PLAN_PORTS)
  const executor::DevicePlans* plans = nullptr;  // host only: the loaded plans, uploaded here
  PortPeersSource* ports = nullptr;              // host only: the Comm's channels to its peers (port_peers.hpp)
  const P2PLauncher* p2p = nullptr;              // host only: the Comm's send/recv kernel (collectives/p2p.hpp)
  bool earlyLaunch = false;       // host only: launch with programmatic dependent launch (FERRY_LAUNCH_PDL)
  PhaseRecord* stamps = nullptr;  // FERRY_PHASE_STAMPS: where block 0 records its phases (phase_stamps.hpp)
};

// The signal value of (call, round, phase). phase in [1, 7], round < 2^17.
FERRY_HOST_DEVICE constexpr std::uint64_t signalValue(std::uint64_t epoch, std::uint64_t round,
                                                      std::uint64_t phase) {
  return epoch << 20 | round << 3 | phase;
}

#if defined(__CUDACC__)

FERRY_DEVICE FERRY_INLINE const char* collectiveName(int op) {
  switch (op) {
    case 0: return "allReduce";
    case 1: return "allGather";
    case 2: return "reduceScatter";
    case 3: return "allToAll";
    case 4: return "broadcast";
    case 5: return "reduce";
  }
  return "collective";
}

FERRY_DEVICE FERRY_INLINE WaitContext waitContext(const CollectiveContext& c, int peer) {
  return WaitContext{c.rank, peer, c.timeoutNs, &c.state->aborted};
}

// True once Comm::abort raised this Comm's abort word (on any rank).
FERRY_DEVICE FERRY_INLINE bool abortRaised(const CollectiveContext& c) {
  return *static_cast<const volatile std::uint32_t*>(&c.state->aborted) != 0;
}

// The flag rows are semaphores of the channel layer (ferry/device/semaphore.hpp), used stamped:
// the inbound word of (row, sender p) on this rank is flags[row * kMaxRanks + p], and this rank
// signals p by storing into p's word of (row, this rank). Built in registers from the kernel's
// parameters, so a signal is one store and a wait one polling load, as before they were handles.
FERRY_DEVICE FERRY_INLINE SemaphoreDeviceHandle rowSemaphore(const CollectiveContext& c, int row, int p) {
  SemaphoreDeviceHandle s;
  s.inbound = c.flags + static_cast<std::uint64_t>(row) * kMaxRanks + p;
  s.remoteInbound = c.peerFlags[p] + static_cast<std::uint64_t>(row) * kMaxRanks + c.rank;
  s.wait_ = waitContext(c, p);
  return s;
}

// Programmatic dependent launch (FERRY_LAUNCH_PDL, launchCollective): a kernel launched with it may
// start while the previous kernel of its stream still runs. Every collective kernel waits here,
// before its first access to memory, until that kernel has finished and its writes are visible,
// which is what stream order gives without it, and at once lets the next kernel of the stream get
// its blocks onto the SMs, so that its launch overlaps this call instead of following it. Both are
// no-ops for a kernel launched without the attribute.
FERRY_DEVICE FERRY_INLINE void awaitPreviousKernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The call's number: the calls completed, as block b's copy of the count holds it (CallState::calls).
// Every copy holds the same count between kernels: every block of a call of g blocks stores the new
// count into copies b, b + g, b + 2g, ... at its end (endCall), after its own threads have read
// copy b; no block of the call reads another's copy, and the next kernel of the stream reads them
// only once this one has ended (stream order, or awaitPreviousKernel under FERRY_LAUNCH_PDL). So a
// call's start is a load, in every block: no atomic, no barrier, and no block counts the others.
// (It replaced a ticket per block, one atomic and a barrier to share it: 0.18-0.39 us a call from
// 16 KiB on 2 H100, docs/architecture.md, "Latency".)
// Strong accesses, not loads through the SM's L1, which may hold a line an earlier kernel's block
// read there when this kernel was launched early (FERRY_LAUNCH_PDL).
FERRY_DEVICE FERRY_INLINE std::uint64_t loadCallsDone(const CollectiveContext& c) {
  return atomicLoad<std::uint64_t, cuda::thread_scope_device>(&c.state->calls[blockIdx.x], memory_order_relaxed);
}
// The call number the loaded count gives: 1 for the first call.
FERRY_DEVICE FERRY_INLINE std::uint64_t callOfCount(std::uint64_t done) { return done + 1; }

// What beginCall hands the kernel: the call's number, and in thread p (one per peer) the start
// word of peer p as it was loaded at the kernel's start, which awaitPeersStarted checks before it
// polls.
struct CallStart {
  std::uint64_t m;
  std::uint64_t seen;
};

// Every block calls this first. Returns m, the number of this call (1 for the first), and the
// peers' start words it loaded (CallStart). Block 0 announces m to every peer.
//
// Three loads are in flight at once, so the start costs one memory round trip, not three: the
// count of calls done (loadCallsDone), what `prefetch` loads (a kernel's first words of input, which it must not
// use before this returns), and each peer's start word (thread p). The start word's load is an
// acquire, which holds back only the loads after it, so it comes last.
//
// The announcement is a relaxed store, not signalAt's release: it publishes no data. What a peer
// learns from it is that this rank is done with call m - 1's reads of the half that call m + 1
// writes, and those reads belong to an earlier kernel of this stream, which had finished (its loads
// returned) before this one began. A release would put a system-scope fence at the head of every
// call (docs/architecture.md, "Latency"). beginDirect's start word is relaxed too: its descriptor
// travels in packets of its own (direct_call.cuh), and the buffers it names were written by earlier
// kernels of the stream, done before this one began.
template <class Prefetch>
FERRY_DEVICE FERRY_INLINE CallStart beginCall(const CollectiveContext& c, Prefetch&& prefetch) {
  awaitPreviousKernel();
  const std::uint64_t done = loadCallsDone(c);
  prefetch();
  const int p = static_cast<int>(threadIdx.x);
  const bool peer = p < c.nranks && p != c.rank;
  const std::uint64_t seen = peer ? rowSemaphore(c, 0, p).inboundValue() : 0;
  const std::uint64_t m = callOfCount(done);
  stampPhase(c.stamps, m, kEntered, c.op, c.count);
  if (blockIdx.x == 0 && peer) rowSemaphore(c, 0, p).relaxedSignalAt(startWord(m, c.shape));
  stampPhase(c.stamps, m, kAnnounced);
  return CallStart{m, seen};
}
FERRY_DEVICE FERRY_INLINE CallStart beginCall(const CollectiveContext& c) {
  return beginCall(c, [] {});
}

// Called by thread p (one per peer): waits until peer p has started call m - 1 (see above).
// (A start word of call m - 1 or later, whatever its shape, is >= startWord(m - 1, 0).)
FERRY_DEVICE FERRY_INLINE void awaitPeerStarted(const CollectiveContext& c, int p, std::uint64_t m) {
  rowSemaphore(c, 0, p).waitAt(startWord(m - 1, 0), "collective: peer start of previous call");
}

// Peer p's start word `word` says it is in call m: its shape must be this rank's.
FERRY_DEVICE FERRY_INLINE void checkPeerShape(const CollectiveContext& c, int p, std::uint64_t word,
                                              std::uint64_t m) {
  if (startedCall(word) != m || (word & kShapeMask) == (c.shape & kShapeMask) || abortRaised(c)) return;
  printf(
      "ferry: rank %d: %s (call %llu, count %llu here): rank %d made this call with other arguments (the "
      "collective, count, data type, reduce op or root differ); every rank must make the same calls, in the "
      "same order, with matching arguments\n",
      c.rank, collectiveName(c.op), static_cast<unsigned long long>(m),
      static_cast<unsigned long long>(c.count), p);
  __trap();
}

// Threads [0, nranks) of the block: each waits for its peer to have started call m - 1, which the
// start word beginCall loaded mostly shows already (then nothing is polled). Ends with
// __syncthreads(); every thread of the block must call it.
// mask: the peers to wait for (bit p: peer p).
FERRY_DEVICE FERRY_INLINE void awaitPeersStarted(const CollectiveContext& c, const CallStart& start,
                                                 unsigned mask = ~0u) {
  const int p = static_cast<int>(threadIdx.x);
  if (p < c.nranks && p != c.rank && (mask >> p & 1) && start.seen < startWord(start.m - 1, 0))
    awaitPeerStarted(c, p, start.m);
  __syncthreads();
  stampPhase(c.stamps, start.m, kStarted);
}

// One thread: tells peer p that this block reached `value`, after every write of the block made
// before the __syncthreads() that precedes the call.
FERRY_DEVICE FERRY_INLINE void signalPeer(const CollectiveContext& c, int p, std::uint64_t value) {
  rowSemaphore(c, 1 + static_cast<int>(blockIdx.x), p).signalAt(value);
}

// One thread: waits until peer p's block of the same index reached `value`; afterwards the
// peer's writes before its signal are visible to this thread (and to the block after a barrier).
FERRY_DEVICE FERRY_INLINE void waitPeer(const CollectiveContext& c, int p, std::uint64_t value) {
  rowSemaphore(c, 1 + static_cast<int>(blockIdx.x), p).waitAt(value, collectiveName(c.op));
}

// The whole block: signal the peers in signalMask (bit p: peer p), then wait for those in
// waitMask, at `value`. Ends with __syncthreads(), after which the waited-for peers' writes before
// their signals are visible to the block.
FERRY_DEVICE FERRY_INLINE void signalAndWait(const CollectiveContext& c, std::uint64_t value,
                                             unsigned signalMask, unsigned waitMask) {
  __syncthreads();
  const int p = static_cast<int>(threadIdx.x);
  if (p < c.nranks && p != c.rank) {
    if (signalMask >> p & 1) signalPeer(c, p, value);
    if (waitMask >> p & 1) waitPeer(c, p, value);
  }
  __syncthreads();
}

// Every peer both ways.
FERRY_DEVICE FERRY_INLINE void exchangeSignals(const CollectiveContext& c, std::uint64_t value) {
  signalAndWait(c, value, ~0u, ~0u);
}

// Every block calls this last: it counts the call done in its copies of the count (see
// loadCallsDone), after the barrier that follows every read of them. Block 0 checks the shape of
// every peer still in this call (the block's last threads, so they load beside the first threads'
// stores). A peer may already be in the next call, whose word hides this one's shape; whichever of
// a pair finishes first sees the other's.
FERRY_DEVICE FERRY_INLINE void endCall(const CollectiveContext& c, std::uint64_t m) {
  __syncthreads();
  stampPhase(c.stamps, m, kDataDone);
  const int checker = static_cast<int>(blockDim.x - 1 - threadIdx.x);
  if (blockIdx.x == 0 && checker < c.nranks && checker != c.rank)
    checkPeerShape(c, checker, atomicLoad(rowSemaphore(c, 0, checker).inbound, memory_order_relaxed), m);
  for (unsigned b = blockIdx.x + threadIdx.x * gridDim.x; b < kMaxBlocks; b += blockDim.x * gridDim.x)
    atomicStore<std::uint64_t, cuda::thread_scope_device>(&c.state->calls[b], m, memory_order_relaxed);
  stampPhase(c.stamps, m, kExited);
}

// This call's half of a region.
FERRY_DEVICE FERRY_INLINE char* llHalf(char* base, const CollectiveContext& c, std::uint64_t m) {
  return base + (m & 1) * c.llHalfBytes;
}
FERRY_DEVICE FERRY_INLINE char* scratchHalf(char* base, const CollectiveContext& c, std::uint64_t m) {
  return base + (m & 1) * c.scratchHalfBytes;
}

#endif  // __CUDACC__

}  // namespace ferry
