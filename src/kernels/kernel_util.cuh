#pragma once
// Building blocks of the collective kernels: whole-word loads and stores of user buffers of any
// alignment, and the reduction of several sources element by element, 16 bytes at a time where
// every pointer allows it.
#include <cstdint>
#include <cstring>

#include "kernels/ranges.hpp"
#include "kernels/reduce_ops.hpp"
#include "ferry/device/copy.hpp"
#include "ferry/device/macros.hpp"

namespace ferry {

inline constexpr int kThreads = 512;  // threads per block of every collective kernel

struct alignas(16) Vec16 {
  std::uint64_t lo, hi;
};

FERRY_DEVICE FERRY_INLINE bool aligned(const void* p, std::uintptr_t to) {
  return reinterpret_cast<std::uintptr_t>(p) % to == 0;
}

// The byte-wise forms of loadWord and storeWord, for a word the end cuts or a buffer that is not
// 8-byte aligned: out of line, so that a kernel that loads a word for each of several peers carries
// one copy of the loop, not one a peer (the rare path; the common one is a single access).
FERRY_DEVICE inline __noinline__ std::uint64_t loadBytes(const char* p, std::uint64_t n) {
  std::uint64_t v = 0;
  for (std::uint64_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
FERRY_DEVICE inline __noinline__ void storeBytes(char* p, std::uint64_t n, std::uint64_t v) {
  for (std::uint64_t i = 0; i < n; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

// Word w (8 bytes) of a buffer of `bytes` bytes; past the end reads as zero.
FERRY_DEVICE FERRY_INLINE std::uint64_t loadWord(const char* base, std::uint64_t w, std::uint64_t bytes) {
  const char* p = base + w * 8;
  if ((w + 1) * 8 <= bytes && aligned(p, 8)) return *reinterpret_cast<const std::uint64_t*>(p);
  return w * 8 < bytes ? loadBytes(p, bytes - w * 8 < 8 ? bytes - w * 8 : 8) : 0;
}

// Stores the bytes of word w that lie within `bytes`.
FERRY_DEVICE FERRY_INLINE void storeWord(char* base, std::uint64_t w, std::uint64_t bytes, std::uint64_t v) {
  char* p = base + w * 8;
  if ((w + 1) * 8 <= bytes && aligned(p, 8)) {
    *reinterpret_cast<std::uint64_t*>(p) = v;
    return;
  }
  if (w * 8 < bytes) storeBytes(p, bytes - w * 8 < 8 ? bytes - w * 8 : 8, v);
}

// Element-wise op over the elements packed in two words (W: std::uint64_t or Vec16).
template <class T, ReduceOp Op, class W>
FERRY_DEVICE FERRY_INLINE W reduceWord(W a, W b) {
  constexpr int n = sizeof(W) / sizeof(T);
  T x[n], y[n];
  std::memcpy(x, &a, sizeof(W));
  std::memcpy(y, &b, sizeof(W));
#pragma unroll
  for (int i = 0; i < n; ++i) x[i] = applyOp<Op>(x[i], y[i]);
  std::memcpy(&a, x, sizeof(W));
  return a;
}

template <class T, ReduceOp Op, class W>
FERRY_DEVICE FERRY_INLINE W finishWord(W a, int nranks) {
  if constexpr (Op != ReduceOp::Avg) {
    return a;
  } else {
    constexpr int n = sizeof(W) / sizeof(T);
    T x[n];
    std::memcpy(x, &a, sizeof(W));
#pragma unroll
    for (int i = 0; i < n; ++i) x[i] = finishOp<Op>(x[i], nranks);
    std::memcpy(&a, x, sizeof(W));
    return a;
  }
}

// What a reduction over ranks holds of a word (W: std::uint64_t or Vec16) between the ranks' terms.
// Stepwise (Wide false): the word itself, each term combined in T and rounded, as NCCL does. Wide,
// for a sum or average of 16- and 8-bit floats (kWideSum): each element in float, rounded to T
// once, in result() (Accumulation::Float32, docs/architecture.md, "Accumulation").
template <class T, ReduceOp Op, bool Wide, class W>
struct WordAccumulator {
  W word;
  FERRY_DEVICE FERRY_INLINE explicit WordAccumulator(W first) : word(first) {}
  FERRY_DEVICE FERRY_INLINE void add(W next) { word = reduceWord<T, Op>(word, next); }
  FERRY_DEVICE FERRY_INLINE W result(int nranks) const { return finishWord<T, Op>(word, nranks); }
};

template <class T, ReduceOp Op, class W>
struct WordAccumulator<T, Op, true, W> {
  static_assert(kWideSum<T, Op>, "float32 accumulation is for sums and averages of 16- and 8-bit floats");
  static constexpr int n = sizeof(W) / sizeof(T);
  float v[n];
  FERRY_DEVICE FERRY_INLINE explicit WordAccumulator(W first) {
    T x[n];
    std::memcpy(x, &first, sizeof(W));
#pragma unroll
    for (int i = 0; i < n; ++i) v[i] = toFloat(x[i]);
  }
  FERRY_DEVICE FERRY_INLINE void add(W next) {
    T x[n];
    std::memcpy(x, &next, sizeof(W));
#pragma unroll
    for (int i = 0; i < n; ++i) v[i] += toFloat(x[i]);
  }
  FERRY_DEVICE FERRY_INLINE W result(int nranks) const {
    T x[n];
#pragma unroll
    for (int i = 0; i < n; ++i) x[i] = fromFloat<T>(Op == ReduceOp::Avg ? v[i] / static_cast<float>(nranks) : v[i]);
    W out;
    std::memcpy(&out, x, sizeof(W));
    return out;
  }
};

// Up to kMaxRanks sources reduced in rank order (so every rank rounds alike) into up to
// kMaxRanks + 1 destinations: dst[d][i] = finish(op(src[0][i], ..., src[n-1][i])) for i < count,
// accumulated as WordAccumulator<..., Wide> says. The threads [tid, nthreads) of the caller share
// the work. Sources and destinations may be peer memory. Any element-aligned pointers work;
// 16-byte aligned ones go 16 bytes at a time.
template <class T, ReduceOp Op, bool Wide = false>
FERRY_DEVICE FERRY_INLINE void reduceSources(char* const* dst, int ndst, const char* const* src, int nsrc,
                                             int nranks, std::uint64_t count, std::uint32_t tid,
                                             std::uint32_t nthreads) {
  bool vec = true;
  for (int s = 0; s < nsrc; ++s) vec = vec && aligned(src[s], 16);
  for (int d = 0; d < ndst; ++d) vec = vec && aligned(dst[d], 16);
  std::uint64_t done = 0;
  if (vec) {
    constexpr std::uint64_t per = sizeof(Vec16) / sizeof(T);
    const std::uint64_t nvec = count / per;
    for (std::uint64_t i = tid; i < nvec; i += nthreads) {
      WordAccumulator<T, Op, Wide, Vec16> acc(reinterpret_cast<const Vec16*>(src[0])[i]);
      for (int s = 1; s < nsrc; ++s) acc.add(reinterpret_cast<const Vec16*>(src[s])[i]);
      const Vec16 out = acc.result(nranks);
      for (int d = 0; d < ndst; ++d) reinterpret_cast<Vec16*>(dst[d])[i] = out;
    }
    done = nvec * per;
  }
  for (std::uint64_t i = done + tid; i < count; i += nthreads) {
    WordAccumulator<T, Op, Wide, T> acc(reinterpret_cast<const T*>(src[0])[i]);
    for (int s = 1; s < nsrc; ++s) acc.add(reinterpret_cast<const T*>(src[s])[i]);
    const T out = acc.result(nranks);
    for (int d = 0; d < ndst; ++d) reinterpret_cast<T*>(dst[d])[i] = out;
  }
}

// Copies `bytes` from src to every one of ndst destinations, reading src once where all pointers
// are 16-byte aligned (else once per destination). The threads [tid, nthreads) share the work.
FERRY_DEVICE FERRY_INLINE void copyToMany(char* const* dst, int ndst, const char* src, std::uint64_t bytes,
                                          std::uint32_t tid, std::uint32_t nthreads) {
  bool vec = aligned(src, 16);
  for (int d = 0; d < ndst; ++d) vec = vec && aligned(dst[d], 16);
  if (!vec) {
    for (int d = 0; d < ndst; ++d) copy(dst[d], src, bytes, tid, nthreads);
    return;
  }
  const std::uint64_t nvec = bytes / 16;
  for (std::uint64_t i = tid; i < nvec; i += nthreads) {
    const Vec16 v = reinterpret_cast<const Vec16*>(src)[i];
    for (int d = 0; d < ndst; ++d) reinterpret_cast<Vec16*>(dst[d])[i] = v;
  }
  for (std::uint64_t i = nvec * 16 + tid; i < bytes; i += nthreads)
    for (int d = 0; d < ndst; ++d) dst[d][i] = src[i];
}

}  // namespace ferry
