#include "collectives/p2p.hpp"

#include "ferry/env.hpp"
#include "core/deadline.hpp"

namespace ferry {

P2PResources::P2PResources(Communicator& comm, const std::uint32_t* abortFlag) {
  const int size = comm.bootstrap()->size();
  constexpr std::uint64_t kCounters = sizeof(std::uint64_t) * kMaxRanks * kP2PLanes;  // one array
  constexpr std::uint64_t kSizes = sizeof(std::uint64_t) * kMaxRanks * kP2PLanes * kP2PSlots;
  constexpr std::uint64_t kInboxOffset = 64 << 10;
  static_assert(4 * kCounters + kSizes + sizeof(std::uint64_t) <= kInboxOffset);
  const std::uint64_t total = kInboxOffset + p2pPacketSlotOffset(size, size, 0, 0);
  constexpr int kTag = 0x7032;  // the Comm's own tag for this exchange
  memory_ = std::make_unique<PeerMemory>(comm, total, kTag, "the send/recv inboxes");

  auto counters = [](char* base, int which) { return reinterpret_cast<std::uint64_t*>(base + which * kCounters); };
  char* base = memory_->local();
  context_.rank = comm.bootstrap()->rank();
  context_.nranks = size;
  context_.sent = counters(base, 0);
  context_.received = counters(base, 1);
  context_.arrived = counters(base, 2);
  context_.acked = counters(base, 3);
  context_.sizes = counters(base, 4);  // kSizes long
  context_.kernelsRun = reinterpret_cast<std::uint64_t*>(base + 4 * kCounters + kSizes);
  context_.inbox = base + kInboxOffset;
  for (int p = 0; p < size; ++p) {
    context_.peerArrived[p] = counters(memory_->peer(p), 2);
    context_.peerAcked[p] = counters(memory_->peer(p), 3);
    context_.peerSizes[p] = counters(memory_->peer(p), 4);
    context_.peerInbox[p] = memory_->peer(p) + kInboxOffset;
  }
  context_.timeoutNs = timeoutNanoseconds(env().deviceTimeout);
  context_.abortFlag = abortFlag;
}

}  // namespace ferry
