#pragma once
// The copy engine of a Comm: a proxy thread that performs, on the GPU's copy engines, the copies a
// collective kernel asks for, so that large transfers move at the copy engines' rate (394 GB/s per
// GPU here, above what SM stores reach) while the SMs stay free. The kernel resolves every address
// itself (a peer's registered buffer, a peer's scratch), so the host needs to know nothing about
// the call, and the whole thing captures into CUDA graphs like any kernel.
//
// One thread of the kernel (the driver) pushes triggers into the engine's FIFO:
//   copy(stream, dst, src, bytes)   queue a copy on the engine's stream `stream` (one stream per
//                                   rank: copies to one peer run in order, to different peers at
//                                   once); two FIFO slots (destination, then source), which the
//                                   proxy pairs up by stream
//   mark(k)                         record event set k (k < kCeMarks) on every stream
//   flush(k)                        return (FIFO sync) once every copy queued before mark(k) is
//                                   complete at its destination
//   flushStream(stream)             return once every copy queued so far on `stream` is complete
//   flushAll()                      return once every copy queued so far is complete
// After a flush the driver tells the peers with a release store of its own (device_context.hpp's
// flags): a peer that sees the flag sees the copied bytes. Several threads may push at once: the two
// halves of a copy pair up by stream, and a lock per stream (in device memory) keeps another
// thread's halves for that stream out from between them. Event sets (mark/flush) belong to one
// driver at a time.
#include <cstdint>

#include "ferry/device/fifo.hpp"
#include "ferry/device/macros.hpp"

namespace ferry {

inline constexpr int kCeMarks = 4;        // event sets: a driver has at most this many marks open
inline constexpr int kCeStreams = 8;      // = kMaxRanks: one stream per rank

// The 127 bits of a trigger: fst = kind (3 bits) | stream (4 bits) << 3 | value (55 bits) << 8;
// snd = an address (CopyTo: destination, CopyFrom: source) or 0.
enum class CeKind : std::uint32_t { CopyTo = 1, CopyFrom = 2, Mark = 3, Flush = 4, FlushAll = 5, FlushStream = 6 };

struct CeRequest {
  CeKind kind = CeKind::CopyTo;
  std::uint32_t stream = 0;
  std::uint64_t value = 0;  // CopyTo: bytes; Mark, Flush: the event set
  std::uint64_t address = 0;

  static constexpr std::uint64_t kMaxValue = (std::uint64_t{1} << 55) - 1;

  FERRY_HOST_DEVICE FERRY_INLINE ProxyTrigger encode() const {
    return {static_cast<std::uint64_t>(kind) | static_cast<std::uint64_t>(stream & 15) << 3 | (value & kMaxValue) << 8,
            address};
  }
  FERRY_HOST_DEVICE FERRY_INLINE static CeRequest decode(const ProxyTrigger& t) {
    CeRequest r;
    r.kind = static_cast<CeKind>(t.fst & 7);
    r.stream = static_cast<std::uint32_t>(t.fst >> 3 & 15);
    r.value = t.fst >> 8 & kMaxValue;
    r.address = t.snd;
    return r;
  }
};

// What the driver thread of a kernel uses. Trivially copyable; pass by value.
struct CopyEngineHandle {
  FifoDeviceHandle fifo;
  std::uint32_t* locks = nullptr;  // one per stream; null: a single producer, no locking

  FERRY_HOST_DEVICE FERRY_INLINE void copy(int stream, void* dst, const void* src, std::uint64_t bytes) const {
    if (bytes == 0) return;
    const auto s = static_cast<std::uint32_t>(stream);
    std::uint32_t* lock = locks != nullptr ? locks + s : nullptr;
    if (lock != nullptr)
      spinUntil([&] { return atomicCompareExchange<std::uint32_t, cuda::thread_scope_device>(lock, 0u, 1u, memory_order_acquire); },
                fifo.wait, "copy engine: the lock of a stream", s);
    fifo.push(CeRequest{CeKind::CopyTo, s, bytes, reinterpret_cast<std::uint64_t>(dst)}.encode());
    fifo.push(CeRequest{CeKind::CopyFrom, s, 0, reinterpret_cast<std::uint64_t>(src)}.encode());
    if (lock != nullptr) atomicStore<std::uint32_t, cuda::thread_scope_device>(lock, 0u, memory_order_release);
  }
  FERRY_HOST_DEVICE FERRY_INLINE void flushStream(int stream) const {
    fifo.sync(fifo.push(CeRequest{CeKind::FlushStream, static_cast<std::uint32_t>(stream), 0, 0}.encode()));
  }
  FERRY_HOST_DEVICE FERRY_INLINE void mark(int set) const {
    fifo.push(CeRequest{CeKind::Mark, 0, static_cast<std::uint64_t>(set), 0}.encode());
  }
  FERRY_HOST_DEVICE FERRY_INLINE void flush(int set) const {
    fifo.sync(fifo.push(CeRequest{CeKind::Flush, 0, static_cast<std::uint64_t>(set), 0}.encode()));
  }
  FERRY_HOST_DEVICE FERRY_INLINE void flushAll() const {
    fifo.sync(fifo.push(CeRequest{CeKind::FlushAll, 0, 0, 0}.encode()));
  }
};

class CopyEngine;  // host side (copy_engine_host.hpp)

}  // namespace ferry
