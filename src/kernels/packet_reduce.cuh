#pragma once
// The receiving side of the one-hop LL reductions (allreduce_ll, reducescatter_ll): a word of the
// result is this rank's own word reduced, in rank order, with every peer's packet of it.
#include <cstdint>

#include "kernels/device_context.hpp"
#include "kernels/kernel_util.cuh"
#include "ferry/device/packet.hpp"

namespace ferry {

// `own`: this rank's word; packetOf(q): where peer q's packet of the word lands. Every peer's packet
// is waited for at once (readPackets over kCap, from withRankCapacity), and the words are reduced in
// rank order, so that every rank rounds alike, and accumulated as WordAccumulator<..., Wide> says.
// Returns the word of the result (avg's division done).
template <class T, ReduceOp Op, int kCap, bool Wide = false, class PacketOf>
FERRY_DEVICE FERRY_INLINE std::uint64_t reduceInRankOrder(const CollectiveContext& c, std::uint32_t flag,
                                                          std::uint64_t own, PacketOf&& packetOf) {
  const int R = c.nranks, r = c.rank;
  std::uint64_t v[kCap] = {};
  readPackets(((1u << R) - 1) & ~(1u << r), flag, v, packetOf, [&](int q) { return waitContext(c, q); });
  WordAccumulator<T, Op, Wide, std::uint64_t> acc(r == 0 ? own : v[0]);
#pragma unroll
  for (int q = 1; q < kCap; ++q)
    if (q < R) acc.add(q == r ? own : v[q]);
  return acc.result(R);
}

}  // namespace ferry
