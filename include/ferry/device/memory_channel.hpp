#pragma once
// MemoryChannel device handle: this GPU reads and writes the peer's registered memory itself,
// through the NVLink/P2P mapping, and synchronizes through a semaphore whose counters both GPUs can
// reach. No proxy and no copy engine are involved.
//
// Buffers, as the host MemoryChannel set them up:
//   dst     the peer's buffer, mapped here (remote)
//   src     this rank's buffer (local)
//   packets this rank's packet buffer, which the peer's putPackets fills (local)
// Offsets are in bytes. Cooperative calls take the calling threads as (tid, nthreads) and must be
// called by all of them; signal/wait/poll are for one thread.
//
//   // rank A, one block: send 1 MiB to B and tell it
//   chan.put(0, 0, 1 << 20, threadIdx.x, blockDim.x);
//   __syncthreads();
//   if (threadIdx.x == 0) chan.signal();
//   // rank B
//   if (threadIdx.x == 0) chan.wait();
//   __syncthreads();   // now the block may read what A put
#include <cstdint>
#include <type_traits>

#include "ferry/device/copy.hpp"
#include "ferry/device/packet.hpp"
#include "ferry/device/semaphore.hpp"

namespace ferry {

struct MemoryChannelDeviceHandle {
  SemaphoreDeviceHandle semaphore;
  void* dst = nullptr;
  void* src = nullptr;
  void* packets = nullptr;

  // src[srcOffset, +bytes) -> peer's dst[dstOffset, +bytes).
  FERRY_HOST_DEVICE FERRY_INLINE void put(std::uint64_t dstOffset, std::uint64_t srcOffset,
                                          std::uint64_t bytes, std::uint32_t tid, std::uint32_t nthreads) {
    copy(static_cast<char*>(dst) + dstOffset, static_cast<const char*>(src) + srcOffset, bytes, tid,
         nthreads);
  }

  // Peer's dst[dstOffset, +bytes) -> src[srcOffset, +bytes).
  FERRY_HOST_DEVICE FERRY_INLINE void get(std::uint64_t dstOffset, std::uint64_t srcOffset,
                                          std::uint64_t bytes, std::uint32_t tid, std::uint32_t nthreads) {
    copy(static_cast<char*>(src) + srcOffset, static_cast<const char*>(dst) + dstOffset, bytes, tid,
         nthreads);
  }

  // src[srcOffset, +bytes) -> packets in the peer's dst at packet-buffer offset dstOffset (bytes of
  // packet space; packetBufferBytes<Packet>(bytes) of it are written).
  // @pre srcOffset keeps src aligned to Packet::kDataBytes; dstOffset is a multiple of sizeof(Packet)
  template <class Packet = LL16Packet>
  FERRY_HOST_DEVICE FERRY_INLINE void putPackets(std::uint64_t dstOffset, std::uint64_t srcOffset,
                                                 std::uint64_t bytes, std::uint32_t flag, std::uint32_t tid,
                                                 std::uint32_t nthreads) {
    ferry::putPackets(reinterpret_cast<Packet*>(static_cast<char*>(dst) + dstOffset),
                      static_cast<const char*>(src) + srcOffset, bytes, flag, tid, nthreads);
  }

  // Waits for packets with `flag` in this rank's packet buffer at packetOffset and writes their
  // data to src[srcOffset, +bytes).
  template <class Packet = LL16Packet>
  FERRY_HOST_DEVICE FERRY_INLINE void unpackPackets(std::uint64_t packetOffset, std::uint64_t srcOffset,
                                                    std::uint64_t bytes, std::uint32_t flag,
                                                    std::uint32_t tid, std::uint32_t nthreads) {
    ferry::unpackPackets(static_cast<char*>(src) + srcOffset,
                         reinterpret_cast<const Packet*>(static_cast<const char*>(packets) + packetOffset),
                         bytes, flag, tid, nthreads, semaphore.wait_);
  }

  FERRY_HOST_DEVICE FERRY_INLINE void signal() { semaphore.signal(); }
  FERRY_HOST_DEVICE FERRY_INLINE void relaxedSignal() { semaphore.relaxedSignal(); }
  FERRY_HOST_DEVICE FERRY_INLINE void wait() { semaphore.wait(); }
  FERRY_HOST_DEVICE FERRY_INLINE bool poll() { return semaphore.poll(); }
};
static_assert(std::is_trivially_copyable_v<MemoryChannelDeviceHandle>);

}  // namespace ferry
