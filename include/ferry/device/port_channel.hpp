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
//
// Puts that name their buffers: besides the channel's own pair (dst, src) of buffers, a put may
// name any memory added to the service (PortChannelService::addMemory returns its MemoryId): a
// buffer of the channel's peer, or of this rank (a copy within this rank, in order with the
// channel's other writes); and its source may be a memory of this rank or kLocalPointer, where
// srcOffset is an address in this process that the connection can read (any GPU memory of this
// process over CudaIpc). This is how collectives reach every registered buffer and scratch region
// of a communicator through one channel per peer.
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

// A memory of a PortChannelService (addMemory); 0 names none.
using MemoryId = std::uint32_t;
inline constexpr MemoryId kLocalPointer = 0xFFFFFF;  // a put's source: srcOffset is an address here

// A put naming its memories takes two triggers in consecutive FIFO slots (Fifo::pushPair). The
// first is told apart from a PortRequest by its kinds field, which is 0 there and never in a
// PortRequest:
//   first:  fst: bytes low 32 | 0 (3) | channel (12) | kinds (3) | bytes >> 32 (8)   snd: dstOffset
//   second: fst: dst memory (24) | src memory (24)                                    snd: srcOffset
struct PortPutRequest {
  static constexpr std::uint64_t kMaxBytes = (std::uint64_t{1} << 40) - 1;
  static constexpr MemoryId kMaxMemory = kLocalPointer;

  std::uint32_t kinds = 0;  // Put, with Signal and Flush as wanted
  std::uint32_t channel = 0;
  MemoryId dst = 0, src = 0;
  std::uint64_t dstOffset = 0, srcOffset = 0;
  std::uint64_t bytes = 0;

  FERRY_HOST_DEVICE FERRY_INLINE static bool isFirstHalf(const ProxyTrigger& t) { return (t.fst >> 32 & 7) == 0; }

  FERRY_HOST_DEVICE FERRY_INLINE void encode(ProxyTrigger& first, ProxyTrigger& second) const {
    first.fst = (bytes & 0xFFFFFFFFull) | static_cast<std::uint64_t>(channel & 0xFFF) << 35 |
                static_cast<std::uint64_t>(kinds & 7) << 47 | (bytes >> 32 & 0xFF) << 50;
    first.snd = dstOffset;
    second.fst = static_cast<std::uint64_t>(dst & 0xFFFFFF) | static_cast<std::uint64_t>(src & 0xFFFFFF) << 24;
    second.snd = srcOffset;
  }

  FERRY_HOST_DEVICE FERRY_INLINE static PortPutRequest decode(const ProxyTrigger& first, const ProxyTrigger& second) {
    PortPutRequest r;
    r.bytes = (first.fst & 0xFFFFFFFFull) | (first.fst >> 50 & 0xFF) << 32;
    r.channel = static_cast<std::uint32_t>(first.fst >> 35 & 0xFFF);
    r.kinds = static_cast<std::uint32_t>(first.fst >> 47 & 7);
    r.dstOffset = first.snd;
    r.dst = static_cast<MemoryId>(second.fst & 0xFFFFFF);
    r.src = static_cast<MemoryId>(second.fst >> 24 & 0xFFFFFF);
    r.srcOffset = second.snd;
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

  // Puts are cut into parts of 1 GiB: well under the 4 GiB a trigger can carry, and large enough
  // that splitting never costs bandwidth.
  static constexpr std::uint64_t kPart = std::uint64_t{1} << 30;

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
  // Asks for a flush without waiting; awaitFlush(the returned slot) waits. Flushes of several
  // channels then overlap: push each, then await each.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t pushFlush() { return push(PortRequest::Flush, 0, 0, 0); }

  // Puts naming their memories (see the top of this file).
  FERRY_HOST_DEVICE FERRY_INLINE void put(MemoryId dst, std::uint64_t dstOffset, MemoryId src,
                                          std::uint64_t srcOffset, std::uint64_t bytes) {
    pushNamed(PortRequest::Put, dst, dstOffset, src, srcOffset, bytes);
  }
  FERRY_HOST_DEVICE FERRY_INLINE void putWithSignal(MemoryId dst, std::uint64_t dstOffset, MemoryId src,
                                                    std::uint64_t srcOffset, std::uint64_t bytes) {
    pushNamed(PortRequest::Put | PortRequest::Signal, dst, dstOffset, src, srcOffset, bytes);
  }
  FERRY_HOST_DEVICE FERRY_INLINE void wait() { semaphore.wait(); }
  FERRY_HOST_DEVICE FERRY_INLINE bool poll() { return semaphore.poll(); }

  FERRY_HOST_DEVICE FERRY_INLINE void awaitFlush(std::uint64_t slot) {
    if (flushed == nullptr) {
      fifo.sync(slot);
      return;
    }
    spinUntil([&] { return atomicLoad(flushed + channel, memory_order_acquire) > slot; }, fifo.wait,
              "PortChannel::flush", slot);
  }

 private:
  // Parts of at most kPart bytes, as push(); returns the slot of the last trigger.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t pushNamed(std::uint32_t kinds, MemoryId dst, std::uint64_t dstOffset,
                                                         MemoryId src, std::uint64_t srcOffset, std::uint64_t bytes) {
    PortPutRequest r{PortRequest::Put, channel, dst, src, dstOffset, srcOffset, 0};
    ProxyTrigger first, second;
    while (bytes > kPart) {
      r.bytes = kPart;
      r.encode(first, second);
      fifo.pushPair(first, second);
      r.dstOffset += kPart;
      r.srcOffset += kPart;
      bytes -= kPart;
    }
    r.kinds = kinds;
    r.bytes = bytes;
    r.encode(first, second);
    return fifo.pushPair(first, second);
  }

  // Returns the slot of the last trigger pushed.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t push(std::uint32_t kinds, std::uint64_t dstOffset,
                                                    std::uint64_t srcOffset, std::uint64_t bytes) {
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
