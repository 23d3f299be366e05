#pragma once
// LL ("low latency") packets: data and a flag in one store, so a receiver that sees the flag sees
// the data and no separate signal is needed. The sender picks a flag value that differs from
// whatever the buffer held before (e.g. an iteration counter, never 0 when buffers start zeroed).
//
//   LL16Packet: 16 bytes carry 8 data bytes (two 4-byte data words, each beside its own flag),
//               written with one 16-byte store.
//   LL8Packet:  8 bytes carry 4 data bytes, written with one 8-byte store.
// Either way the packet buffer is twice the data it carries.
//
// On the GPU these use volatile vector stores and loads (one memory transaction each). On the host
// (tests) each 8-byte half is one relaxed atomic, which preserves the one guarantee the protocol
// needs: a flag is never seen without the data beside it.
#include <cstdint>
#include <type_traits>

#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/macros.hpp"
#include "ferry/device/timeout.hpp"

namespace ferry {

namespace detail {
FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t pack(std::uint32_t lo, std::uint32_t hi) {
  return static_cast<std::uint64_t>(hi) << 32 | lo;
}
}  // namespace detail

struct alignas(16) LL16Packet {
  std::uint32_t data1, flag1, data2, flag2;
  static constexpr std::uint32_t kDataBytes = 8;

  FERRY_HOST_DEVICE FERRY_INLINE void write(std::uint64_t data, std::uint32_t flag) {
    const auto lo = static_cast<std::uint32_t>(data), hi = static_cast<std::uint32_t>(data >> 32);
#if FERRY_DEVICE_CODE
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(this), "r"(lo), "r"(flag), "r"(hi),
                 "r"(flag)
                 : "memory");
#else
    auto* words = reinterpret_cast<std::uint64_t*>(this);
    atomicStore(words, detail::pack(lo, flag), memory_order_relaxed);
    atomicStore(words + 1, detail::pack(hi, flag), memory_order_relaxed);
#endif
  }

  // True and the data if both halves carry `flag`.
  FERRY_HOST_DEVICE FERRY_INLINE bool tryRead(std::uint32_t flag, std::uint64_t& data) const {
    std::uint32_t d1, f1, d2, f2;
#if FERRY_DEVICE_CODE
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(d1), "=r"(f1), "=r"(d2), "=r"(f2)
                 : "l"(this)
                 : "memory");
#else
    const auto* words = reinterpret_cast<const std::uint64_t*>(this);
    std::uint64_t a = atomicLoad(words, memory_order_relaxed),
                  b = atomicLoad(words + 1, memory_order_relaxed);
    d1 = static_cast<std::uint32_t>(a), f1 = static_cast<std::uint32_t>(a >> 32);
    d2 = static_cast<std::uint32_t>(b), f2 = static_cast<std::uint32_t>(b >> 32);
#endif
    data = detail::pack(d1, d2);
    return f1 == flag && f2 == flag;
  }

  // Waits (bounded) for the packet carrying `flag` and returns its data.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t read(std::uint32_t flag, const WaitContext& ctx) const {
    std::uint64_t data = 0;
    spinUntil([&] { return tryRead(flag, data); }, ctx, "LL16 packet read", flag);
    return data;
  }
};

struct alignas(8) LL8Packet {
  std::uint32_t data, flag;
  static constexpr std::uint32_t kDataBytes = 4;

  FERRY_HOST_DEVICE FERRY_INLINE void write(std::uint32_t value, std::uint32_t f) {
#if FERRY_DEVICE_CODE
    asm volatile("st.volatile.global.v2.u32 [%0], {%1,%2};" ::"l"(this), "r"(value), "r"(f) : "memory");
#else
    atomicStore(reinterpret_cast<std::uint64_t*>(this), detail::pack(value, f), memory_order_relaxed);
#endif
  }

  FERRY_HOST_DEVICE FERRY_INLINE bool tryRead(std::uint32_t f, std::uint32_t& value) const {
    std::uint32_t v, g;
#if FERRY_DEVICE_CODE
    asm volatile("ld.volatile.global.v2.u32 {%0,%1}, [%2];" : "=r"(v), "=r"(g) : "l"(this) : "memory");
#else
    std::uint64_t word = atomicLoad(reinterpret_cast<const std::uint64_t*>(this), memory_order_relaxed);
    v = static_cast<std::uint32_t>(word), g = static_cast<std::uint32_t>(word >> 32);
#endif
    value = v;
    return g == f;
  }

  FERRY_HOST_DEVICE FERRY_INLINE std::uint32_t read(std::uint32_t f, const WaitContext& ctx) const {
    std::uint32_t value = 0;
    spinUntil([&] { return tryRead(f, value); }, ctx, "LL8 packet read", f);
    return value;
  }
};

// Waits (bounded) for one LL16 packet from each sender of `from` (bit q: sender q, q < kMax) and
// returns sender q's data in data[q]; packetOf(q) is where its packet lands, contextOf(q) the wait's
// who-for-whom. Each pass issues the loads of every packet still missing before it looks at any of
// them, so packets that have arrived cost one memory round trip together, where reading them one
// after the other costs one each (the flag's compare stands between one load and the next). A wait
// that runs out names the lowest sender still missing; an abort (WaitContext::abortFlag) returns
// with the missing senders' data undefined, as a single packet's read does.
template <int kMax, class PacketOf, class ContextOf>
FERRY_HOST_DEVICE FERRY_INLINE void readPackets(std::uint32_t from, std::uint32_t flag, std::uint64_t (&data)[kMax],
                                                PacketOf&& packetOf, ContextOf&& contextOf) {
  static_assert(kMax > 0 && kMax <= 32);
  std::uint32_t missing = from;
  const auto pass = [&] {
    const std::uint32_t want = missing;  // (the pass's loads depend on this, not on each other)
    std::uint32_t got = 0;
#if FERRY_DEVICE_CODE
#pragma unroll
#endif
    for (int q = 0; q < kMax; ++q)
      if ((want >> q & 1u) != 0)
        got |= static_cast<std::uint32_t>(packetOf(q)->tryRead(flag, data[q])) << q;
    missing = want & ~got;
  };
  pass();
  while (missing != 0) {
    int late = 0;
    while ((missing >> late & 1u) == 0) ++late;
    spinUntil(
        [&] {
          pass();
          return (missing >> late & 1u) == 0;
        },
        contextOf(late), "LL16 packet read", flag);
    if ((missing >> late & 1u) != 0) return;  // aborted: the call runs to its end with garbage
  }
}

static_assert(sizeof(LL16Packet) == 16 && std::is_trivially_copyable_v<LL16Packet>);
static_assert(sizeof(LL8Packet) == 8 && std::is_trivially_copyable_v<LL8Packet>);

// Cooperative packing: the threads [0, nthreads) turn `bytes` of src into packets at dst (in the
// peer's packet buffer). A trailing partial word is zero-padded; the receiver unpacks `bytes` only.
// @pre src is 4-byte (LL8) or 8-byte (LL16) aligned; dst is packet-aligned.
template <class Packet>
FERRY_HOST_DEVICE FERRY_INLINE void putPackets(Packet* dst, const void* src, std::uint64_t bytes,
                                               std::uint32_t flag, std::uint32_t tid,
                                               std::uint32_t nthreads) {
  constexpr std::uint32_t k = Packet::kDataBytes;
  using Word = std::conditional_t<k == 8, std::uint64_t, std::uint32_t>;
  const auto* in = static_cast<const unsigned char*>(src);
  const std::uint64_t full = bytes / k;
  for (std::uint64_t i = tid; i < full; i += nthreads)
    dst[i].write(*reinterpret_cast<const Word*>(in + i * k), flag);
  if (tid == 0 && bytes % k != 0) {
    Word last = 0;
    for (std::uint64_t b = 0; b < bytes % k; ++b) last |= static_cast<Word>(in[full * k + b]) << (8 * b);
    dst[full].write(last, flag);
  }
}

// Cooperative unpacking: waits for each packet carrying `flag` and writes its data to dst.
// @pre dst is 4-byte (LL8) or 8-byte (LL16) aligned.
template <class Packet>
FERRY_HOST_DEVICE FERRY_INLINE void unpackPackets(void* dst, const Packet* src, std::uint64_t bytes,
                                                  std::uint32_t flag, std::uint32_t tid,
                                                  std::uint32_t nthreads, const WaitContext& ctx) {
  constexpr std::uint32_t k = Packet::kDataBytes;
  using Word = std::conditional_t<k == 8, std::uint64_t, std::uint32_t>;
  auto* out = static_cast<unsigned char*>(dst);
  const std::uint64_t full = bytes / k;
  for (std::uint64_t i = tid; i < full; i += nthreads)
    *reinterpret_cast<Word*>(out + i * k) = src[i].read(flag, ctx);
  if (tid == 0 && bytes % k != 0) {
    Word last = src[full].read(flag, ctx);
    for (std::uint64_t b = 0; b < bytes % k; ++b)
      out[full * k + b] = static_cast<unsigned char>(last >> (8 * b));
  }
}

// Bytes of packet buffer needed to carry `bytes` of data.
template <class Packet>
FERRY_HOST_DEVICE constexpr std::uint64_t packetBufferBytes(std::uint64_t bytes) {
  return (bytes + Packet::kDataBytes - 1) / Packet::kDataBytes * sizeof(Packet);
}

}  // namespace ferry
