// How a Comm across hosts is made (comm_across_hosts.cpp runs its calls; docs/multi-node.md, "A Comm
// across hosts"): where every rank lives (HostLayout), the bootstrap split into this host's ranks and
// each column's partners, the network that carries the partners (ferry's connections or NCCL's),
// and what the pipelined algorithms need (the pieces' size every rank agrees on, the side stream).
#include <algorithm>
#include <map>

#include "comm/across_hosts_algorithms.hpp"
#include "comm/comm_impl.hpp"
#include "comm/host_partners.hpp"
#include "comm/nccl_partners.hpp"
#include "comm/partner_net.hpp"
#include "comm/sized_partners.hpp"
#include "platform/ibverbs_api.hpp"
#include "platform/nccl_net.hpp"

namespace ferry {
namespace {

HostLayout gatherLayout(Bootstrap& world) {
  struct Place {
    int host, local;
  };
  std::vector<Place> places(static_cast<std::size_t>(world.size()));
  places[static_cast<std::size_t>(world.rank())] = {world.node(), world.localRank()};
  world.allGather(places.data(), sizeof(Place));
  std::vector<int> host, rank;
  for (const Place& p : places) {
    host.push_back(p.host);
    rank.push_back(p.local);
  }
  return HostLayout(std::move(host), std::move(rank), world.numNodes());
}

// What carries the cross-host phase: every rank's wish gathered, then decided alike (partner_net.hpp).
PartnerNet partnerNet(Bootstrap& world) {
  std::vector<PartnerNetWish> wishes(static_cast<std::size_t>(world.size()));
  PartnerNetWish& mine = wishes[static_cast<std::size_t>(world.rank())];
  mine.setting = env().partnerNet[0];
  std::string why = "no InfiniBand or RoCE device";
  if (mine.setting == 'n' || mine.setting == 's' || (mine.setting == 'a' && !ibverbs::listDevices().names.empty()))
    mine.canNccl = nccl_net::library(why) ? 1 : 0;
  world.allGather(wishes.data(), sizeof(PartnerNetWish));
  if (everyRankNeedsNccl(wishes)) {  // (every rank sees the same table, so every rank makes this round)
    if (mine.setting == 'a' && mine.canNccl == 0) mine.canNccl = nccl_net::library(why) ? 1 : 0;
    world.allGather(wishes.data(), sizeof(PartnerNetWish));
  }
  const PartnerNet net = decidePartnerNet(wishes, world.rank(), why);
  if (net == PartnerNet::Ferry && mine.setting == 'a' && world.rank() == 0)
    FERRY_LOG(Info, Collectives) << "Comm across hosts: the cross-host phase on ferry's Ethernet connections "
                                 << "(FERRY_PARTNER_NET=auto: NCCL's network needs InfiniBand or RoCE and NCCL on "
                                 << "every rank; rank 0: " << (mine.canNccl ? "has both" : why) << ")";
  return net;
}

// The largest part an exchange sends on NCCL's network with FERRY_PARTNER_NET=sized: the largest
// any rank asked for, so that every partner picks the same network for every exchange.
std::uint64_t agreedNcclBytes(Bootstrap& world) {
  std::vector<std::uint64_t> asked(static_cast<std::size_t>(world.size()));
  asked[static_cast<std::size_t>(world.rank())] = env().partnerNcclBytes;
  world.allGather(asked.data(), sizeof(std::uint64_t));
  return *std::max_element(asked.begin(), asked.end());
}

const char* describe(PartnerNet net) {
  switch (net) {
    case PartnerNet::Nccl: return "NCCL's network";
    case PartnerNet::Sized: return "NCCL's network (small parts) and ferry's Ethernet connections (large ones)";
    default: return "ferry's Ethernet connections";
  }
}

}  // namespace

std::unique_ptr<Comm::Impl> makeCommImpl(std::shared_ptr<Bootstrap> b, const CommOptions& options) {
  if (!b || b->numNodes() <= 1) return std::make_unique<Comm::Impl>(std::move(b), options);
  b = checkedBootstrap(std::move(b));  // FERRY_MULTI_HOST, a TcpBootstrap, the limits (Comm::whyNot)
  auto tcp = std::dynamic_pointer_cast<TcpBootstrap>(b);
  // Every rank decides alike from the same table.
  HostLayout layout = gatherLayout(*b);
  // (Here, not in Comm::whyNot, which must answer alike on every rank from what the rank sees.)
  for (int h = 0; h < layout.hosts; ++h)
    if (layout.sizeOf[h] > kMaxRanks)
      throw Error(ErrorCode::NotSupported, "rank " + std::to_string(b->rank()) +
                                               ": Comm across hosts: host " + std::to_string(h) + " has " +
                                               std::to_string(layout.sizeOf[h]) + " ranks; at most " +
                                               std::to_string(kMaxRanks) + " a host are supported");
  // Every split on every rank, in the same order (TcpBootstrap::split is collective): this host's
  // ranks, then the partners of each column (hosts of one size: one split, column = local rank).
  const int me = b->localRank(), node = b->node();
  std::shared_ptr<TcpBootstrap> local = tcp->split(node, b->rank());
  if (local->rank() != me)
    throw Error(ErrorCode::InternalError, "rank " + std::to_string(b->rank()) +
                                              ": Comm across hosts: local rank " + std::to_string(me) +
                                              " became rank " + std::to_string(local->rank()) +
                                              " of its host's bootstrap");
  std::map<int, std::shared_ptr<TcpBootstrap>> columns;
  if (layout.even) {
    columns[me] = tcp->split(me, node);
  } else {
    for (int c = 0; c < layout.columns; ++c)
      if (auto group = tcp->split(layout.holder(node, c) == me ? c : -1, node)) columns[c] = std::move(group);
  }
  auto impl = std::make_unique<Comm::Impl>(local, options);
  impl->world = b;
  impl->work->setRank(b->rank());
  impl->hostLayout = layout;
  // The pipelined allReduce's pieces, cut alike on every rank: the largest any rank asked for.
  std::vector<std::uint64_t> pieces(static_cast<std::size_t>(b->size()));
  pieces[static_cast<std::size_t>(b->rank())] = env().acrossHostsPiece;
  b->allGather(pieces.data(), sizeof(std::uint64_t));
  impl->acrossHostsPiece = *std::max_element(pieces.begin(), pieces.end());
  if (layout.even && layout.contiguous && layout.columns > 1) {
    DeviceGuard scope(impl->device);
    impl->acrossHostsSide = std::make_unique<SideStream>(static_cast<int>(2 * kMaxAcrossHostsPieces));
  }
  {
    // The PreMulSum scaling kernel loaded now, also where a host of one rank loaded no collective
    // kernels: a first launch queued behind a partner exchange that waits would wait for it.
    DeviceGuard scope(impl->device);
    preloadPreMul();
  }
  // A partner gone mid-call ends this host's calls too: its other ranks may be waiting for this one
  // in a phase on the host (Comm::abort's way, from the partners' proxy or watchdog thread; destroyed
  // before resources).
  impl->partnerFailed = [raw = impl.get()] {
    if (!raw->resources) return;
    try {
      DeviceGuard scope(raw->device);
      RelaxedCapture relaxed;  // (another thread may be capturing a graph, as for Comm::abort)
      raiseAbort(raw->resources->context(), raw->control);
    } catch (const std::exception& e) {
      FERRY_LOG(Error, Collectives) << "Comm across hosts: ending this host's calls after a partner failed: "
                                    << e.what();
    }
  };
  const std::function<void()>& onFailure = impl->partnerFailed;
  const PartnerNet net = partnerNet(*b);
  const std::uint64_t ncclBytes = net == PartnerNet::Sized ? agreedNcclBytes(*b) : 0;
  // Partners must agree on their slots (a put lands at its sender's slot): every rank sizes them for
  // the most columns any rank carries, which every rank computes alike.
  for (auto& [c, group] : columns) {
    PartnersOptions po;
    po.worldRank = b->rank();
    for (int h = 0; h < layout.hosts; ++h) po.worldRanks.push_back(layout.worldRank(h, layout.holder(h, c)));
    po.onFailure = onFailure;
    // The partners' slots take half as much device memory as the Comm's own scratch, over the
    // columns a rank carries at most (and over the two networks where both run).
    const std::uint64_t scratch = env().scratchBytes / 2 / static_cast<std::uint64_t>(layout.mostCarried);
    std::unique_ptr<Partners> partners;
    if (net == PartnerNet::Nccl) {
      partners = std::make_unique<NcclPartners>(group, scratch, std::move(po));
    } else if (net == PartnerNet::Ferry) {
      partners = std::make_unique<HostPartners>(group, scratch, std::move(po));
    } else {
      // NCCL's slots hold parts of up to ncclBytes (at least 16 bytes, at most half the memory):
      // the rest goes to ferry's.
      const std::uint64_t perHost = std::max<std::uint64_t>(16, std::min(ncclBytes, scratch / 2));
      const std::uint64_t small = std::min(scratch / 2, perHost * static_cast<std::uint64_t>(layout.hosts));
      auto viaNccl = std::make_unique<NcclPartners>(group, small, po);
      partners = std::make_unique<SizedPartners>(
          std::move(viaNccl), std::make_unique<HostPartners>(group, scratch - small, std::move(po)), ncclBytes);
    }
    if (c == me)
      impl->partners = std::move(partners);
    else
      impl->morePartners[c] = std::move(partners);
  }
  FERRY_LOG(Info, Collectives) << "Comm across hosts: rank " << b->rank() << " is rank " << me << " of "
                                << local->size() << " on host " << node << " of " << b->numNodes() << ", carrying "
                                << columns.size() << " of " << layout.columns << " columns"
                                << (layout.contiguous ? "" : " (hosts' ranks not consecutive)") << ", on "
                                << describe(net);
  return impl;
}

}  // namespace ferry
