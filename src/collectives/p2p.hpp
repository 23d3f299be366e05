#pragma once
// Point-to-point: send and recv between two ranks of a Comm, through an inbox each rank keeps for
// every peer (one allocation per rank, mapped by every peer, made with the Comm).
//
// A message is cut into lanes (the same number on both sides, decided by its size alone: one per
// kP2PLaneGrain, at most kP2PLanes) and each lane into chunks of p2pChunkBytes (at most a slot).
// Lane l from rank s to rank r is a ring of kP2PSlots chunk slots in r's inbox with two counters
// that only grow: `arrived` (in r's memory, written by s: chunks written so far) and `acked` (in
// s's memory, written by r: chunks copied out so far). The sender writes chunk g into slot g % kP2PSlots once
// acked >= g + 1 - kP2PSlots; the receiver copies it out once arrived >= g + 1. Each side also
// keeps its own running total per (peer, lane), so consecutive messages continue where the last
// left off, also across CUDA graph replays. Beside each slot the sender writes the size of the
// message the chunk belongs to (before `arrived`, which releases both); the receiver compares it
// with its own recv's size, so a send and recv that disagree stop with a report instead of
// desynchronizing the lanes (a slot is not rewritten before the receiver acks it, so the size it
// reads is that of its own chunk's message).
//
// A group's sends (or recvs) with one peer form one stream of messages, in issue order. Lanes are
// the protocol; blocks are each side's own choice: a stream's B blocks take its work items
// (message, lane) in increasing order, block b the lanes b, b + B, ... of every message. The
// smallest unfinished item is then the current one of both its sender's block and its receiver's,
// so it always progresses, whatever B each side chose; and the running totals per (peer, lane)
// advance in the same order on both sides. Every block of a group is one block of one kernel, and a
// send waiting for its receiver must never keep a recv of the same group from running, so they
// must all be resident at once: a group shares the blocks that fit on the GPU among its streams
// (planP2PGroup). Sends to and receives from the rank itself pair up in the group as a stream of
// copies in the same kernel, beside the transfers.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device_context.hpp"
#include "kernels/phase_stamps.hpp"
#include "transport/peer_memory.hpp"

namespace ferry {

// On 2 H200, 16 lanes of one 256-thread block each with 32 KiB chunks moved 137 GB/s: too few bytes
// in flight, and a fence every 32 KiB. On 2 H100, 32 lanes moved 274 GB/s at 1 GiB, where one
// 132-block kernel's puts reach 364 GB/s: a block's stores alone do not fill NVLink, so large
// messages take 64 lanes. Each chunk ends with a barrier and a system-scope release (about 1.5 us
// in which the block stores nothing), so larger chunks waste less: on 2 H200 (sendrecv and
// alltoall at 16 MiB-1 GiB, 2026-11-27, docs/measurements/h200x2-2026-11-27-p2p-chunks.md) two
// 256 KiB slots a lane moved 364 GB/s at 1 GiB where four of 64 KiB moved 338 (NCCL 365); 128
// lanes of 32 or 64 KiB (336-349), three or four slots of 128 KiB (360) and 32 lanes of 256 KiB (353)
// did less. But a lane of 256 KiB (a 16 MiB message) then goes as one chunk, its copy-out after
// its stores (59.4 us at 16 MiB where four chunks of 64 KiB took 56.5), so a lane's chunks are a
// quarter of its part, between 64 and 256 KiB (p2pChunkBytes): both sides compute them from the
// part's size, and a slot holds any of them. An inbox holds kP2PLanes * kP2PSlots *
// kP2PChunkBytes (32 MiB) per sender.
inline constexpr int kP2PLanes = 64;
inline constexpr int kP2PSlots = 2;
inline constexpr std::uint64_t kP2PChunkBytes = 256 << 10;  // a slot; the largest chunk
inline constexpr std::uint64_t kP2PMinChunkBytes = 64 << 10;
inline constexpr std::uint64_t kP2PLaneGrain = 32 << 10;  // message bytes per lane, below kP2PLanes lanes
inline constexpr int kP2PThreads = 512;
inline constexpr std::uint64_t kP2PEarlyBytes = 1 << 20;  // launchP2P
inline constexpr int kP2PMaxOps = 64;       // messages per group
inline constexpr int kP2PMaxStreams = 2 * kMaxRanks + 1;  // (peer, direction), and the copies to self

// Small messages go as packets (LL16, ferry/device/packet.hpp): each lane's part is one chunk of
// packets that carry their own flag (the chunk's number g + 1), so the receiver polls the data
// itself and the sender needs no fence before a signal (a system-scope fence costs about 1.5 us on
// H100). Packets take twice the bytes, so only up to kP2PPacketBytes, in lanes of at most
// kP2PPacketLaneGrain, whose packets fit a slot.
// Packets have slots of their own (p2pPacketSlotOffset), never written by the other protocol: a
// chunk's raw data left in a slot could hold the flag a later packet's receiver polls for.
// Their ring of slots is deeper than the raw chunks' (back-to-back small calls keep going while
// the receiver acknowledges): `acked` counts both protocols' chunks of a lane in order, so acked >=
// g + 1 - S frees the slot g % S of either ring, whichever protocol used it before.
inline constexpr int kP2PPacketSlots = 4;
inline constexpr std::uint64_t kP2PPacketBytes = 64 << 10;
// Lanes of 4 KiB: a lane is one block, and a block's threads read and write their packets one
// after another, so at 16 KiB lanes a 16 KiB message took 5.1 us and one of 4 KiB 3.9; with 4 KiB
// lanes, 4.1 us, and 64 KiB 4.4 instead of 5.2 (2 H200, sendrecv, 2026-11-27).
inline constexpr std::uint64_t kP2PPacketLaneGrain = 4 << 10;
inline constexpr int kP2PPacketLanes = static_cast<int>(kP2PPacketBytes / kP2PPacketLaneGrain);
// Packet 0 carries the message's size, packet 1 + w word w of the lane's part.
inline constexpr std::uint64_t kP2PPacketSlotBytes = 16 * (1 + kP2PPacketLaneGrain / 8);

FERRY_HOST_DEVICE constexpr bool p2pPackets(std::uint64_t bytes) { return bytes <= kP2PPacketBytes; }

// Lanes of a message: one per kP2PLaneGrain (kP2PPacketLaneGrain for packets), at most kP2PLanes.
// Both sides compute it from the size.
FERRY_HOST_DEVICE constexpr int p2pLanes(std::uint64_t bytes) {
  const std::uint64_t grain = p2pPackets(bytes) ? kP2PPacketLaneGrain : kP2PLaneGrain;
  const std::uint64_t n = (bytes + grain - 1) / grain;
  return n < 1 ? 1 : n > kP2PLanes ? kP2PLanes : static_cast<int>(n);
}

// The chunks of a lane's part of `partBytes`: a quarter of it in whole 16 bytes, within
// [kP2PMinChunkBytes, kP2PChunkBytes], so a lane of a mid-size message still pipelines its stores
// and its copy-out, and a large one pays one barrier and fence per 256 KiB.
FERRY_HOST_DEVICE constexpr std::uint64_t p2pChunkBytes(std::uint64_t partBytes) {
  const std::uint64_t quarter = ((partBytes + 3) / 4 + 15) / 16 * 16;  // (rounded up: at most four chunks)
  return quarter < kP2PMinChunkBytes ? kP2PMinChunkBytes : quarter > kP2PChunkBytes ? kP2PChunkBytes : quarter;
}

struct P2PContext {
  int rank = 0;
  std::uint64_t* sent = nullptr;       // [peer][lane] chunks this rank has sent to peer (own)
  std::uint64_t* received = nullptr;   // [peer][lane] chunks this rank has taken from peer (own)
  std::uint64_t* arrived = nullptr;    // [sender][lane] written by sender
  std::uint64_t* acked = nullptr;      // [receiver][lane] written by receiver
  std::uint64_t* sizes = nullptr;      // [sender][lane][slot] written by sender: its message's bytes
  std::uint64_t* peerArrived[kMaxRanks] = {};
  std::uint64_t* peerAcked[kMaxRanks] = {};
  std::uint64_t* peerSizes[kMaxRanks] = {};
  int nranks = 1;                      // senders of the inbox
  char* inbox = nullptr;               // [sender][lane][slot] chunks, then the packet slots
  char* peerInbox[kMaxRanks] = {};
  std::uint64_t timeoutNs = 0;
  const std::uint32_t* abortFlag = nullptr;  // the Comm's (CallState::aborted)
  // FERRY_PHASE_STAMPS: the ring block 0 records each kernel in (kernels/phase_stamps.hpp), and
  // the kernels run so far (own memory, block 0's); null: no stamps.
  PhaseRecord* stamps = nullptr;
  std::uint64_t* kernelsRun = nullptr;
};

// One send, recv or copy to self of a group, as the kernel sees it.
struct P2PMessage {
  char* buffer = nullptr;        // send: read; recv and copy: written
  const char* source = nullptr;  // copy: read
  std::uint64_t bytes = 0;
};

enum class P2PKind : int { Recv, Send, Copy };

// The sends (or recvs) of a group with one peer, or its copies to self, in issue order: messages
// [firstMessage, firstMessage + messages) of the batch, on blocks [firstBlock, firstBlock + blocks).
struct P2PStream {
  int peer = 0;
  P2PKind kind = P2PKind::Recv;
  int firstMessage = 0, messages = 0;
  int firstBlock = 0, blocks = 0;
};

struct P2PBatch {
  P2PMessage message[kP2PMaxOps];
  P2PStream stream[kP2PMaxStreams];
  int messages = 0;
  int streams = 0;
  int blocks = 0;
};

// Byte offset of (sender, lane, slot) in an inbox.
FERRY_HOST_DEVICE constexpr std::uint64_t p2pSlotOffset(int sender, int lane, std::uint64_t slot) {
  return ((static_cast<std::uint64_t>(sender) * kP2PLanes + lane) * kP2PSlots + slot) * kP2PChunkBytes;
}
// Byte offset of the packet slot (sender, lane, slot) in an inbox of `senders` senders: after
// every raw slot.
FERRY_HOST_DEVICE constexpr std::uint64_t p2pPacketSlotOffset(int senders, int sender, int lane,
                                                              std::uint64_t slot) {
  return p2pSlotOffset(senders, 0, 0) +
         ((static_cast<std::uint64_t>(sender) * kP2PPacketLanes + lane) * kP2PPacketSlots + slot) *
             kP2PPacketSlotBytes;
}

// What a collective needs to run on the send/recv kernel (p2p_collectives.hpp): the Comm's inboxes,
// and the blocks a group may have (planP2PGroup's residentBlocks and maxBlocks).
struct P2PLauncher {
  const P2PContext* context = nullptr;
  int residentBlocks = 0;
  int maxBlocks = 0;  // CommOptions::maxBlocks (0: none)
  bool early = false;  // launch with programmatic dependent launch (CollectiveContext::earlyLaunch)
};

class P2PResources {
 public:
  // Collective over comm's ranks. @pre worldSize <= kMaxRanks, a current CUDA device.
  // abortFlag: the Comm's abort word (CallState::aborted), which the kernel's waits watch.
  P2PResources(Communicator& comm, const std::uint32_t* abortFlag);
  const P2PContext& context() const { return context_; }
  // FERRY_PHASE_STAMPS: the kernels record their phases in `ring` (device memory, kPhaseRecords).
  void setStamps(PhaseRecord* ring) { context_.stamps = ring; }

 private:
  std::unique_ptr<PeerMemory> memory_;
  P2PContext context_;
};

// Queues one kernel running every stream of the batch on `stream`; early: with programmatic
// dependent launch, as launchCollective does (its blocks take their SMs while the kernel before it
// still runs), where no message exceeds kP2PEarlyBytes. On 2 H100 (2026-11-28) that took 0.3-0.4 us
// off send/recv from 1 KiB to 1 MiB (3.46-4.01 us up to 64 KiB); on 2 H200 the same day, early
// launches made all-to-all 4-6% slower from 64 MiB (1559 us at 1 GiB, 1477 without) and send/recv
// 1% at 1 GiB, in two rounds each: a large call gains nothing from its launch.
void launchP2P(const P2PBatch& batch, const P2PContext& context, cudaStream_t stream, bool early);
// Loads the send/recv kernel into the current context (launch.hpp, preloadKernel).
void preloadP2P();
// Blocks of the send/recv kernel that fit on the current GPU at once.
int p2pResidentBlocks();

}  // namespace ferry
