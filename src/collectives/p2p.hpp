#pragma once
// Point-to-point: send and recv between two ranks of a Comm, through an inbox each rank keeps for
// every peer (one allocation per rank, mapped by every peer, made with the Comm).
//
// A message is cut into lanes (one thread block each, the same number on both sides, decided by
// its size alone) and each lane into chunks of kP2PChunkBytes. Lane l from rank s to rank r is a
// ring of kP2PSlots chunk slots in r's inbox with two counters that only grow: `arrived` (in r's
// memory, written by s: chunks written so far) and `acked` (in s's memory, written by r: chunks
// copied out so far). The sender writes chunk g into slot g % kP2PSlots once acked >= g + 1 -
// kP2PSlots; the receiver copies it out once arrived >= g + 1. Each side also keeps its own
// running total per (peer, lane), so consecutive messages continue where the last left off, also
// across CUDA graph replays.
//
// A group's sends (or recvs) with one peer form one stream of messages, taken in issue order by
// the same blocks, lane l by block l: the running totals per (peer, lane) then advance in the same
// order on both sides, however many messages a group holds per peer. Every block of a group is
// one block of one kernel, and a send waiting for its receiver must never keep a recv of the same
// group from running, so they must all be resident at once: the Comm refuses a group that needs
// more blocks than fit on its GPU (p2pResidentBlocks).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/device_context.hpp"
#include "collectives/peer_memory.hpp"

namespace ferry {

inline constexpr int kP2PLanes = 16;
inline constexpr int kP2PSlots = 4;
inline constexpr std::uint64_t kP2PChunkBytes = 32 << 10;
inline constexpr int kP2PThreads = 256;
inline constexpr int kP2PMaxOps = 64;       // messages per group
inline constexpr int kP2PMaxStreams = 2 * kMaxRanks;

// Lanes of a message: one per chunk, at most kP2PLanes. Both sides compute it from the size.
FERRY_HOST_DEVICE constexpr int p2pLanes(std::uint64_t bytes) {
  const std::uint64_t chunks = (bytes + kP2PChunkBytes - 1) / kP2PChunkBytes;
  return chunks < 1 ? 1 : chunks > kP2PLanes ? kP2PLanes : static_cast<int>(chunks);
}

struct P2PContext {
  int rank = 0;
  std::uint64_t* sent = nullptr;       // [peer][lane] chunks this rank has sent to peer (own)
  std::uint64_t* received = nullptr;   // [peer][lane] chunks this rank has taken from peer (own)
  std::uint64_t* arrived = nullptr;    // [sender][lane] written by sender
  std::uint64_t* acked = nullptr;      // [receiver][lane] written by receiver
  std::uint64_t* peerArrived[kMaxRanks] = {};
  std::uint64_t* peerAcked[kMaxRanks] = {};
  char* inbox = nullptr;               // [sender][lane][slot] chunks
  char* peerInbox[kMaxRanks] = {};
  std::uint64_t timeoutNs = 0;
  const std::uint32_t* abortFlag = nullptr;  // the Comm's (CallState::aborted)
};

// One send or recv of a group, as the kernel sees it.
struct P2PMessage {
  char* buffer = nullptr;  // send: read; recv: written
  std::uint64_t bytes = 0;
};

// The sends (or recvs) of a group with one peer, in issue order: messages
// [firstMessage, firstMessage + messages) of the batch, on blocks [firstBlock, firstBlock + blocks)
// (as many as the message with the most lanes needs).
struct P2PStream {
  int peer = 0;
  int isSend = 0;
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

class P2PResources {
 public:
  // Collective over comm's ranks. @pre worldSize <= kMaxRanks, a current CUDA device.
  // abortFlag: the Comm's abort word (CallState::aborted), which the kernel's waits watch.
  P2PResources(Communicator& comm, const std::uint32_t* abortFlag);
  const P2PContext& context() const { return context_; }

 private:
  std::unique_ptr<PeerMemory> memory_;
  P2PContext context_;
};

// Queues one kernel running every send and recv of the batch on `stream`. Sends to and receives
// from this rank itself are not in the batch (the caller copies those).
void launchP2P(const P2PBatch& batch, const P2PContext& context, cudaStream_t stream);
// Loads the send/recv kernel into the current context (launch.hpp, preloadKernel).
void preloadP2P();
// Blocks of the send/recv kernel that fit on the current GPU at once.
int p2pResidentBlocks();

}  // namespace ferry
