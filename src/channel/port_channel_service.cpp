#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
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
  RegisteredMemory dst;  // invalid for a channel whose puts name memories
  RegisteredMemory src;
};

std::string channelName(const Connection& conn) {
  return "PortChannel rank " + std::to_string(conn.rank()) + " -> rank " + std::to_string(conn.remoteRank());
}
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
  // Memories puts may name: memories[id - 1]; an invalid entry is free (its id is in freeIds). The
  // proxy looks them up under the lock, which addMemory and removeMemory take too.
  std::mutex memoriesMutex;
  std::vector<RegisteredMemory> memories;
  std::vector<MemoryId> freeIds;
  // The first half of a put naming memories, until its second half (the next slot) comes.
  ProxyTrigger firstHalf{};
  bool haveFirstHalf = false;
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

  ChannelEntry& channel(std::uint32_t id) {
    if (id >= count.load(std::memory_order_acquire))
      throw Error(ErrorCode::InvalidUsage, "PortChannel request for channel " + std::to_string(id) +
                                               ", which this service does not have (a stale or corrupt handle?)");
    return channels[id];
  }

  // @pre memoriesMutex held.
  const RegisteredMemory& memory(MemoryId id, const Connection& conn, const char* role) {
    if (id == 0 || id > memories.size() || !memories[id - 1].valid())
      throw Error(ErrorCode::InvalidUsage, channelName(conn) + ": a put names " + role + " memory " +
                                               std::to_string(id) +
                                               ", which the service does not have (removed, or never added)");
    return memories[id - 1];
  }

  // A put naming its memories (PortPutRequest), then its signal and flush.
  void handleNamed(const PortPutRequest& r) {
    ChannelEntry& c = channel(r.channel);
    const auto& conn = c.semaphore->connection();
    {
      std::lock_guard lock(memoriesMutex);
      const RegisteredMemory& dst = memory(r.dst, *conn, "as destination");
      if (r.src == kLocalPointer) {
        conn->write(dst, r.dstOffset, reinterpret_cast<const void*>(r.srcOffset), r.bytes);
      } else {
        const RegisteredMemory& src = memory(r.src, *conn, "as source");
        if (dst.rank() != conn->rank()) {
          conn->write(dst, r.dstOffset, src, r.srcOffset, r.bytes);
        } else {  // a copy within this rank: its source as an address, checked against its registration
          if (r.srcOffset > src.size() || r.bytes > src.size() - r.srcOffset)
            throw Error(ErrorCode::InvalidUsage, channelName(*conn) + ": a local copy reads past its source's " +
                                                     std::to_string(src.size()) + "-byte registration");
          conn->write(dst, r.dstOffset, static_cast<const char*>(src.data()) + r.srcOffset, r.bytes);
        }
      }
    }
    finish(c, r.channel, r.kinds);
  }

  ProxyHandlerResult handle(ProxyTrigger trigger) {
    if (haveFirstHalf) {
      haveFirstHalf = false;
      handleNamed(PortPutRequest::decode(firstHalf, trigger));
      return ProxyHandlerResult::Continue;
    }
    if (PortPutRequest::isFirstHalf(trigger)) {
      firstHalf = trigger;  // its second half is in the next slot (Fifo::pushPair)
      haveFirstHalf = true;
      return ProxyHandlerResult::Continue;
    }
    const PortRequest r = PortRequest::decode(trigger);
    ChannelEntry& c = channel(r.channel);
    const auto& conn = c.semaphore->connection();
    if (r.kinds & PortRequest::Put) {
      if (!c.dst.valid())
        throw Error(ErrorCode::InvalidUsage, channelName(*conn) +
                                                 ": a put without memories on a channel that has no buffers of "
                                                 "its own (name the memories: put(dst, dstOffset, src, ...))");
      conn->write(c.dst, r.dstOffset, c.src, r.srcOffset, r.bytes);
    }
    finish(c, r.channel, r.kinds);
    return ProxyHandlerResult::Continue;
  }

  // A request's signal and flush, after its put.
  void finish(ChannelEntry& c, std::uint32_t id, std::uint32_t kinds) {
    const auto& conn = c.semaphore->connection();
    if (kinds & PortRequest::Signal) c.semaphore->signal();
    if (kinds & PortRequest::Flush) {
      const std::uint64_t slot = proxy->fifo().tail();  // the slot being handled
      const std::uint64_t ticket = conn->beginFlush();
      if (conn->flushComplete(ticket))
        publishFlushed(id, slot);
      else
        flushing.push_back({id, slot, ticket});
    }
  }
};

PortChannelService::PortChannelService(int fifoSize) : PortChannelService(fifoSize, std::chrono::microseconds(0)) {}

PortChannelService::PortChannelService(int fifoSize, std::chrono::microseconds idleSleep)
    : PortChannelService(fifoSize, idleSleep, {}, {}) {}

PortChannelService::PortChannelService(int fifoSize, std::chrono::microseconds idleSleep, std::function<void()> onPoll,
                                       std::function<void()> onFailure)
    : impl_(std::make_unique<Impl>()) {
  ProxyOptions options;
  options.onFailure = std::move(onFailure);
  options.idleSleep = idleSleep;
  options.fifo.size = fifoSize;
  options.fifo.memory = FifoMemory::Gpu;
  void* flushed = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&flushed, sizeof(std::uint64_t) * PortRequest::kMaxChannels,
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  impl_->flushed = static_cast<std::uint64_t*>(flushed);
  std::fill_n(impl_->flushed, PortRequest::kMaxChannels, std::uint64_t{0});
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->flushedDevice), flushed, 0));
  options.onPoll = [impl = impl_.get(), onPoll = std::move(onPoll)] {
    if (!impl->flushing.empty()) impl->progressFlushes();
    if (onPoll) onPoll();
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
  const std::string who = channelName(*conn);
  if (!dst.valid() || dst.isLocal() || dst.rank() != conn->remoteRank())
    throw Error(ErrorCode::InvalidUsage, who + ": dst must be memory that rank " +
                                             std::to_string(conn->remoteRank()) +
                                             " registered and sent to this rank");
  if (!src.valid() || !src.isLocal())
    throw Error(ErrorCode::InvalidUsage, who + ": src must be memory this rank registered");
  if (dst.size() - 1 > PortRequest::kMaxOffset || src.size() - 1 > PortRequest::kMaxOffset)
    throw Error(ErrorCode::InvalidUsage,
                who + ": buffers larger than 1 TiB cannot be addressed by a PortChannel");
  return add(std::move(semaphore), std::move(dst), std::move(src));
}

PortChannel PortChannelService::addChannel(std::shared_ptr<Host2DeviceSemaphore> semaphore) {
  if (!semaphore)
    throw Error(ErrorCode::InvalidUsage, "PortChannelService::addChannel: the semaphore is null");
  return add(std::move(semaphore), {}, {});
}

PortChannel PortChannelService::add(std::shared_ptr<Host2DeviceSemaphore> semaphore, RegisteredMemory dst,
                                    RegisteredMemory src) {
  const auto& conn = semaphore->connection();
  std::uint32_t id = impl_->count.load(std::memory_order_relaxed);
  if (id >= PortRequest::kMaxChannels)
    throw Error(ErrorCode::InvalidUsage, channelName(*conn) + ": this service already has " +
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

MemoryId PortChannelService::addMemory(RegisteredMemory memory) {
  if (!memory.valid()) throw Error(ErrorCode::InvalidUsage, "PortChannelService::addMemory: an empty RegisteredMemory");
  std::lock_guard lock(impl_->memoriesMutex);
  if (!impl_->freeIds.empty()) {
    const MemoryId id = impl_->freeIds.back();
    impl_->freeIds.pop_back();
    impl_->memories[id - 1] = std::move(memory);
    return id;
  }
  if (impl_->memories.size() >= PortPutRequest::kMaxMemory - 1)
    throw Error(ErrorCode::InvalidUsage, "PortChannelService::addMemory: the service already has " +
                                             std::to_string(impl_->memories.size()) +
                                             " memories; remove some (removeMemory) first");
  impl_->memories.push_back(std::move(memory));
  return static_cast<MemoryId>(impl_->memories.size());
}

void PortChannelService::removeMemory(MemoryId id) {
  std::lock_guard lock(impl_->memoriesMutex);
  if (id == 0 || id > impl_->memories.size() || !impl_->memories[id - 1].valid())
    throw Error(ErrorCode::InvalidUsage,
                "PortChannelService::removeMemory: the service has no memory " + std::to_string(id));
  impl_->memories[id - 1] = RegisteredMemory();
  impl_->freeIds.push_back(id);
}

void PortChannelService::start() {
  impl_->haveFirstHalf = false;  // a pair cut by an earlier stop
  impl_->proxy->start();
}
void PortChannelService::stop() { impl_->proxy->stop(); }
bool PortChannelService::running() const { return impl_->proxy->running(); }
std::exception_ptr PortChannelService::error() const { return impl_->proxy->error(); }

}  // namespace ferry
