#pragma once
// Buffers registered with Comm::registerBuffer, as kernels see them. Registration is collective,
// so the n-th registration has the same id on every rank; each rank keeps a table, indexed by
// (id % kRegSlots, rank), of where every rank's buffer of that id is mapped in this process.
// A zero-copy ("direct") call tells its peers which registration (id and offset) holds its send and
// recv buffers for this call (CallBuffers, written into the peer's memory before the call's
// start flag), and each rank looks the peer's buffers up in its own table.
#include <cstdint>

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
  std::uint64_t epoch = 0;  // the call these are for
  std::uint64_t sendId = 0, sendOffset = 0;
  std::uint64_t recvId = 0, recvOffset = 0;
};

}  // namespace ferry
