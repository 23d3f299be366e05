// A Comm whose ranks span hosts (FERRY_MULTI_HOST, experimental; docs/multi-node.md, "A Comm across
// hosts"). It is a Comm of this host's ranks (every NVLink algorithm, unchanged) and this rank's
// partners on the other hosts (HostPartners: Ethernet PortChannels, nothing mapped). A call runs in
// phases on the caller's stream, each a call of this host's Comm or partner exchanges
// (collectives/partner_exchange.hpp). These are the phases of the algorithm across_hosts; where the
// tuning table or a forced choice says so, allReduce, allGather and broadcast run as
// across_hosts_pipelined instead (across_hosts_algorithms.hpp; allReducePipelined,
// allGatherOverlapped and broadcastPipelined below). With H
// hosts of L ranks, rank (h, l) does:
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
// whose rounds are whole hosts in place). PreMulSum ops are refused alike on every rank; send and
// recv run in p2p_across_hosts.cpp.
// How such a Comm is made (the splits, the partners, the layout): across_hosts_setup.cpp.

#include <algorithm>

#include "comm/across_hosts_algorithms.hpp"
#include "comm/comm_impl.hpp"
#include "kernels/ranges.hpp"

namespace ferry {
namespace {

// The mask of every host but `me`.
std::uint32_t othersThan(int me, int hosts) { return ((1u << hosts) - 1u) & ~(1u << me); }

// One call across hosts: what every phase needs.
struct AcrossHosts {
  Comm::Impl& impl;
  CollectiveCall call;  // as the caller made it, in world ranks
  const HostLayout& layout;
  int host, local, hosts, perHost;
  std::size_t es;
  AcrossHostsAlgorithm algorithm;

  AcrossHosts(Comm::Impl& i, const CollectiveCall& c, AcrossHostsAlgorithm a)
      : impl(i), call(c), layout(i.hostLayout), host(i.partners->host()), local(i.bootstrap->rank()),
        hosts(i.partners->hosts()), perHost(i.bootstrap->size()), es(sizeOf(c.type)), algorithm(a) {}

  // The partners of column c (null: this rank does not carry it).
  Partners* partnersOf(int c) const {
    if (c == local) return impl.partners.get();
    auto it = impl.morePartners.find(c);
    return it == impl.morePartners.end() ? nullptr : it->second.get();
  }

  // A call of this host's Comm (its checks, its algorithms, its order on the stream).
  void onHost(Collective c, const void* send, void* recv, std::size_t count, ReduceOp op, int root = 0,
              bool unregistered = false) {
    CollectiveCall phase{c, send, recv, count, call.type, op, root, call.stream};
    phase.unregistered = unregistered;
    try {
      impl.run(phase);
    } catch (const Error& e) {
      // Its checks count this host's ranks; the caller knows the world's.
      throw Error(e.code(), "rank " + std::to_string(impl.world->rank()) + " (host " + std::to_string(host) +
                                "), in a phase on its host where it is rank " + std::to_string(local) + ": " +
                                e.detail());
    }
  }

  // Exchange `step` of this call among the partners of `column`, on the call's stream, or on
  // `side` (the side stream, which the caller orders itself: side_stream.hpp).
  void acrossPartners(PartnerExchange x, ReduceOp op, int column, int step = 0, cudaStream_t side = nullptr) {
    x.digest = digest(column, step, x.count);
    DeviceGuard scope(impl.device);
    if (side != nullptr) {
      partnersOf(column)->exchange(x, call.type, op, side);
      return;
    }
    impl.work->orderAfterLast(call.stream);
    partnersOf(column)->exchange(x, call.type, op, call.stream);
    impl.work->note(call.stream);  // destroying the Comm waits for it too (the partners' proxy goes then)
  }

  // What partners compare before an exchange (partner_exchange.hpp): the world call's shape, the
  // algorithm, the column, the exchange's step in it and its count, so that calls that differ
  // between hosts (whose ranks each agree among themselves) meet an error, not a wrong result.
  std::uint64_t digest(int column, int step, std::uint64_t count) const {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the fields
    for (const std::uint64_t v : {static_cast<std::uint64_t>(call.collective), static_cast<std::uint64_t>(call.count),
                                  static_cast<std::uint64_t>(call.type), static_cast<std::uint64_t>(call.op),
                                  static_cast<std::uint64_t>(call.root), static_cast<std::uint64_t>(algorithm),
                                  static_cast<std::uint64_t>(column), static_cast<std::uint64_t>(step), count}) {
      h ^= v;
      h *= 0x100000001b3ull;
    }
    return h;
  }

  // `bytes` of the Comm's device memory for the phases (grown outside a capture only).
  char* temp(std::uint64_t bytes) {
    CollectiveCall world = call;
    world.rank = impl.world->rank();
    DeviceGuard scope(impl.device);
    return static_cast<char*>(impl.acrossHostsScratch.reserve(bytes, world));
  }

  char* recv() const { return static_cast<char*>(call.recv); }
  const char* send() const { return static_cast<const char*>(call.send); }
  // Column c's part of a buffer of `count` elements.
  Range part(std::size_t count, int c) const {
    return splitRange(count, static_cast<std::uint64_t>(layout.columns), static_cast<std::uint64_t>(c), 1);
  }

  // Each column's part of recv[0, count) broadcast on this host from the rank that carries it.
  void broadcastParts(std::size_t count) {
    if (perHost == 1) return;
    for (int c = 0; c < layout.columns; ++c) {
      const Range p = part(count, c);
      if (p.size() == 0) continue;
      char* at = recv() + p.begin * es;
      onHost(Collective::Broadcast, at, at, p.size(), ReduceOp::Sum, layout.holder(host, c));
    }
  }

  // Runs `exchange(c)` for each column this rank carries, in column order.
  template <class Exchange>
  void everyColumn(Exchange&& exchange) {
    for (int c = 0; c < layout.columns; ++c)
      if (partnersOf(c) != nullptr) exchange(c);
  }

  // An exchange of column c's part of recv, in place (its masks and kind still to set).
  PartnerExchange columnOfRecv(int c) const {
    const Range mine = part(call.count, c);
    PartnerExchange x;
    x.dst = recv() + mine.begin * es;
    x.src = x.dst;
    x.count = mine.size();
    return x;
  }

  void allReduce() {
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

  // allReduce as across_hosts_pipelined (across_hosts_algorithms.hpp), in pieces: on the host, a
  // reduceScatter of piece k (local rank l gets part l of it, in its place in recv); across the
  // partners of column l, an allReduce of that part, on the side stream; on the host, an allGather
  // of the parts. The caller's stream runs reduceScatter k + 1 and allGather k - 1 while the side
  // stream runs exchange k:
  //   caller's:  RS0 RS1 [X0] AG0 RS2 [X1] AG1 RS3 ... [X(P-1)] AG(P-1)     ([Xk]: waits for it)
  //   side:          [RS0] X0 [RS1] X1 [RS2] X2 ...
  void allReducePipelined() {
    const ReduceOp op = call.op, onHostOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
    const AcrossHostsPieces cut = acrossHostsPieces(call.count, es, perHost, impl.acrossHostsPiece);
    const auto piece = [&](std::uint64_t k) {
      const std::uint64_t begin = k * cut.pieceCount;
      return Range{begin, std::min<std::uint64_t>(begin + cut.pieceCount, call.count)};
    };
    const auto partOf = [&](const Range& p) { return p.size() / static_cast<std::uint64_t>(perHost); };
    // This rank's part of piece p in recv (where an in-place reduceScatter of it leaves its sum).
    const auto mine = [&](const Range& p) {
      return recv() + (p.begin + static_cast<std::uint64_t>(local) * partOf(p)) * es;
    };
    const auto reduceScatter = [&](std::uint64_t k) {
      const Range p = piece(k);
      onHost(Collective::ReduceScatter, send() + p.begin * es, mine(p), partOf(p), onHostOp);
    };
    const auto exchange = [&](std::uint64_t k, cudaStream_t side) {
      const Range p = piece(k);
      PartnerExchange x;
      x.src = x.dst = mine(p);
      x.count = partOf(p);
      x.sendTo = x.recvFrom = othersThan(host, hosts);
      x.reduce = true;
      x.divisor = impl.world->size();
      acrossPartners(x, op, local, static_cast<int>(k), side);
    };
    const auto allGather = [&](std::uint64_t k) {
      const Range p = piece(k);
      onHost(Collective::AllGather, mine(p), recv() + p.begin * es, partOf(p), ReduceOp::Sum);
    };
    if (cut.pieces == 1) {
      reduceScatter(0);
      exchange(0, nullptr);
      allGather(0);
      return;
    }
    SideStream& side = *impl.acrossHostsSide;
    DeviceGuard scope(impl.device);
    const auto reduced = [](std::uint64_t k) { return static_cast<int>(2 * k); };
    const auto exchanged = [](std::uint64_t k) { return static_cast<int>(2 * k + 1); };
    bool forked = false;
    try {
      for (std::uint64_t k = 0; k < cut.pieces; ++k) {
        reduceScatter(k);
        side.record(reduced(k), call.stream);
        side.wait(side.stream(), reduced(k));
        forked = true;
        exchange(k, side.stream());
        side.record(exchanged(k), side.stream());
        if (k > 0) {
          side.wait(call.stream, exchanged(k - 1));
          allGather(k - 1);
        }
      }
      side.wait(call.stream, exchanged(cut.pieces - 1));
      allGather(cut.pieces - 1);
    } catch (...) {
      if (forked) side.join(call.stream);
      throw;
    }
  }

  // The chunk of world rank r in a buffer of one chunk a rank.
  std::uint64_t at(int r) const { return static_cast<std::uint64_t>(r) * call.count * es; }
  // Where `ranks` (world ranks, -1: none) are consecutive, all present: the first one's chunk in
  // `base`, where one call on this host reads or writes them all in place; null otherwise.
  template <class Byte>
  Byte* block(Byte* base, const std::vector<int>& ranks) const {
    for (std::size_t l = 0; l < ranks.size(); ++l)
      if (ranks[l] < 0 || ranks[l] != ranks[0] + static_cast<int>(l)) return nullptr;
    return base + at(ranks[0]);
  }
  // A copy on the call's stream, in order with the phases.
  void copy(void* to, const void* from, std::uint64_t bytes) {
    if (to == from || bytes == 0) return;
    DeviceGuard scope(impl.device);
    impl.work->orderAfterLast(call.stream);
    FERRY_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, call.stream));
    impl.work->note(call.stream);
  }
  // Chunk l of `from` to chunk ranks[l] of recv, for each rank present.
  void copyOut(const char* from, const std::vector<int>& ranks) {
    for (std::size_t l = 0; l < ranks.size(); ++l)
      if (ranks[l] >= 0) copy(recv() + at(ranks[l]), from + l * call.count * es, call.count * es);
  }
  // Temporary memory of the block collectives, reserved alike on every rank (a capture that cannot
  // grow it is refused on every rank): `chunks` chunks, and `columns` more for a round's own use.
  char* chunks(std::uint64_t count) {
    return temp((count + static_cast<std::uint64_t>(layout.columns)) * call.count * es);
  }
  char* roundOf(char* chunks, std::uint64_t count) const { return chunks + count * call.count * es; }

  // An allGather on this host of one chunk a rank, ranks[l]'s from local rank l (`mine`), into their
  // chunks of recv: in place there where they are one block, else through `round`.
  void gatherOnHost(const std::vector<int>& ranks, const char* mine, char* round) {
    char* inPlace = block(recv(), ranks);
    onHost(Collective::AllGather, mine, inPlace ? inPlace : round, call.count, ReduceOp::Sum);
    if (!inPlace) copyOut(round, ranks);
  }

  void allGather() {
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

  // allGather as across_hosts_pipelined (hosts of one size of 2 ranks or more, consecutive): this
  // rank's own chunk goes to its partners (from the caller's send buffer, which the gather on the
  // host only reads) on the side stream while the host gathers its ranks' chunks, so the network
  // and NVLink work at once; then the host gathers each other host's chunks from the ranks that
  // received them. The same exchange as phases', at another time.
  void allGatherOverlapped() {
    SideStream& side = *impl.acrossHostsSide;
    DeviceGuard scope(impl.device);
    impl.work->orderAfterLast(call.stream);  // (the side stream follows the Comm's previous call too)
    constexpr int kForked = 0, kExchanged = 1;
    PartnerExchange x;
    x.src = send();
    x.dst = recv();
    x.count = call.count;
    x.sendTo = othersThan(host, hosts);
    for (int h = 0; h < hosts; ++h) {
      if (h == host) continue;
      x.recvFrom |= 1u << h;
      x.dstOffset[h] = at(layout.worldRank(h, local));
    }
    side.record(kForked, call.stream);
    side.wait(side.stream(), kForked);
    try {
      acrossPartners(x, ReduceOp::Sum, local, 0, side.stream());
      side.record(kExchanged, side.stream());
      gatherOnHost(layout.round(host, 0, perHost), send(), nullptr);
    } catch (...) {
      side.join(call.stream);
      throw;
    }
    side.wait(call.stream, kExchanged);
    for (int h = 0; h < hosts; ++h)
      if (h != host) gatherOnHost(layout.round(h, 0, perHost), recv() + at(layout.worldRank(h, local)), nullptr);
  }

  // Round j of host h (column j * perHost + local of it, the one this rank carries) among all
  // hosts' rounds, as an offset in chunks: where reduceScatter keeps this host's partial sums of
  // it (one chunk) and allToAll what its ranks send to this host (perHost chunks).
  std::uint64_t slot(int h, int j) const {
    return static_cast<std::uint64_t>(layout.roundsBefore(h, perHost) + j) * call.count * es;
  }
  // Where rounds are whole hosts whose ranks are consecutive (decided alike on every rank), every
  // phase on the host runs in place in the caller's buffers: no round buffers are needed.
  bool direct() const { return layout.even && layout.contiguous; }

  void reduceScatter() {
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

  void allToAll() {
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

  void broadcast() {
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

  // broadcast as across_hosts_pipelined, in the allReduce's pieces and parts: on the root's host, a
  // broadcast of piece k from the root, then (side stream) part l of it to the partners, while the
  // host broadcasts piece k + 1; on every other host, part l of piece k from the root's host (side
  // stream), then an allGather of the parts, while part l of piece k + 1 arrives.
  void broadcastPipelined() {
    const int rootHost = layout.hostOf[call.root], rootLocal = layout.localOf[call.root];
    const bool root = host == rootHost;
    const AcrossHostsPieces cut = acrossHostsPieces(call.count, es, perHost, impl.acrossHostsPiece);
    const auto piece = [&](std::uint64_t k) {
      const std::uint64_t begin = k * cut.pieceCount;
      return Range{begin, std::min<std::uint64_t>(begin + cut.pieceCount, call.count)};
    };
    const auto partOf = [&](const Range& p) { return p.size() / static_cast<std::uint64_t>(perHost); };
    const auto mine = [&](const Range& p) {
      return recv() + (p.begin + static_cast<std::uint64_t>(local) * partOf(p)) * es;
    };
    const auto exchange = [&](std::uint64_t k, cudaStream_t side) {
      const Range p = piece(k);
      PartnerExchange x;
      x.src = x.dst = mine(p);
      x.count = partOf(p);
      if (root)
        x.sendTo = othersThan(host, hosts);
      else
        x.recvFrom = 1u << rootHost;
      acrossPartners(x, ReduceOp::Sum, local, static_cast<int>(k), side);
    };
    const auto onHostPiece = [&](std::uint64_t k) {
      const Range p = piece(k);
      if (root)  // (only the root has a send buffer)
        onHost(Collective::Broadcast, send() != nullptr ? send() + p.begin * es : nullptr, recv() + p.begin * es,
               p.size(), ReduceOp::Sum, rootLocal);
      else
        onHost(Collective::AllGather, mine(p), recv() + p.begin * es, partOf(p), ReduceOp::Sum);
    };
    if (cut.pieces == 1) {
      if (root) onHostPiece(0);
      exchange(0, nullptr);
      if (!root) onHostPiece(0);
      return;
    }
    SideStream& side = *impl.acrossHostsSide;
    DeviceGuard scope(impl.device);
    impl.work->orderAfterLast(call.stream);  // (the side stream follows the Comm's previous call too)
    const auto ready = [](std::uint64_t k) { return static_cast<int>(2 * k); };
    const auto exchanged = [](std::uint64_t k) { return static_cast<int>(2 * k + 1); };
    bool forked = false;
    try {
      if (!root) {  // (the parts arrive whatever this host's stream does meanwhile)
        side.record(ready(0), call.stream);
        side.wait(side.stream(), ready(0));
        forked = true;
      }
      for (std::uint64_t k = 0; k < cut.pieces; ++k) {
        if (root) {
          onHostPiece(k);
          side.record(ready(k), call.stream);
          side.wait(side.stream(), ready(k));
          forked = true;
        }
        exchange(k, side.stream());
        side.record(exchanged(k), side.stream());
        if (!root) {
          side.wait(call.stream, exchanged(k));
          onHostPiece(k);
        }
      }
      if (root) {
        side.wait(call.stream, exchanged(cut.pieces - 1));  // (its sends are the call's too)
        impl.work->note(call.stream);  // (so that destroying the Comm, or a call on another stream, waits for them)
      }
    } catch (...) {
      if (forked) {
        side.join(call.stream);
        impl.work->note(call.stream);
      }
      throw;
    }
  }

  void reduce() {
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
    PartnerExchange x;
    x.src = sums;
    x.dst = sums;
    x.count = call.count;
    if (host == rootHost)
      x.recvFrom = othersThan(host, hosts);
    else
      x.sendTo = 1u << rootHost;
    x.reduce = true;
    x.divisor = impl.world->size();
    acrossPartners(x, op, column);
  }
};

}  // namespace

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
