#pragma once
// The frame of every direct (zero-copy) kernel: the call reads and writes the peers' own send and
// recv buffers, registered with Comm::registerBuffer, instead of going through scratch.
//
//   beginDirect   block 0 tells each peer where this rank's buffers are (CallBuffers as LL packets,
//                 then the start flag); every block waits until each peer has started this very
//                 call (its stream reached the call: its buffers are ready and no longer in earlier
//                 use), takes the peer's descriptor from its packets and looks the peer's buffers
//                 up in the registration table.
//   finishDirect  every block signals every peer and waits for all of them: no rank leaves the
//                 call (and lets its stream reuse the buffers) while a peer may still touch them.
//
// A peer that runs another algorithm for the call (its buffers are not registered while this
// rank's are) or whose registration is not in this rank's table is an error: the kernel reports
// the rank, the peer and what to do, and traps.
#include <cstdio>
#include <string>

#include "kernels/collective_call.hpp"
#include "kernels/device_context.hpp"
#include "kernels/registration.hpp"

namespace ferry {

// What this rank publishes to its peers for `call` (host side of beginDirect).
inline CallBuffers published(const CollectiveCall& call) {
  CallBuffers d;
  d.sendId = call.usesSend() ? call.sendId : 0;
  d.sendOffset = call.sendOffset;
  d.recvId = call.recvId;
  d.recvOffset = call.recvOffset;
  return d;
}

// Empty when every buffer of the call is registered; otherwise why not, for Algorithm::whyNot.
inline std::string notRegistered(const CollectiveCall& call) {
  if (call.registered()) return {};
  return std::string(call.usesRecv() && call.recvId == 0 ? "the recv" : "the send") +
         " buffer is not registered (Comm::registerBuffer, on every rank)";
}

// What stops an algorithm that writes straight into the peers' outputs: unregistered buffers, and
// an in-place allToAll (a peer's block would land on one not yet sent).
inline std::string whyNotZeroCopy(const CollectiveCall& call) {
  if (std::string why = notRegistered(call); !why.empty()) return why;
  if (call.collective == Collective::AllToAll && call.inPlace())
    return "in place, a peer's block would overwrite one not yet sent (use alltoall_push)";
  return {};
}

// Every rank's send and recv buffer for this call, as addressed here (nullptr where unused), and
// the registrations that hold them (for kernels that name them to a port channel: port_peers.hpp).
struct DirectBuffers {
  char* send[kMaxRanks];
  char* recv[kMaxRanks];
  const RegEntry* sendEntry[kMaxRanks];
  const RegEntry* recvEntry[kMaxRanks];
};

#if defined(__CUDACC__)

FERRY_DEVICE FERRY_INLINE void directFail(const CollectiveContext& c, int peer, const char* what,
                                          std::uint64_t detail) {
  printf("ferry: rank %d: %s (direct): %s rank %d (detail %llu); register the same buffers with "
         "Comm::registerBuffer on every rank, in the same order, or on none\n",
         c.rank, collectiveName(c.op), what, peer, static_cast<unsigned long long>(detail));
  __trap();
}

// Sets `entry` to the registration of `peer` with that id and returns the buffer at `offset` in it.
FERRY_DEVICE FERRY_INLINE char* resolveBuffer(const CollectiveContext& c, int peer, std::uint64_t id,
                                              std::uint64_t offset, const RegEntry*& entry) {
  entry = nullptr;
  if (id == 0) return nullptr;
  const RegEntry& e = c.regs->entry[id % kRegSlots][peer];
  if (e.id != id) directFail(c, peer, "no mapping here of the registered buffer (id in detail) of", id);
  entry = &e;
  return reinterpret_cast<char*>(e.base) + offset;
}

// Writes `mine` into a peer's descriptor (one thread): each word a packet flagged with call m.
FERRY_DEVICE FERRY_INLINE void writeDescriptor(DirectDescriptor& to, const CallBuffers& mine, std::uint64_t m) {
  const std::uint64_t words[DirectDescriptor::kWords] = {mine.sendId, mine.sendOffset, mine.recvId, mine.recvOffset};
#pragma unroll
  for (int i = 0; i < DirectDescriptor::kWords; ++i) to.word[i].write(words[i], static_cast<std::uint32_t>(m));
}

// Reads peer p's descriptor of call m (one thread), once the peer's start word has shown call m.
// The packets were stored before that word, so they are almost always there at the first look;
// true once every one carries m. False if the Comm was aborted, or if a look that began a
// millisecond after the first still finds one missing: a peer that started call m without writing
// them runs it without direct (its buffers are not registered), and waiting on would only trade the
// report for a timeout's. (The deadline is read before the look, so a thread descheduled between a
// look and the clock cannot fail on a look made in time.)
FERRY_DEVICE FERRY_INLINE bool readDescriptor(const CollectiveContext& c, const DirectDescriptor& from,
                                              std::uint64_t m, CallBuffers& theirs) {
  const auto flag = static_cast<std::uint32_t>(m);
  std::uint64_t words[DirectDescriptor::kWords];
  const std::uint64_t deadline = globalTimerNs() + 1000000;
  for (;;) {
    const bool late = globalTimerNs() > deadline;
    bool all = true;
#pragma unroll
    for (int i = 0; i < DirectDescriptor::kWords; ++i) all = from.word[i].tryRead(flag, words[i]) && all;
    if (all) break;
    if (late || abortRaised(c)) return false;
  }
  theirs.sendId = words[0];
  theirs.sendOffset = words[1];
  theirs.recvId = words[2];
  theirs.recvOffset = words[3];
  return true;
}

// Returns m, the call's number; fills `out` (shared memory) for the whole block.
// recvPeers: the peers whose recv buffer the kernel writes (bit p: peer p; a reduce needs only the
// root's); a peer without one there is an error.
FERRY_DEVICE FERRY_INLINE std::uint64_t beginDirect(const CollectiveContext& c, const CallBuffers& mine,
                                                    const char* send, char* recv, DirectBuffers& out,
                                                    unsigned recvPeers = ~0u) {
  awaitPreviousKernel();
  const std::uint64_t m = callOfCount(loadCallsDone(c));
  stampPhase(c.stamps, m, kEntered, c.op, c.count);
  const int p = static_cast<int>(threadIdx.x);
  if (p < c.nranks && p != c.rank) {
    if (blockIdx.x == 0) {
      // The peer reads its descriptor half (m & 1) in its blocks of call m - 2; it started call
      // m - 1 only once every one of them was done. Almost always so already, but a rank may leave
      // a call while some of a peer's blocks have yet to start (a plan without the end-of-call
      // exchange), then pass a call that waits for nothing of that peer.
      awaitPeerStarted(c, p, m);
      writeDescriptor(c.peerDescriptors[p][(m & 1) * kMaxRanks + c.rank], mine, m);
      // The descriptor travels in packets, so the start word publishes nothing and needs no
      // system-scope fence (what it tells, as beginCall's: this rank's stream reached call m).
      rowSemaphore(c, 0, p).relaxedSignalAt(startWord(m, c.shape));
    }
    const std::uint64_t word = rowSemaphore(c, 0, p).waitAt(startWord(m, 0), "collective: peer start of this call");
    checkPeerShape(c, p, word, m);  // before this rank touches the peer's buffers
    CallBuffers theirs;
    const bool described = readDescriptor(c, c.descriptors[(m & 1) * kMaxRanks + p], m, theirs);
    if (!described && abortRaised(c)) {
      // The wait gave up (Comm::abort): the peer's descriptor is stale. This rank's own buffers,
      // which have the same sizes, stand in, so the kernel runs to its end touching valid memory.
      out.send[p] = const_cast<char*>(send != nullptr ? send : recv);
      out.recv[p] = recv;
      out.sendEntry[p] = out.recvEntry[p] = nullptr;
    } else {
      if (!described)
        directFail(c, p, "this call is direct here but not (its buffers are not registered?) on", m);
      out.send[p] = resolveBuffer(c, p, theirs.sendId, theirs.sendOffset, out.sendEntry[p]);
      out.recv[p] = resolveBuffer(c, p, theirs.recvId, theirs.recvOffset, out.recvEntry[p]);
      if (out.recv[p] == nullptr && (recvPeers >> p & 1))
        directFail(c, p, "no registered recv buffer from", 0);
    }
  } else if (p == c.rank) {
    out.send[p] = const_cast<char*>(send);
    out.recv[p] = recv;
    // This rank's own entries, read only by the kernels that name buffers to a port channel.
    out.sendEntry[p] = mine.sendId == 0 ? nullptr : &c.regs->entry[mine.sendId % kRegSlots][p];
    out.recvEntry[p] = mine.recvId == 0 ? nullptr : &c.regs->entry[mine.recvId % kRegSlots][p];
  }
  __syncthreads();
  stampPhase(c.stamps, m, kStarted);
  return m;
}

FERRY_DEVICE FERRY_INLINE void finishDirect(const CollectiveContext& c, std::uint64_t m) {
  exchangeSignals(c, signalValue(m, 0, 7));
  endCall(c, m);
}

#endif  // __CUDACC__

}  // namespace ferry
