#pragma once
// Semaphores between this rank and one peer (see device/semaphore.hpp for the counters). Both
// ranks construct the matching kind for the same connection, in the same order: each side
// allocates its inbound counter, registers it and sends it to the peer with
// Communicator::sendMemory(tag). Construction only sends; the peer's counter is received the first
// time it is needed (deviceHandle(), signal()), so building every semaphore first and using them
// afterwards costs one round of bootstrap traffic, not one per semaphore.
//
//   MemoryDevice2DeviceSemaphore  a GPU signals the peer's GPU by storing to its counter over
//                                 NVLink (CudaIpc connection); MemoryChannel uses it.
//   Host2DeviceSemaphore          a host thread (the proxy) signals through the Connection, after
//                                 the data it wrote there; the peer's GPU waits. PortChannel uses it
//                                 (CudaIpc, HostMemory or Ethernet connection).
//   Host2HostSemaphore            host threads on both sides (HostMemory or Ethernet connection).
//
//   auto sem = std::make_shared<ferry::MemoryDevice2DeviceSemaphore>(comm, conn);  // both ranks
//   myKernel<<<...>>>(sem->deviceHandle());
#include <chrono>
#include <memory>

#include "ferry/api.hpp"
#include "ferry/communicator.hpp"
#include "ferry/connection.hpp"
#include "ferry/device/semaphore.hpp"

namespace ferry {

struct SemaphoreCore;

class FERRY_API MemoryDevice2DeviceSemaphore {
 public:
  // Counters live on the current CUDA device. @pre connection is CudaIpc.
  MemoryDevice2DeviceSemaphore(Communicator& comm, std::shared_ptr<Connection> connection, int tag = 0);
  ~MemoryDevice2DeviceSemaphore();
  SemaphoreDeviceHandle deviceHandle() const;
  const std::shared_ptr<Connection>& connection() const;

 private:
  std::shared_ptr<SemaphoreCore> core_;
};

class FERRY_API Host2DeviceSemaphore {
 public:
  // The inbound counter lives in shared host memory, where the peer's proxy stores to it directly
  // once the data before it has landed (a store costs far less than issuing an 8-byte copy), and
  // this rank's GPU polls it; the expected count lives on the current CUDA device, the outbound
  // count on the host. @pre connection is CudaIpc, or HostMemory (the proxy then copies between
  // host buffers with memcpy: a PortChannel into a peer's hostAlloc memory), or Ethernet (the
  // bytes and the counter's new value travel over TCP; the peer's receiver stores the counter).
  Host2DeviceSemaphore(Communicator& comm, std::shared_ptr<Connection> connection, int tag = 0);
  ~Host2DeviceSemaphore();
  // Host side (the proxy): increments the peer's counter, ordered after every earlier write on the
  // connection. Not thread-safe: one thread signals a given semaphore.
  void signal();
  // Receives the peer's counter now rather than in the first signal(): for a proxy thread that
  // signals while other threads use the bootstrap. Collective with the peer's construction.
  void awaitPeer();
  // The wait side, for this rank's GPU (remoteInbound is null: the GPU does not signal).
  SemaphoreDeviceHandle deviceHandle() const;
  const std::shared_ptr<Connection>& connection() const;

 private:
  std::shared_ptr<SemaphoreCore> core_;
};

class FERRY_API Host2HostSemaphore {
 public:
  // Counters in host memory (shared with the peer over HostMemory, written by the peer's receiver
  // over Ethernet). @pre connection is HostMemory or Ethernet.
  Host2HostSemaphore(Communicator& comm, std::shared_ptr<Connection> connection, int tag = 0);
  ~Host2HostSemaphore();
  void signal();
  // Waits for the next signal; TimeoutError naming both ranks after `timeout`.
  void wait(std::chrono::duration<double> timeout);
  void wait();  // bounded by FERRY_DEVICE_TIMEOUT
  bool poll();
  const std::shared_ptr<Connection>& connection() const;

 private:
  std::shared_ptr<SemaphoreCore> core_;
};

}  // namespace ferry
