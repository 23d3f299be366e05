#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <vector>

#include "platform/cuda_check.hpp"
#include "ferry/device/arch/atomics.hpp"

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
  // Per channel, in mapped pinned memory: s + 1 once the flush pushed at FIFO slot s is complete
  // (the GPU's flush() waits for it). Flushes in progress are kept in `flushing` (proxy thread only)
  // so that the proxy serves other channels meanwhile.
  std::uint64_t* flushed = nullptr;
  std::uint64_t* flushedDevice = nullptr;
  struct Flushing {
    std::uint32_t channel;
    std::uint64_t slot;
    std::uint64_t ticket;
  };
  std::vector<Flushing> flushing;
  std::unique_ptr<Proxy> proxy;  // last: stopped before the rest goes

  ~Impl() {
    proxy.reset();
    if (flushed != nullptr) (void)cudaFreeHost(flushed);
  }

  void publishFlushed(std::uint32_t channel, std::uint64_t slot) {
    if (atomicLoad(&flushed[channel], memory_order_relaxed) < slot + 1)
      atomicStore(&flushed[channel], slot + 1, memory_order_release);
  }

  // onPoll: publishes the flushes that completed, in the order they were asked for.
  void progressFlushes() {
    std::erase_if(flushing, [&](const Flushing& f) {
      if (!channels[f.channel].semaphore->connection()->flushComplete(f.ticket)) return false;
      publishFlushed(f.channel, f.slot);
      return true;
    });
  }

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
    if (r.kinds & PortRequest::Flush) {
      const std::uint64_t slot = proxy->fifo().tail();  // the slot being handled
      const std::uint64_t ticket = conn->beginFlush();
      if (conn->flushComplete(ticket))
        publishFlushed(r.channel, slot);
      else
        flushing.push_back({r.channel, slot, ticket});
    }
    return ProxyHandlerResult::Continue;
  }
};

PortChannelService::PortChannelService(int fifoSize) : impl_(std::make_unique<Impl>()) {
  ProxyOptions options;
  options.fifo.size = fifoSize;
  options.fifo.memory = FifoMemory::Gpu;
  void* flushed = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&flushed, sizeof(std::uint64_t) * PortRequest::kMaxChannels,
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  impl_->flushed = static_cast<std::uint64_t*>(flushed);
  std::fill_n(impl_->flushed, PortRequest::kMaxChannels, std::uint64_t{0});
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->flushedDevice), flushed, 0));
  options.onPoll = [impl = impl_.get()] {
    if (!impl->flushing.empty()) impl->progressFlushes();
  };
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
  // The FIFO is the service's, shared by its channels; a timeout in this channel's push or flush
  // should still name the two ranks the channel joins.
  h.fifo.wait.rank = conn->rank();
  h.fifo.wait.peer = conn->remoteRank();
  h.semaphore = semaphore->deviceHandle();
  h.channel = id;
  h.flushed = impl_->flushedDevice;
  return PortChannel(h);
}

void PortChannelService::start() { impl_->proxy->start(); }
void PortChannelService::stop() { impl_->proxy->stop(); }

}  // namespace ferry
