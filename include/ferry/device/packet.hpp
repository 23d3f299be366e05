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

  // The packet as it is now, in one load (a flag is never seen without the data beside it).
  struct Loaded {
    std::uint32_t d1, f1, d2, f2;
    FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t data() const { return detail::pack(d1, d2); }
    FERRY_HOST_DEVICE FERRY_INLINE bool carries(std::uint32_t flag) const { return f1 == flag && f2 == flag; }
  };
  FERRY_HOST_DEVICE FERRY_INLINE Loaded load() const {
    Loaded l;
#if FERRY_DEVICE_CODE
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(l.d1), "=r"(l.f1), "=r"(l.d2), "=r"(l.f2)
                 : "l"(this)
                 : "memory");
#else
    const auto* words = reinterpret_cast<const std::uint64_t*>(this);
    std::uint64_t a = atomicLoad(words, memory_order_relaxed),
                  b = atomicLoad(words + 1, memory_order_relaxed);
    l.d1 = static_cast<std::uint32_t>(a), l.f1 = static_cast<std::uint32_t>(a >> 32);
    l.d2 = static_cast<std::uint32_t>(b), l.f2 = static_cast<std::uint32_t>(b >> 32);
#endif
    return l;
  }

  // True and the data if both halves carry `flag`.
  FERRY_HOST_DEVICE FERRY_INLINE bool tryRead(std::uint32_t flag, std::uint64_t& data) const {
    const Loaded l = load();
    data = l.data();
    return l.carries(flag);
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
// who-for-whom. Each pass loads a packet for every q < kMax before it compares any flag, so packets
// that have arrived cost one memory round trip together, where reading them one after the other
// costs one each (each flag's compare stood between one load and the next). The loads are
// unconditional (a q that is no sender loads a sender's packet again), because the compiler
// interleaves predicated loads with the compares; so the caller picks kMax near its rank count
// (withRankCapacity), not kMaxRanks, or each pass loads what it does not need. A wait that runs
// out names the lowest sender still missing; an abort (WaitContext::abortFlag) returns with the
// missing senders' data undefined, as a single packet's read does.
template <int kMax, class PacketOf, class ContextOf>
FERRY_HOST_DEVICE FERRY_INLINE void readPackets(std::uint32_t from, std::uint32_t flag, std::uint64_t (&data)[kMax],
                                                PacketOf&& packetOf, ContextOf&& contextOf) {
  static_assert(kMax > 0 && kMax < 32);
  const std::uint32_t senders = from & ((1u << kMax) - 1);
  if (senders == 0) return;
  int any = 0;
  while ((senders >> any & 1u) == 0) ++any;
  // Where each load goes, once: every pass loads them all (a packet that has arrived keeps its flag
  // for the whole call: its sender rewrites the slot two calls later, after this rank has started
  // the next one), so the addresses stay out of the loop that polls.
  const LL16Packet* at[kMax];
#if FERRY_DEVICE_CODE
#pragma unroll
#endif
  for (int q = 0; q < kMax; ++q) at[q] = packetOf((senders >> q & 1u) != 0 ? q : any);
  std::uint32_t missing = senders;
  const auto pass = [&] {
    typename LL16Packet::Loaded seen[kMax];
#if FERRY_DEVICE_CODE
#pragma unroll
#endif
    for (int q = 0; q < kMax; ++q) seen[q] = at[q]->load();
    std::uint32_t got = 0;
#if FERRY_DEVICE_CODE
#pragma unroll
#endif
    for (int q = 0; q < kMax; ++q)
      if ((senders >> q & 1u) != 0 && seen[q].carries(flag)) {
        data[q] = seen[q].data();
        got |= 1u << q;
      }
    missing = senders & ~got;
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

// Calls f.template operator()<kCap>() with the smallest of 2, 4 and 8 that is at least `ranks`: the
// capacity of readPackets' pass for a kernel of that many ranks.
template <class F>
FERRY_HOST_DEVICE FERRY_INLINE void withRankCapacity(int ranks, F&& f) {
  if (ranks <= 2)
    f.template operator()<2>();
  else if (ranks <= 4)
    f.template operator()<4>();
  else
    f.template operator()<8>();
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
