#pragma once
// Buffers registered with Comm::registerBuffer, as kernels see them. Registration is collective,
// so the n-th registration has the same id on every rank; each rank keeps a table, indexed by
// (id % kRegSlots, rank), of where every rank's buffer of that id is mapped in this process.
// A zero-copy ("direct") call tells its peers which registration (id and offset) holds its send and
// recv buffers for this call (CallBuffers, written into the peer's memory as LL packets:
// DirectDescriptor), and each rank looks the peer's buffers up in its own table.
#include <cstdint>

#include "ferry/device/packet.hpp"
#include "kernels/device_context.hpp"

namespace ferry {

inline constexpr int kRegSlots = 256;  // live registrations per Comm

struct RegEntry {
  std::uint64_t base = 0;  // the buffer as mapped here
  std::uint64_t id = 0;    // 0: empty
  std::uint64_t bytes = 0;
  std::uint64_t memory = 0;  // the buffer as a memory of the Comm's PortChannelService (port_peers.hpp)
};

struct RegTable {
  RegEntry entry[kRegSlots][kMaxRanks];
};

// What a rank publishes to each peer at the start of a direct call: ids are 0 for a buffer the
// call does not use on that rank (a broadcast's send off the root).
struct CallBuffers {
  std::uint64_t sendId = 0, sendOffset = 0;
  std::uint64_t recvId = 0, recvOffset = 0;
};

// CallBuffers in the peer's memory: one LL16 packet a word, each carrying the call's number as its
// flag, so the peer that sees all four flags sees the words, and the writer needs no fence before
// its start word (docs/architecture.md, "Latency").
struct alignas(16) DirectDescriptor {
  static constexpr int kWords = 4;
  LL16Packet word[kWords];
};
static_assert(sizeof(CallBuffers) == DirectDescriptor::kWords * sizeof(std::uint64_t),
              "one packet for each word of CallBuffers");

}  // namespace ferry
