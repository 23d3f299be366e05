#pragma once
// The Comm's channels to its peers through the proxy (kernels/port_peers.hpp): one connection, one
// Host2DeviceSemaphore and one PortChannel per peer, all served by one PortChannelService, and every
// rank's shared allocation added to it as a memory. Made with the Comm (collective); the proxy
// thread starts on the first call that uses it and dozes when idle.
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/comm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/port_channel.hpp"
#include "kernels/port_peers.hpp"
#include "transport/peer_memory.hpp"

namespace ferry {

class CommPorts final : public PortPeersSource {
 public:
  // @pre the Comm's device is current; `regions`: the Comm's shared allocation (CommResources).
  // abortFlag: this rank's CallState::aborted (device memory), which ends every wait of the channels.
  CommPorts(Communicator& comm, const CommOptions::ConnectFn& connect, const PeerMemory& regions,
            const std::uint32_t* abortFlag);
  ~CommPorts() override;
  CommPorts(const CommPorts&) = delete;
  CommPorts& operator=(const CommPorts&) = delete;

  const PortPeers* start() override;
  // Where registrations are added, so that kernels can name them (BufferRegistry).
  PortChannelService& service() { return service_; }

 private:
  int rank_;
  PortChannelService service_;
  std::vector<std::shared_ptr<Host2DeviceSemaphore>> semaphores_;
  PortPeers* device_ = nullptr;  // device memory
  std::mutex startMutex_;
};

}  // namespace ferry
