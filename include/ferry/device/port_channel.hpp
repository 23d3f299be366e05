#pragma once
// PortChannel device handle: the GPU does not move the data itself; one thread pushes a 16-byte
// request into the FIFO and the host proxy performs it through the Connection (copy engine for CUDA
// IPC, memcpy for host memory, RDMA or TCP later). The SMs stay free for compute.
//
// Semantics (what the proxy guarantees, src/channel/port_channel_service.cpp):
//   put                 copy src[srcOffset, +bytes) to the peer's dst[dstOffset, +bytes), asynchronously
//   signal              increment the peer's semaphore after every earlier put of this channel has
//                       landed; the peer's wait() then sees that data
//   flush               return once every earlier put and signal of this channel has completed at the
//                       destination (the GPU may reuse its source buffer); other channels' requests
//                       proceed meanwhile
//   wait / poll         consume a signal sent by the peer's channel
//
//   // rank 0, thread 0: send, tell, and make the source reusable
//   chan.putWithSignalAndFlush(0, 0, bytes);
//   // rank 1, thread 0
//   chan.wait();   // the bytes are in rank 1's buffer
#include <cstdint>
#include <type_traits>

#include "ferry/device/fifo.hpp"
#include "ferry/device/macros.hpp"
#include "ferry/device/semaphore.hpp"

namespace ferry {

// What one trigger asks of the proxy. Encoded in 127 bits (the FIFO owns the top bit of fst):
//   fst: bytes (32) | kinds (3) | channel (12) | srcOffset >> 32 (8) | dstOffset >> 32 (8)
//   snd: srcOffset low 32 | dstOffset low 32
// so offsets reach 1 TiB, a single trigger moves up to 4 GiB - 1 and a proxy serves 4096 channels.
struct PortRequest {
  enum Kind : std::uint32_t { Put = 1, Signal = 2, Flush = 4 };
  static constexpr std::uint64_t kMaxOffset = (std::uint64_t{1} << 40) - 1;
  static constexpr std::uint64_t kMaxBytes = 0xFFFFFFFFull;
  static constexpr std::uint32_t kMaxChannels = 1u << 12;

  std::uint32_t kinds = 0;  // a combination of Kind
  std::uint32_t channel = 0;
  std::uint64_t dstOffset = 0;
  std::uint64_t srcOffset = 0;
  std::uint64_t bytes = 0;

  // @pre channel < kMaxChannels, offsets <= kMaxOffset, bytes <= kMaxBytes (the handle splits
  // larger puts; the host checks channel ids and offsets when channels are made).
  FERRY_HOST_DEVICE FERRY_INLINE ProxyTrigger encode() const {
    ProxyTrigger t;
    t.fst = (bytes & 0xFFFFFFFFull) | static_cast<std::uint64_t>(kinds & 7) << 32 |
            static_cast<std::uint64_t>(channel & 0xFFF) << 35 | (srcOffset >> 32 & 0xFF) << 47 |
            (dstOffset >> 32 & 0xFF) << 55;
    t.snd = (srcOffset & 0xFFFFFFFFull) | (dstOffset & 0xFFFFFFFFull) << 32;
    return t;
  }

  FERRY_HOST_DEVICE FERRY_INLINE static PortRequest decode(const ProxyTrigger& t) {
    PortRequest r;
    r.bytes = t.fst & 0xFFFFFFFFull;
    r.kinds = static_cast<std::uint32_t>(t.fst >> 32 & 7);
    r.channel = static_cast<std::uint32_t>(t.fst >> 35 & 0xFFF);
    r.srcOffset = (t.fst >> 47 & 0xFF) << 32 | (t.snd & 0xFFFFFFFFull);
    r.dstOffset = (t.fst >> 55 & 0xFF) << 32 | t.snd >> 32;
    return r;
  }
};

struct PortChannelDeviceHandle {
  FifoDeviceHandle fifo;
  SemaphoreDeviceHandle semaphore;  // inbound is increased by the peer's proxy
  std::uint32_t channel = 0;
  // The service's per-channel words (host memory the GPU reads): slot + 1 once the flush pushed at
  // FIFO slot `slot` is complete. The proxy serves other channels while a flush is in progress, so
  // flushes of several channels overlap. Null: flush waits for the FIFO slot to retire instead.
  const std::uint64_t* flushed = nullptr;

  // All calls: one thread. Puts larger than one trigger can carry are split; only the last part
  // carries the signal or flush, so the peer is told once, after all of it.
  FERRY_HOST_DEVICE FERRY_INLINE void put(std::uint64_t dstOffset, std::uint64_t srcOffset,
                                          std::uint64_t bytes) {
    push(PortRequest::Put, dstOffset, srcOffset, bytes);
  }
  FERRY_HOST_DEVICE FERRY_INLINE void signal() { push(PortRequest::Signal, 0, 0, 0); }
  FERRY_HOST_DEVICE FERRY_INLINE void putWithSignal(std::uint64_t dstOffset, std::uint64_t srcOffset,
                                                    std::uint64_t bytes) {
    push(PortRequest::Put | PortRequest::Signal, dstOffset, srcOffset, bytes);
  }
  FERRY_HOST_DEVICE FERRY_INLINE void putWithSignalAndFlush(std::uint64_t dstOffset, std::uint64_t srcOffset,
                                                            std::uint64_t bytes) {
    awaitFlush(push(PortRequest::Put | PortRequest::Signal | PortRequest::Flush, dstOffset, srcOffset, bytes));
  }
  FERRY_HOST_DEVICE FERRY_INLINE void flush() { awaitFlush(push(PortRequest::Flush, 0, 0, 0)); }
  FERRY_HOST_DEVICE FERRY_INLINE void wait() { semaphore.wait(); }
  FERRY_HOST_DEVICE FERRY_INLINE bool poll() { return semaphore.poll(); }

 private:
  FERRY_HOST_DEVICE FERRY_INLINE void awaitFlush(std::uint64_t slot) {
    if (flushed == nullptr) {
      fifo.sync(slot);
      return;
    }
    spinUntil([&] { return atomicLoad(flushed + channel, memory_order_acquire) > slot; }, fifo.wait,
              "PortChannel::flush", slot);
  }

  // Returns the slot of the last trigger pushed.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t push(std::uint32_t kinds, std::uint64_t dstOffset,
                                                    std::uint64_t srcOffset, std::uint64_t bytes) {
    // 1 GiB parts: well under the 4 GiB a trigger can carry, and large enough that splitting never
    // costs bandwidth.
    constexpr std::uint64_t kPart = std::uint64_t{1} << 30;
    PortRequest r{kinds & PortRequest::Put, channel, dstOffset, srcOffset, 0};
    while ((kinds & PortRequest::Put) && bytes > kPart) {
      r.bytes = kPart;
      fifo.push(r.encode());
      r.dstOffset += kPart;
      r.srcOffset += kPart;
      bytes -= kPart;
    }
    r.kinds = kinds;
    r.bytes = (kinds & PortRequest::Put) ? bytes : 0;
    return fifo.push(r.encode());
  }
};
static_assert(std::is_trivially_copyable_v<PortChannelDeviceHandle>);

}  // namespace ferry
