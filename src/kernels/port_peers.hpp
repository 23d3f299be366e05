#pragma once
// How kernels reach the peers through the Comm's proxy: one PortChannel per peer, all served by the
// Comm's one PortChannelService (channel/), over whatever Connection the Comm was given for that
// peer (CudaIpc unless CommOptions::connect says otherwise). The collectives never learn which
// transport it is: they name memories (device/port_channel.hpp) and the proxy asks the connection.
//
// The memories kernels name:
//   region[p]         rank p's shared allocation of the Comm (CommResources: flags, LL, scratch), at
//                     offsets from where it starts (CollectiveContext::peerState[p], state here)
//   RegEntry::memory  rank p's registered buffer of a registration (registration.hpp)
//   kLocalPointer     a source in this rank's memory, by address (the connection reads it)
// A copy within this rank (a destination of this rank's own) goes over any peer's channel.
#include "ferry/device/port_channel.hpp"
#include "kernels/device_context.hpp"

namespace ferry {

struct PortPeers {
  PortChannelDeviceHandle channel[kMaxRanks];  // to each peer; this rank's entry is unused
  MemoryId region[kMaxRanks];
};

// Host side, implemented by the Comm (comm/comm_ports.hpp).
class PortPeersSource {
 public:
  virtual ~PortPeersSource() = default;
  // Starts the proxy if it is not running (it starts on the first call that needs it, so that a Comm
  // which never uses it costs no core) and returns the device copy of the Comm's PortPeers. An
  // Error naming the failed request when an earlier one stopped the proxy.
  virtual const PortPeers* start() = 0;
};

}  // namespace ferry
