// send and recv of a Comm across hosts (docs/multi-node.md, "send and recv across hosts"). A group's
// calls with peers on this host run as a group of this host's Comm (its send/recv kernel, local
// ranks); each peer on another host has a link of its own, HostPartners over a PairBootstrap (two
// "hosts": the pair), made at the pair's first matched call, and each send or recv with it is one
// one-way exchange of bytes through the link's slots (collectives/partner_exchange.hpp).
//
// A link's sends and its recvs run on two streams of its own, forked from the caller's at the
// group and joined back at its end, while the host's part runs on the caller's: every part of a
// group goes on at once, as NCCL's do, so a send waits only for the peer's matching recv and a recv
// for the peer's matching send, whatever groups either side puts them in. The ends compare the
// sender, the receiver and the bytes (not a running number, which a CUDA graph would freeze): a recv
// of another size is an error on both sides, not a short or torn message.
#include <cstring>
#include <map>
#include <string>

#include "collectives/p2p_group.hpp"
#include "comm/comm_impl.hpp"
#include "comm/host_partners.hpp"
#include "comm/pair_bootstrap.hpp"
#include "core/host_id.hpp"

namespace ferry {
namespace {

// The link with world rank `peer`, made now if it is the pair's first call (the peer makes its side
// in its matching call); refused inside a CUDA graph capture, which cannot allocate or connect.
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
  impl.peerLinkStates[peer].sends = std::make_unique<SideStream>(1);
  impl.peerLinkStates[peer].recvs = std::make_unique<SideStream>(1);
  Partners& made = *link;
  const std::lock_guard lock(impl.peerLinksMu);
  impl.peerLinks.emplace(peer, std::move(link));
  return made;
}

// What the two ends of an exchange of `bytes` from world rank `from` to `to` compare
// (partner_exchange.hpp).
std::uint64_t digestOf(int from, int to, std::uint64_t bytes) {
  return fnv1a({std::uint64_t{0x5e4d}, static_cast<std::uint64_t>(from), static_cast<std::uint64_t>(to), bytes});
}

struct PeerIo {
  std::vector<const PeerCall*> sends, recvs;
};

}  // namespace

void runGroupAcrossHosts(Comm::Impl& impl, std::vector<PeerCall> calls) {
  const HostLayout& layout = impl.hostLayout;
  const int me = impl.world->rank(), host = layout.hostOf[static_cast<std::size_t>(me)];
  impl.checkNotAborted("send/recv");
  // One stream for the whole group, as on one host (p2p_group.cpp).
  const cudaStream_t stream = calls.front().stream;
  for (const PeerCall& c : calls)
    if (c.stream != stream)
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(me) + ": a group's " +
                                               (c.isSend ? "send to" : "recv from") + " rank " +
                                               std::to_string(c.peer) +
                                               " is on another stream than its first call; give a group one stream");
  std::vector<PeerCall> local;
  std::map<int, PeerIo> remote;  // by world rank
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
  // The host's part is checked before anything is queued (its kernel's plan), and every link is
  // made, in world-rank order (each with its peer, which makes them in the same order): an error
  // leaves nothing of the group queued.
  if (!local.empty())
    (void)planP2PGroup(local, impl.p2p ? impl.p2pLaunch.residentBlocks : 1, impl.p2pLaunch.maxBlocks);
  std::map<int, Partners*> links;
  for (const auto& [peer, io] : remote) links[peer] = &linkTo(impl, peer, stream);
  DeviceGuard scope(impl.device);
  impl.work->orderAfterLast(stream);
  // Each link's sends (side 0) and recvs (side 1) fork from the caller's stream before anything of
  // this group is on it.
  std::vector<SideStream*> forked;
  try {
    for (const auto& [peer, io] : remote) {
      Comm::Impl::PeerLinkState& state = impl.peerLinkStates[peer];
      for (SideStream* side : {state.sends.get(), state.recvs.get()}) {
        side->record(0, stream);
        side->wait(side->stream(), 0);
        forked.push_back(side);
      }
    }
    for (const auto& [peer, io] : remote) {
      Comm::Impl::PeerLinkState& state = impl.peerLinkStates[peer];
      Partners& link = *links[peer];
      for (const PeerCall* c : io.sends) {
        PartnerExchange x;
        x.count = c->bytes();
        x.src = static_cast<const char*>(c->buffer);
        x.sendTo = 1u << (1 - link.host());
        x.digest = digestOf(me, peer, x.count);
        link.exchange(x, DataType::Uint8, ReduceOp::Sum, state.sends->stream());
      }
      for (const PeerCall* c : io.recvs) {
        PartnerExchange x;
        x.count = c->bytes();
        x.dst = static_cast<char*>(const_cast<void*>(c->buffer));
        x.recvFrom = 1u << (1 - link.host());
        x.digest = digestOf(peer, me, x.count);
        link.exchange(x, DataType::Uint8, ReduceOp::Sum, state.recvs->stream());
      }
    }
    if (!local.empty()) {
      const AcrossHostsPhase phase(impl);
      impl.pending = std::move(local);
      impl.runGroup();
    }
  } catch (...) {
    for (SideStream* side : forked) side->join(stream);
    impl.work->note(stream);
    throw;
  }
  // The group ends when every part of it has.
  for (SideStream* side : forked) {
    side->record(0, side->stream());
    side->wait(stream, 0);
  }
  impl.work->note(stream);
}

}  // namespace ferry
