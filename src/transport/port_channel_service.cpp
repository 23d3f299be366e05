#include <array>
#include <atomic>

#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/proxy.hpp"

namespace ferry {

namespace {
struct ChannelEntry {
  std::shared_ptr<Host2DeviceSemaphore> semaphore;
  RegisteredMemory dst;
  RegisteredMemory src;
};
}  // namespace

struct PortChannelService::Impl {
  // Entries are written once, before `count` publishes them (release), and read by the proxy after
  // it loads `count` (acquire): adding channels while the proxy runs needs no lock.
  std::array<ChannelEntry, PortRequest::kMaxChannels> channels;
  std::atomic<std::uint32_t> count{0};
  std::unique_ptr<Proxy> proxy;

  ProxyHandlerResult handle(ProxyTrigger trigger) {
    const PortRequest r = PortRequest::decode(trigger);
    if (r.channel >= count.load(std::memory_order_acquire))
      throw Error(ErrorCode::InvalidUsage,
                  "PortChannel request for channel " + std::to_string(r.channel) +
                      ", which this service does not have (a stale or corrupt handle?)");
    ChannelEntry& c = channels[r.channel];
    const auto& conn = c.semaphore->connection();
    if (r.kinds & PortRequest::Put) conn->write(c.dst, r.dstOffset, c.src, r.srcOffset, r.bytes);
    if (r.kinds & PortRequest::Signal) c.semaphore->signal();
    if (r.kinds & PortRequest::Flush) conn->flush();
    return ProxyHandlerResult::Continue;
  }
};

PortChannelService::PortChannelService(int fifoSize) : impl_(std::make_unique<Impl>()) {
  ProxyOptions options;
  options.fifo.size = fifoSize;
  options.fifo.memory = FifoMemory::Gpu;
  impl_->proxy =
      std::make_unique<Proxy>([impl = impl_.get()](ProxyTrigger t) { return impl->handle(t); }, options);
}

PortChannelService::~PortChannelService() = default;

PortChannel PortChannelService::addChannel(std::shared_ptr<Host2DeviceSemaphore> semaphore,
                                           RegisteredMemory dst, RegisteredMemory src) {
  if (!semaphore)
    throw Error(ErrorCode::InvalidUsage, "PortChannelService::addChannel: the semaphore is null");
  const auto& conn = semaphore->connection();
  const std::string who =
      "PortChannel rank " + std::to_string(conn->rank()) + " -> rank " + std::to_string(conn->remoteRank());
  if (!dst.valid() || dst.isLocal() || dst.rank() != conn->remoteRank())
    throw Error(ErrorCode::InvalidUsage, who + ": dst must be memory that rank " +
                                             std::to_string(conn->remoteRank()) +
                                             " registered and sent to this rank");
  if (!src.valid() || !src.isLocal())
    throw Error(ErrorCode::InvalidUsage, who + ": src must be memory this rank registered");
  if (dst.size() - 1 > PortRequest::kMaxOffset || src.size() - 1 > PortRequest::kMaxOffset)
    throw Error(ErrorCode::InvalidUsage,
                who + ": buffers larger than 1 TiB cannot be addressed by a PortChannel");
  std::uint32_t id = impl_->count.load(std::memory_order_relaxed);
  if (id >= PortRequest::kMaxChannels)
    throw Error(ErrorCode::InvalidUsage, who + ": this service already has " +
                                             std::to_string(PortRequest::kMaxChannels) +
                                             " channels; make another PortChannelService");
  impl_->channels[id] = {semaphore, std::move(dst), std::move(src)};
  impl_->count.store(id + 1, std::memory_order_release);
  PortChannelDeviceHandle h;
  h.fifo = impl_->proxy->fifo().deviceHandle();
  h.semaphore = semaphore->deviceHandle();
  h.channel = id;
  return PortChannel(h);
}

void PortChannelService::start() { impl_->proxy->start(); }
void PortChannelService::stop() { impl_->proxy->stop(); }

}  // namespace ferry
