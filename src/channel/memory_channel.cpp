#include "ferry/memory_channel.hpp"

#include "ferry/errors.hpp"

namespace ferry {

MemoryChannel::MemoryChannel(std::shared_ptr<MemoryDevice2DeviceSemaphore> semaphore, RegisteredMemory dst,
                             void* src, void* packets)
    : semaphore_(std::move(semaphore)), dst_(std::move(dst)), src_(src), packets_(packets) {
  if (!semaphore_) throw Error(ErrorCode::InvalidUsage, "MemoryChannel: the semaphore is null");
  const auto& conn = semaphore_->connection();
  std::string who =
      "MemoryChannel rank " + std::to_string(conn->rank()) + " -> rank " + std::to_string(conn->remoteRank());
  if (!dst_.valid() || dst_.isLocal() || dst_.rank() != conn->remoteRank())
    throw Error(ErrorCode::InvalidUsage, who + ": dst must be memory that rank " +
                                             std::to_string(conn->remoteRank()) +
                                             " registered and sent to this rank");
  if (dst_.data() == nullptr)
    throw Error(ErrorCode::InvalidUsage,
                who +
                    ": the peer's memory is not mapped in this process (is the peer on "
                    "another host, or is it memory that cannot be shared?)");
  if (src_ == nullptr) throw Error(ErrorCode::InvalidUsage, who + ": src is null");
}

MemoryChannelDeviceHandle MemoryChannel::deviceHandle() const {
  MemoryChannelDeviceHandle h;
  h.semaphore = semaphore_->deviceHandle();
  h.dst = dst_.data();
  h.src = src_;
  h.packets = packets_;
  return h;
}

}  // namespace ferry
