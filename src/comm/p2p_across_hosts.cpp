// send and recv of a Comm across hosts (docs/multi-node.md, "send and recv across hosts"). A group's
// calls with peers on this host run as a group of this host's Comm (its send/recv kernel, local
// ranks); each peer on another host has a link of its own, HostPartners over a PairBootstrap (two
// "hosts": the pair), made at the pair's first matched call, and each send or recv with it is one
// one-way exchange of bytes through the link's slots (collectives/partner_exchange.hpp).
//
// Order, so that no ranks wait for each other in a circle: every rank runs its host's part first
// (it waits only for ranks of its host, which run theirs first too), then its remote peers in
// world-rank order, and with each peer the lower rank's sends to the higher first, then the
// higher's to the lower, each direction in the order of the calls (as NCCL matches them). Pairs
// taken in that order are a consistent global order of pairs, as in a pairwise exchange.
#include <cstring>
#include <map>
#include <string>

#include "comm/comm_impl.hpp"
#include "comm/host_partners.hpp"
#include "comm/pair_bootstrap.hpp"

namespace ferry {
namespace {

// The link with world rank `peer`, made now if it is the pair's first call (the peer makes its side
// in the matching call); refused inside a CUDA graph capture, which cannot allocate or connect.
Partners& linkTo(Comm::Impl& impl, int peer, cudaStream_t stream) {
  {
    const std::lock_guard lock(impl.peerLinksMu);
    auto it = impl.peerLinks.find(peer);
    if (it != impl.peerLinks.end()) return *it->second;
  }
  const int me = impl.world->rank();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FERRY_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(ErrorCode::InvalidUsage,
                "rank " + std::to_string(me) + ": send/recv with rank " + std::to_string(peer) +
                    ", on another host: the pair's first call makes their link (memory, connections), which "
                    "cannot happen inside a CUDA graph capture; make one call between them before capturing");
  auto pair = std::make_shared<PairBootstrap>(impl.world, peer);
  PartnersOptions options;
  options.worldRank = me;
  options.worldRanks = {pair->worldRank(0), pair->worldRank(1)};
  options.onFailure = impl.partnerFailed;
  // Two slots of a sixteenth of the Comm's scratch each (8 MiB by default): a link per remote peer
  // a rank talks to, and an all-to-all across 2 hosts of 8 ranks makes 8 of them.
  DeviceGuard scope(impl.device);
  auto link = std::make_unique<HostPartners>(pair, env().scratchBytes / 8, std::move(options));
  const std::lock_guard lock(impl.peerLinksMu);
  return *impl.peerLinks.emplace(peer, std::move(link)).first->second;
}

// What the two ends of exchange `index` (in the pair's order of this group) of `bytes` from world
// rank `from` compare (partner_exchange.hpp): a receiver that expects another size, or a call that
// is not a send on the other side, is an error on both sides, not a wrong result.
std::uint64_t digestOf(int from, std::uint64_t bytes, std::uint64_t index) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (const std::uint64_t v : {std::uint64_t{0x5e4d}, static_cast<std::uint64_t>(from), bytes, index}) {
    h ^= v;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct PeerIo {
  std::vector<const PeerCall*> sends, recvs;
};

}  // namespace

void runGroupAcrossHosts(Comm::Impl& impl, std::vector<PeerCall> calls) {
  const HostLayout& layout = impl.hostLayout;
  const int me = impl.world->rank(), host = layout.hostOf[static_cast<std::size_t>(me)];
  const cudaStream_t stream = calls.front().stream;  // (as on one host: the group's first call's)
  std::vector<PeerCall> local;
  std::map<int, PeerIo> remote;  // by world rank: the order below
  for (const PeerCall& c : calls) {
    if (layout.hostOf[static_cast<std::size_t>(c.peer)] == host) {
      PeerCall onHost = c;
      onHost.peer = layout.localOf[static_cast<std::size_t>(c.peer)];
      onHost.rank = impl.bootstrap->rank();
      onHost.worldSize = impl.bootstrap->size();
      local.push_back(onHost);
    } else {
      PeerIo& io = remote[c.peer];
      (c.isSend ? io.sends : io.recvs).push_back(&c);
    }
  }
  impl.forEachPartners([](Partners& p) {
    if (p.failed()) p.throwFailure();  // a partner or peer went away in an earlier call
  });
  if (!local.empty()) {
    const AcrossHostsPhase phase(impl);
    impl.pending = std::move(local);
    impl.runGroup();
  }
  for (const auto& [peer, io] : remote) {
    Partners& link = linkTo(impl, peer, stream);
    const std::uint32_t other = 1u << (1 - link.host());
    std::uint64_t index = 0;
    const auto oneWay = [&](const PeerCall& c, bool send) {
      PartnerExchange x;
      x.count = c.bytes();
      if (send) {
        x.src = static_cast<const char*>(c.buffer);
        x.sendTo = other;
      } else {
        x.dst = static_cast<char*>(const_cast<void*>(c.buffer));
        x.recvFrom = other;
      }
      x.digest = digestOf(send ? me : peer, x.count, index++);
      DeviceGuard scope(impl.device);
      impl.work->orderAfterLast(stream);
      link.exchange(x, DataType::Uint8, ReduceOp::Sum, stream);
      impl.work->note(stream);
    };
    const auto sends = [&] {
      for (const PeerCall* c : io.sends) oneWay(*c, true);
    };
    const auto recvs = [&] {
      for (const PeerCall* c : io.recvs) oneWay(*c, false);
    };
    // The lower rank's sends first: on this side they are sends if this rank is the lower one.
    if (me < peer) {
      sends();
      recvs();
    } else {
      recvs();
      sends();
    }
  }
}

}  // namespace ferry
