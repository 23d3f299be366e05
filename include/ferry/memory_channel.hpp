#pragma once
// MemoryChannel, host side: pairs a MemoryDevice2DeviceSemaphore with the buffers its device
// handle works on (device/memory_channel.hpp says what each is for).
//
//   auto sem = std::make_shared<ferry::MemoryDevice2DeviceSemaphore>(comm, conn);
//   ferry::RegisteredMemory theirs = comm.recvMemory(peer).get();   // peer sent its buffer
//   ferry::MemoryChannel chan(sem, theirs, myBuffer);
//   kernel<<<...>>>(chan.deviceHandle());
// For LL packets the peer's channel writes into our packet buffer: each side registers its packet
// buffer, sends it, and builds the channel with dst = the peer's packet buffer and packets = its own.
#include <memory>

#include "ferry/api.hpp"
#include "ferry/device/memory_channel.hpp"
#include "ferry/registered_memory.hpp"
#include "ferry/semaphore.hpp"

namespace ferry {

class FERRY_API MemoryChannel {
 public:
  // @pre dst is the peer's memory, mapped in this process (same host); src and packets are this
  //      rank's device memory (packets may be null when the channel carries no packets).
  MemoryChannel(std::shared_ptr<MemoryDevice2DeviceSemaphore> semaphore, RegisteredMemory dst, void* src,
                void* packets = nullptr);
  MemoryChannelDeviceHandle deviceHandle() const;
  const RegisteredMemory& dst() const { return dst_; }

 private:
  std::shared_ptr<MemoryDevice2DeviceSemaphore> semaphore_;
  RegisteredMemory dst_;
  void* src_;
  void* packets_;
};

}  // namespace ferry
