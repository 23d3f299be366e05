// A Comm whose ranks span hosts (FERRY_MULTI_HOST, experimental; docs/multi-node.md, "A Comm across
// hosts"). It is a Comm of this host's ranks (every NVLink algorithm, unchanged) and this rank's
// partners on the other hosts (HostPartners: Ethernet PortChannels, nothing mapped). A call runs in
// phases on the caller's stream, each a call of this host's Comm or partner exchanges
// (collectives/partner_exchange.hpp). These are the phases of the algorithm across_hosts; where the
// tuning table or a forced choice says so, a collective runs as across_hosts_pipelined instead
// (across_hosts_algorithms.hpp; comm_across_hosts_pipelined.cpp).
// With H hosts of L ranks, rank (h, l) does:
//   allReduce      on the host, the whole buffer (op, or sum for an average); across the partners,
//                  part l of it, in host order (the average divides there, by the world's ranks);
//                  on the host, each part broadcast from the rank that holds it.
//   allGather      on the host, its ranks' chunks; across the partners, this rank's own chunk to
//                  theirs; on the host, each other host's chunks from the ranks that received them.
//   reduceScatter  on the host, each host's chunks reduced and scattered (into a temporary);
//                  across the partners, host h's partial sum of its chunk l to it, in host order.
//   allToAll       across the partners, what this rank sends to host h's ranks to partner h (into a
//                  temporary); on the host, this host's chunks and each temporary exchanged.
//   broadcast      on the root's host, from the root; across the partners, part l from the root's
//                  host; on every other host, each part broadcast from the rank that received it.
//   reduce         on each host, to the root's local rank; across that column of partners, into the
//                  root, in host order.
// Every rank that ends with a reduced value ends with the same bits: a host's phase gives its
// ranks the same sums, and the partners add the hosts' in one order.
//
// Hosts of different sizes, or whose ranks are not consecutive world ranks, run every collective
// too. The cross-host part is cut into HostLayout's columns, a rank of a smaller host carrying
// several (one partner group each, taken in column order, so no two ranks wait for each other in
// a circle). A phase on the host takes another host's ranks in rounds of this host's size, local
// rank l taking the l-th of a round; where a round's chunks are not one block of the caller's
// buffer, it runs in a temporary and copies them (more copies and calls than the even layout,
// whose rounds are whole hosts in place). PreMulSum ops scale each rank's input first and run as
// sums (Comm::Impl::runPreMulAcrossHosts); send and recv run in p2p_across_hosts.cpp.
// How such a Comm is made (the splits, the partners, the layout): across_hosts_setup.cpp.

#include "comm/across_hosts_call.hpp"

namespace ferry {

void AcrossHosts::allReduce() {
  if (algorithm == AcrossHostsAlgorithm::Pipelined) return allReducePipelined();
  const ReduceOp op = call.op;
  onHost(Collective::AllReduce, call.send, call.recv, call.count, op == ReduceOp::Avg ? ReduceOp::Sum : op);
  everyColumn([&](int c) {
    PartnerExchange x = columnOfRecv(c);
    x.sendTo = x.recvFrom = othersThan(host, hosts);
    x.reduce = true;
    x.divisor = impl.world->size();
    acrossPartners(x, op, c);
  });
  broadcastParts(call.count);
}

void AcrossHosts::allGather() {
  if (algorithm == AcrossHostsAlgorithm::Pipelined) return allGatherOverlapped();
  // A stand-in for a rank past a host's last, then a round's chunks (unless direct()).
  char* tmp = direct() ? nullptr : chunks(1);
  char* standIn = tmp;
  char* round = tmp ? roundOf(tmp, 1) : nullptr;
  // On the host, its ranks' chunks into theirs in recv.
  gatherOnHost(layout.round(host, 0, perHost), send(), round);
  // Across the partners of column c: its chunk of this host's to every other host, theirs here.
  everyColumn([&](int c) {
    PartnerExchange x;
    x.src = recv();
    x.dst = recv();
    x.count = call.count;
    for (int h = 0; h < hosts; ++h) {
      if (c < perHost) x.srcOffset[h] = at(layout.worldRank(host, c));
      if (h == host || layout.sizeOf[h] <= c) continue;
      x.recvFrom |= 1u << h;
      x.dstOffset[h] = at(layout.worldRank(h, c));
    }
    if (c < perHost) x.sendTo = othersThan(host, hosts);
    acrossPartners(x, ReduceOp::Sum, c);
  });
  // On the host, the other hosts' chunks from the ranks that received them.
  if (perHost == 1) return;
  for (int h = 0; h < hosts; ++h) {
    if (h == host) continue;
    for (int j = 0; j < layout.rounds(h, perHost); ++j) {
      const std::vector<int> ranks = layout.round(h, j, perHost);
      const int mine = ranks[static_cast<std::size_t>(local)];
      gatherOnHost(ranks, mine >= 0 ? recv() + at(mine) : standIn, round);
    }
  }
}

void AcrossHosts::reduceScatter() {
  if (algorithm == AcrossHostsAlgorithm::Pipelined) return reduceScatterPipelined();
  const auto slots = static_cast<std::uint64_t>(layout.mostRounds());
  char* partials = direct() ? temp(slots * call.count * es) : chunks(slots);
  char* round = direct() ? nullptr : roundOf(partials, slots);
  const ReduceOp op = call.op;
  // On the host, each host's chunks reduced and scattered, a round at a time: local rank l gets the
  // host's sum of the l-th (the column it carries).
  for (int h = 0; h < hosts; ++h) {
    for (int j = 0; j < layout.rounds(h, perHost); ++j) {
      const std::vector<int> ranks = layout.round(h, j, perHost);
      const char* in = block(send(), ranks);
      if (!in) {
        for (std::size_t l = 0; l < ranks.size(); ++l)
          if (ranks[l] >= 0) copy(round + l * call.count * es, send() + at(ranks[l]), call.count * es);
        in = round;
      }
      onHost(Collective::ReduceScatter, in, partials + slot(h, j), call.count,
             op == ReduceOp::Avg ? ReduceOp::Sum : op);
    }
  }
  // Across the partners of column c: host h's partial sum of its chunk c to it, reduced in host order
  // where this host has a chunk c.
  everyColumn([&](int c) {
    PartnerExchange x;
    x.src = partials;
    x.dst = recv();
    x.count = call.count;
    for (int h = 0; h < hosts; ++h) {
      if (layout.sizeOf[h] <= c) continue;
      x.srcOffset[h] = slot(h, c / perHost);
      if (h != host) x.sendTo |= 1u << h;
    }
    if (c < perHost) x.recvFrom = othersThan(host, hosts);
    x.reduce = true;
    x.divisor = impl.world->size();
    acrossPartners(x, op, c);
  });
}

void AcrossHosts::allToAll() {
  if (algorithm == AcrossHostsAlgorithm::Pipelined) return allToAllOverlapped();
  const std::uint64_t chunk = call.count * es;
  // What a rank receives across the partners: for each host h and round j, the chunks that rank
  // (h, j * perHost + l) sends to each rank of this host, on local rank l.
  const auto slots = static_cast<std::uint64_t>(layout.mostRoundChunks());
  const std::uint64_t rounds = direct() ? 0 : 2 * static_cast<std::uint64_t>(layout.columns);
  char* received = temp((slots + rounds) * chunk);
  char* in = received + slots * chunk, *out = in + static_cast<std::uint64_t>(layout.columns) * chunk;
  auto from = [&](int h, int j) { return received + slot(h, j) * static_cast<std::uint64_t>(perHost); };
  // Across the partners of column c: what this host's rank c sends to rank k of each other host,
  // and what rank c of each other host sends to rank k of this one. Partners must make the same
  // exchanges (a count each): one a k, or with hosts of one size whose ranks are consecutive,
  // every k in one (the chunks for a host follow each other in send and in `received`).
  const bool oneRun = direct();
  everyColumn([&](int c) {
    for (int k = 0; k < layout.columns; k += oneRun ? layout.columns : 1) {
      PartnerExchange x;
      x.src = send();
      x.dst = received;
      x.count = call.count * static_cast<std::size_t>(oneRun ? layout.columns : 1);
      for (int h = 0; h < hosts; ++h) {
        if (h == host) continue;
        if (c < perHost && k < layout.sizeOf[h]) {
          x.sendTo |= 1u << h;
          x.srcOffset[h] = at(layout.worldRank(h, k));
        }
        if (k < perHost && c < layout.sizeOf[h]) {
          x.recvFrom |= 1u << h;
          x.dstOffset[h] = static_cast<std::uint64_t>(from(h, c / perHost) - received) +
                           static_cast<std::uint64_t>(k) * chunk;
        }
      }
      acrossPartners(x, ReduceOp::Sum, c, k);
    }
  });
  // On the host: its own ranks' chunks for each other, then each other host's.
  const std::vector<int> mine = layout.round(host, 0, perHost);
  if (const char* ours = block(send(), mine)) {
    onHost(Collective::AllToAll, ours, block(recv(), mine), call.count, ReduceOp::Sum);
  } else {
    for (int k = 0; k < perHost; ++k)
      copy(in + static_cast<std::uint64_t>(k) * chunk, send() + at(mine[static_cast<std::size_t>(k)]), chunk);
    onHost(Collective::AllToAll, in, out, call.count, ReduceOp::Sum);
    copyOut(out, mine);
  }
  for (int h = 0; h < hosts; ++h) {
    if (h == host) continue;
    for (int j = 0; j < layout.rounds(h, perHost); ++j) {
      const std::vector<int> ranks = layout.round(h, j, perHost);
      char* inPlace = block(recv(), ranks);
      onHost(Collective::AllToAll, from(h, j), inPlace ? inPlace : out, call.count, ReduceOp::Sum);
      if (!inPlace) copyOut(out, ranks);
    }
  }
}

void AcrossHosts::broadcast() {
  if (algorithm == AcrossHostsAlgorithm::Pipelined) return broadcastPipelined();
  const int rootHost = layout.hostOf[call.root], rootLocal = layout.localOf[call.root];
  if (host == rootHost) onHost(Collective::Broadcast, call.send, call.recv, call.count, ReduceOp::Sum, rootLocal);
  everyColumn([&](int c) {
    PartnerExchange x = columnOfRecv(c);
    if (host == rootHost)
      x.sendTo = othersThan(host, hosts);
    else
      x.recvFrom = 1u << rootHost;
    acrossPartners(x, ReduceOp::Sum, c);
  });
  if (host != rootHost) broadcastParts(call.count);
}

void AcrossHosts::reduce() {
  if (algorithm == AcrossHostsAlgorithm::Pipelined) return reducePipelined();
  const int rootHost = layout.hostOf[call.root], rootLocal = layout.localOf[call.root];
  const bool root = impl.world->rank() == call.root;
  const ReduceOp op = call.op;
  // The sums go along the root's column (its local index): on each host, to the rank carrying it.
  const int column = rootLocal, carrier = layout.holder(host, column);
  // Only the root's recv is the caller's to fill: the other carriers' partial sums go to the
  // Comm's memory (unregistered, so on their hosts every rank runs the reduce as unregistered,
  // alike); the other ranks have none.
  // (Every rank reserves it, so that a capture that cannot grow it is refused on every rank alike.)
  char* partial = temp(call.count * es);
  char* sums = root ? recv() : local == carrier ? partial : nullptr;
  onHost(Collective::Reduce, call.send, sums, call.count, op == ReduceOp::Avg ? ReduceOp::Sum : op, carrier,
         /*unregistered=*/host != rootHost);
  if (local != carrier) return;
  acrossPartners(towardRoot(sums, call.count, rootHost), op, column);
}

void runAcrossHosts(Comm::Impl& impl, CollectiveCall call) {
  impl.checkNotAborted("collective call");
  impl.forEachPartners([](Partners& p) {
    if (p.failed()) p.throwFailure();  // a partner went away in an earlier call
  });
  // The whole call is checked in world ranks first (root, in place, the buffers' sizes), so that a
  // bad argument is named as the caller made it, before any phase runs.
  CollectiveCall world = call;
  world.rank = impl.world->rank();
  world.worldSize = impl.world->size();
  validateCall(world, impl.device);
  if (call.count == 0) return;
  // Its phases sum partial sums, each rounded to the type: no element's terms meet in one place.
  if (call.sumsInFloat32())
    throw Error(ErrorCode::InvalidUsage, describe(world) +
                                             ": float32 accumulation (Accumulation::Float32) runs on the ranks of "
                                             "one host only, and this Comm spans hosts (call it with "
                                             "Accumulation::Stepwise)");
  const AcrossHostsPhase phase(impl);
  AcrossHosts run(impl, world,
                  selectAcrossHosts(impl.selector.rows(), impl.selector.forcedAcrossHosts(call.collective), world,
                                    impl.hostLayout, world.rank));
  switch (call.collective) {
    case Collective::AllReduce: return run.allReduce();
    case Collective::AllGather: return run.allGather();
    case Collective::ReduceScatter: return run.reduceScatter();
    case Collective::AllToAll: return run.allToAll();
    case Collective::Broadcast: return run.broadcast();
    case Collective::Reduce: return run.reduce();
  }
  impl.refuseAcrossHosts(std::string(toString(call.collective)));
}

}  // namespace ferry
