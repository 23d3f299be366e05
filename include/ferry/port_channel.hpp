#pragma once
// PortChannel, host side. A PortChannelService owns one proxy thread (and its FIFO) for the current
// CUDA device and serves every PortChannel made from it: it decodes each request a GPU pushes
// (device/port_channel.hpp) and performs it through the channel's Connection:
//   put    -> Connection::write(dst, dstOffset, src, srcOffset, bytes)   (copy engine for CudaIpc)
//   signal -> Host2DeviceSemaphore::signal(): the peer's counter moves after the data has landed
//   flush  -> Connection::beginFlush(); the proxy goes on with other requests, and once the flush is
//             complete it writes the channel's word in the service's flushed array, which the
//             GPU's flush() waits for: every earlier put and signal of the channel is complete
//
//   ferry::PortChannelService service;                       // cudaSetDevice(...) first
//   auto sem = std::make_shared<ferry::Host2DeviceSemaphore>(comm, conn);
//   ferry::PortChannel chan = service.addChannel(sem, theirMemory, myMemory);
//   service.start();
//   kernel<<<...>>>(chan.deviceHandle());
//
// Memories: addMemory(m) makes a registered buffer (a peer's, received with recvMemory, or this
// rank's) nameable by the puts of every channel of the service (device/port_channel.hpp), so one
// channel per peer reaches all of a peer's buffers: what a communicator's collectives do.
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

#include "ferry/api.hpp"
#include "ferry/device/port_channel.hpp"
#include "ferry/registered_memory.hpp"
#include "ferry/semaphore.hpp"

namespace ferry {

class FERRY_API PortChannel {
 public:
  PortChannelDeviceHandle deviceHandle() const { return handle_; }

 private:
  friend class PortChannelService;
  explicit PortChannel(const PortChannelDeviceHandle& handle) : handle_(handle) {}
  PortChannelDeviceHandle handle_;
};

class FERRY_API PortChannelService {
 public:
  // FIFO of fifoSize triggers in GPU-reachable memory of the current CUDA device.
  explicit PortChannelService(int fifoSize = 512);
  // With the proxy dozing when idle (ProxyOptions::idleSleep): for a service that may stay unused
  // for long, at the price of up to idleSleep more on the first request after a pause.
  PortChannelService(int fifoSize, std::chrono::microseconds idleSleep);
  // With ProxyOptions' onPoll (beside the service's own work on each poll) and onFailure too.
  PortChannelService(int fifoSize, std::chrono::microseconds idleSleep, std::function<void()> onPoll,
                     std::function<void()> onFailure);
  ~PortChannelService();  // stops the proxy
  PortChannelService(const PortChannelService&) = delete;
  PortChannelService& operator=(const PortChannelService&) = delete;

  // Adds a channel (at most PortRequest::kMaxChannels). May be called while the proxy runs.
  // @pre dst is memory the semaphore's peer registered and sent here; src is this rank's.
  PortChannel addChannel(std::shared_ptr<Host2DeviceSemaphore> semaphore, RegisteredMemory dst,
                         RegisteredMemory src);
  // A channel without buffers of its own: its puts name memories (addMemory).
  PortChannel addChannel(std::shared_ptr<Host2DeviceSemaphore> semaphore);

  // Makes `memory` nameable by puts: a buffer some peer registered and sent here (a destination),
  // or one this rank registered (a source, or the destination of a copy within this rank). Thread
  // safe, also while the proxy runs. Ids of removed memories are given out again.
  MemoryId addMemory(RegisteredMemory memory);
  // Forgets a memory. @pre no request naming it is still queued or in progress (the kernels that
  // used it have finished); Error(InvalidUsage) for an id the service does not have.
  void removeMemory(MemoryId id);

  void start();
  // Stops the proxy thread; rethrows what a request failed with (e.g. a Connection error).
  void stop();
  bool running() const;
  // What stopped the proxy (a request that failed), or null.
  std::exception_ptr error() const;

 private:
  PortChannel add(std::shared_ptr<Host2DeviceSemaphore> semaphore, RegisteredMemory dst, RegisteredMemory src);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
