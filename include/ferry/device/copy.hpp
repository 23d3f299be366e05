#pragma once
// Cooperative copy for any size and alignment: the threads [0, nthreads) together copy `bytes`
// from src to dst, using the widest access both pointers allow (16 bytes when they agree modulo 16,
// else 8, 4 or 1), with the unaligned head and tail done bytewise. Either pointer may be peer
// memory mapped over NVLink (put writes remote memory, get reads it).
//
//   copy(remote + off, local + off, n, threadIdx.x, blockDim.x);   // one block
//   copy(d, s, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);   // whole grid
#include <cstdint>

#include "ferry/device/macros.hpp"

namespace ferry {

namespace detail {

struct alignas(16) Vec16 {
  std::uint64_t lo, hi;
};

template <class T>
FERRY_HOST_DEVICE FERRY_INLINE void copyWords(T* dst, const T* src, std::uint64_t n, std::uint32_t tid,
                                              std::uint32_t nthreads) {
  // Four independent loads in flight per thread before the stores: a single load-store pair per
  // iteration leaves NVLink latency exposed.
  std::uint64_t i = tid;
  const std::uint64_t stride = nthreads;
  for (; i + 3 * stride < n; i += 4 * stride) {
    T a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

template <class T>
FERRY_HOST_DEVICE FERRY_INLINE void copyAligned(unsigned char* dst, const unsigned char* src,
                                                std::uint64_t bytes, std::uint32_t tid,
                                                std::uint32_t nthreads) {
  constexpr std::uint64_t w = sizeof(T);
  // dst and src agree modulo w: after `head` bytes both are w-aligned.
  std::uint64_t head = (w - reinterpret_cast<std::uintptr_t>(dst) % w) % w;
  if (head > bytes) head = bytes;
  const std::uint64_t words = (bytes - head) / w;
  const std::uint64_t tail = bytes - head - words * w;
  // The few head and tail bytes, spread over the threads like the words.
  for (std::uint64_t b = tid; b < head + tail; b += nthreads) {
    std::uint64_t at = b < head ? b : head + words * w + (b - head);
    dst[at] = src[at];
  }
  copyWords(reinterpret_cast<T*>(dst + head), reinterpret_cast<const T*>(src + head), words, tid, nthreads);
}

}  // namespace detail

FERRY_HOST_DEVICE FERRY_INLINE void copy(void* dst, const void* src, std::uint64_t bytes, std::uint32_t tid,
                                         std::uint32_t nthreads) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const auto mismatch = reinterpret_cast<std::uintptr_t>(d) ^ reinterpret_cast<std::uintptr_t>(s);
  if (mismatch % 16 == 0) return detail::copyAligned<detail::Vec16>(d, s, bytes, tid, nthreads);
  if (mismatch % 8 == 0) return detail::copyAligned<std::uint64_t>(d, s, bytes, tid, nthreads);
  if (mismatch % 4 == 0) return detail::copyAligned<std::uint32_t>(d, s, bytes, tid, nthreads);
  detail::copyWords(d, s, bytes, tid, nthreads);
}

}  // namespace ferry
