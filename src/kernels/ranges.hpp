#pragma once
// How the thread blocks of a collective kernel share out elements: equal parts in whole grains,
// and, for calls that run in rounds through scratch slots, parts that keep their place in a slot.
// Host and device code, so the unit tests check the arithmetic.
#include <cstdint>

#include "ferry/device/macros.hpp"

namespace ferry {

struct Range {
  std::uint64_t begin, end;
  FERRY_HOST_DEVICE std::uint64_t size() const { return end - begin; }
};

// The size of each of `parts` equal parts of n units, rounded up to a multiple of `grain` (the
// last part may be shorter, or parts at the end empty).
FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t partSize(std::uint64_t n, std::uint64_t parts,
                                                      std::uint64_t grain) {
  return ((n + parts - 1) / parts + grain - 1) / grain * grain;
}

// [begin, end) of part `i` of `parts` equal parts of n units, each a multiple of `grain`.
FERRY_HOST_DEVICE FERRY_INLINE Range splitRange(std::uint64_t n, std::uint64_t parts, std::uint64_t i,
                                                std::uint64_t grain) {
  const std::uint64_t per = partSize(n, parts, grain);
  std::uint64_t b = i * per < n ? i * per : n;
  std::uint64_t e = b + per < n ? b + per : n;
  return {b, e};
}

// This block's part of a round's `chunk` elements when a call runs in rounds whose chunks are
// `fullChunk` elements (all but a short last round): the block's part of a full chunk, cut at
// `chunk`. So a block has the same place in a scratch slot every round. Blocks signal only the
// peers' blocks of their own index: if a short round split its chunk afresh, a block could write
// where another block of the peer is still reading the round before.
FERRY_HOST_DEVICE FERRY_INLINE Range roundPart(std::uint64_t chunk, std::uint64_t fullChunk,
                                               std::uint64_t parts, std::uint64_t i, std::uint64_t grain) {
  const Range p = splitRange(fullChunk, parts, i, grain);
  return {p.begin < chunk ? p.begin : chunk, p.end < chunk ? p.end : chunk};
}

}  // namespace ferry
