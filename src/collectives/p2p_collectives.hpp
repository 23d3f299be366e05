#pragma once
// AllGather, AllToAll and Broadcast as one group of sends and recvs on the send/recv kernel
// (p2p.hpp): allgather_p2p, alltoall_p2p, broadcast_p2p. Each peer's part goes through its own
// lanes, every sending block storing over NVLink while other blocks copy what arrived out of the
// inbox; the *_push kernels instead copy in and copy out in turns, and NVLink idles during each
// copy-out. Host code only: the kernel is the send/recv kernel.
#include <vector>

#include "kernels/algorithm.hpp"
#include "kernels/collective_call.hpp"

namespace ferry {

// The sends and recvs (and the copy of this rank's own part, as a send to and recv from itself)
// that make up `call` on this rank. An in-place all-to-all has none: its recvs would overwrite
// what its sends still read. @pre call.collective is AllGather, AllToAll or Broadcast.
std::vector<PeerCall> p2pCallsOf(const CollectiveCall& call);

// The three algorithms, in the order of builtinAlgorithms' families.
std::vector<const Algorithm*> p2pCollectiveAlgorithms();

}  // namespace ferry
