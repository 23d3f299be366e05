#pragma once
// A group's sends and recvs as one send/recv kernel's work (p2p.hpp): host-only, so that CI checks
// how a group is cut into streams and how the blocks are shared.
#include <vector>

#include "kernels/collective_call.hpp"
#include "collectives/p2p.hpp"

namespace ferry {

// One stream per (peer, direction) in issue order, and one for the copies to self (the i-th send
// to self pairs with the i-th recv from self). The blocks that fit on the GPU at once
// (`residentBlocks`), or `maxBlocks` of them (CommOptions; 0: no bound; never fewer than one per
// stream), are shared among the streams, none getting more than its widest message has lanes, the
// rest going to those that can use them. Error(InvalidUsage), naming the call, for
// calls on different streams, more than kP2PMaxOps to other ranks, a copy to self without its
// pair or of another size. @pre every call passed validatePeerCall; none has count 0.
P2PBatch planP2PGroup(const std::vector<PeerCall>& calls, int residentBlocks, int maxBlocks = 0);

}  // namespace ferry
