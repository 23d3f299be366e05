// The across_hosts_pipelined forms of the collectives of a Comm across hosts (across_hosts_algorithms.hpp
// says where each runs; docs/multi-node.md, "Algorithms across hosts", how they overlap).
#include "comm/across_hosts_call.hpp"

namespace ferry {

// allReduce as across_hosts_pipelined (across_hosts_algorithms.hpp), in pieces: on the host, a
// reduceScatter of piece k (local rank l gets part l of it, in its place in recv); across the
// partners of column l, an allReduce of that part, on the side stream; on the host, an allGather
// of the parts. The caller's stream runs reduceScatter k + 1 and allGather k - 1 while the side
// stream runs exchange k:
//   caller's:  RS0 RS1 [X0] AG0 RS2 [X1] AG1 RS3 ... [X(P-1)] AG(P-1)     ([Xk]: waits for it)
//   side:          [RS0] X0 [RS1] X1 [RS2] X2 ...
void AcrossHosts::allReducePipelined() {
  const ReduceOp op = call.op, onHostOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const AcrossHostsPieces cut = acrossHostsPieces(call.count, es, perHost, impl.acrossHostsPiece);
  const auto piece = [&](std::uint64_t k) { return pieceOf(cut, k); };
  // This rank's part of piece p in recv (where an in-place reduceScatter of it leaves its sum).
  const auto mine = [&](const Range& p) { return partInRecv(p); };
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
      forkSide(reduced(k));
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
    if (forked) joinSideOnError();
    throw;
  }
}

// allGather as across_hosts_pipelined (hosts of one size of 2 ranks or more, consecutive): this
// rank's own chunk goes to its partners (from the caller's send buffer, which the gather on the
// host only reads) on the side stream while the host gathers its ranks' chunks, so the network
// and NVLink work at once; then the host gathers each other host's chunks from the ranks that
// received them. The same exchange as phases', at another time.
void AcrossHosts::allGatherOverlapped() {
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
  forkSide(kForked);
  try {
    acrossPartners(x, ReduceOp::Sum, local, 0, side.stream());
    side.record(kExchanged, side.stream());
    gatherOnHost(layout.round(host, 0, perHost), send(), nullptr);
  } catch (...) {
    joinSideOnError();
    throw;
  }
  side.wait(call.stream, kExchanged);
  for (int h = 0; h < hosts; ++h)
    if (h != host) gatherOnHost(layout.round(h, 0, perHost), recv() + at(layout.worldRank(h, local)), nullptr);
}

// allToAll as across_hosts_pipelined (hosts of one size of 2 ranks or more, consecutive): the
// exchange needs nothing of the host's phases (this rank sends partner h, from the caller's send
// buffer, the chunks for host h's ranks, and receives what partner h sends this host's ranks), so
// it runs on the side stream while the host exchanges its own ranks' chunks; then the host
// exchanges what each other host sent. Phases' exchange and host calls, with the first two at once.
// In place too: the exchange reads the other hosts' blocks of the buffer, the host's first
// allToAll reads and writes its own host's block.
void AcrossHosts::allToAllOverlapped() {
  const std::uint64_t chunk = call.count * es, L = static_cast<std::uint64_t>(perHost);
  // What partner h sends this host's ranks, at h * L chunks (this host's block unused), reserved
  // before anything is queued.
  char* received = temp(static_cast<std::uint64_t>(hosts) * L * chunk);
  const auto from = [&](int h) { return received + static_cast<std::uint64_t>(h) * L * chunk; };
  PartnerExchange x;
  x.src = send();
  x.dst = received;
  x.count = call.count * L;
  x.sendTo = x.recvFrom = othersThan(host, hosts);
  for (int h = 0; h < hosts; ++h) {
    if (h == host) continue;
    x.srcOffset[h] = at(layout.worldRank(h, 0));
    x.dstOffset[h] = static_cast<std::uint64_t>(from(h) - received);
  }
  SideStream& side = *impl.acrossHostsSide;
  DeviceGuard scope(impl.device);
  impl.work->orderAfterLast(call.stream);  // (the side stream follows the Comm's previous call too)
  constexpr int kForked = 0, kExchanged = 1;
  forkSide(kForked);
  try {
    acrossPartners(x, ReduceOp::Sum, local, 0, side.stream());
    side.record(kExchanged, side.stream());
    const std::vector<int> mine = layout.round(host, 0, perHost);
    onHost(Collective::AllToAll, block(send(), mine), block(recv(), mine), call.count, ReduceOp::Sum);
  } catch (...) {
    joinSideOnError();
    throw;
  }
  side.wait(call.stream, kExchanged);
  for (int h = 0; h < hosts; ++h)
    if (h != host)
      onHost(Collective::AllToAll, from(h), block(recv(), layout.round(h, 0, perHost)), call.count, ReduceOp::Sum);
}

// broadcast as across_hosts_pipelined, in the allReduce's pieces and parts: on the root's host, a
// broadcast of piece k from the root, then (side stream) part l of it to the partners, while the
// host broadcasts piece k + 1; on every other host, part l of piece k from the root's host (side
// stream), then an allGather of the parts, while part l of piece k + 1 arrives.
void AcrossHosts::broadcastPipelined() {
  const int rootHost = layout.hostOf[call.root], rootLocal = layout.localOf[call.root];
  const bool root = host == rootHost;
  const AcrossHostsPieces cut = acrossHostsPieces(call.count, es, perHost, impl.acrossHostsPiece);
  const auto piece = [&](std::uint64_t k) { return pieceOf(cut, k); };
  const auto mine = [&](const Range& p) { return partInRecv(p); };
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
      forkSide(ready(0));
      forked = true;
    }
    for (std::uint64_t k = 0; k < cut.pieces; ++k) {
      if (root) {
        onHostPiece(k);
        forkSide(ready(k));
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
    if (forked) joinSideOnError();
    throw;
  }
}

// reduceScatter as across_hosts_pipelined (hosts of one size of 2 ranks or more, consecutive), in
// pieces of each rank's chunk. For piece k: on the caller's stream, piece k of every chunk copied
// into the order the host's reduceScatter takes (local rank l' gets its column's chunks, host by
// host: rows of a 2-D copy), then one reduceScatter on the host, after which this rank holds its
// host's partial sums of piece k of its column's chunks, one a host; across the partners, on the
// side stream, host h's partial to it, summed in host order into piece k of recv (phases' exchange,
// a piece at a time). The caller's stream copies and reduces piece k + 1 while the side stream
// exchanges piece k:
//   caller's:  C0 RS0 C1 RS1 C2 RS2 ... RS(P-1) [X(P-1)]
//   side:             [RS0] X0 [RS1] X1 ...          ([..]: waits for it)
// Each piece's partial sums have their own place (the exchange of piece k reads them while the
// host writes piece k + 1's); the copy's buffer is reused, in order on the caller's stream.
void AcrossHosts::reduceScatterPipelined() {
  const ReduceOp op = call.op, onHostOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const AcrossHostsPieces cut = acrossHostsPieces(call.count, es, 1, impl.acrossHostsPiece);
  const auto piece = [&](std::uint64_t k) { return pieceOf(cut, k); };
  const auto H = static_cast<std::uint64_t>(hosts), L = static_cast<std::uint64_t>(perHost);
  // Piece p's partial sums at p.begin * H elements (host h's at + h * p.size()), then the copy's
  // buffer: L x H pieces. Reserved alike on every rank.
  char* partials = temp((H * call.count + L * H * cut.pieceCount) * es);
  char* staged = partials + H * call.count * es;
  const auto partialsOf = [&](const Range& p) { return partials + p.begin * H * es; };
  // Where host h's ranks start at world rank h * L, column l's chunks lie L chunks apart: one 2-D
  // copy a column. (Host indices need not follow the world ranks' order.)
  bool hostsInOrder = true;
  for (int h = 0; h < hosts; ++h) hostsInOrder = hostsInOrder && layout.worldRank(h, 0) == h * perHost;
  const auto reduceOnHost = [&](std::uint64_t k) {
    const Range p = piece(k);
    const std::uint64_t bytes = p.size() * es;
    for (int l = 0; l < perHost; ++l) {  // row h: piece k of the chunk of world rank (h, l)
      char* to = staged + static_cast<std::uint64_t>(l) * H * bytes;
      if (hostsInOrder) {
        copyRows(to, bytes, send() + at(l) + p.begin * es, L * call.count * es, bytes, H);
        continue;
      }
      for (int h = 0; h < hosts; ++h)
        copy(to + static_cast<std::uint64_t>(h) * bytes, send() + at(layout.worldRank(h, l)) + p.begin * es, bytes);
    }
    onHost(Collective::ReduceScatter, staged, partialsOf(p), H * p.size(), onHostOp);
  };
  const auto exchange = [&](std::uint64_t k, cudaStream_t side) {
    const Range p = piece(k);
    PartnerExchange x;
    x.src = partialsOf(p);
    x.dst = recv() + p.begin * es;
    x.count = p.size();
    for (int h = 0; h < hosts; ++h) x.srcOffset[h] = static_cast<std::uint64_t>(h) * p.size() * es;
    x.sendTo = x.recvFrom = othersThan(host, hosts);
    x.reduce = true;
    x.divisor = impl.world->size();
    acrossPartners(x, op, local, static_cast<int>(k), side);
  };
  if (cut.pieces == 1) {
    reduceOnHost(0);
    exchange(0, nullptr);
    return;
  }
  produceThenExchange(cut.pieces, reduceOnHost, exchange);
}

// reduce as across_hosts_pipelined (hosts of one size of 2 ranks or more, consecutive), in pieces of
// the buffer (counts of whole 16 bytes): on each host, piece k reduced to the rank that carries the
// root's column (phases' reduce, a piece at a time); across that column's partners, on the side
// stream, each other host's partial sum of piece k to the root, which sums them into piece k of its
// recv in host order. The caller's stream reduces piece k + 1 while the side stream sends piece k:
//   caller's:  R0 R1 R2 ... R(P-1) [X(P-1)]         (on the carriers; the other ranks: R0 ... R(P-1))
//   side:          [R0] X0 [R1] X1 ...              ([..]: waits for it)
// Pieces are disjoint, so the exchange of piece k reads (or, at the root, sums into) memory that the
// reduce of piece k + 1 does not touch.
void AcrossHosts::reducePipelined() {
  const int rootHost = layout.hostOf[call.root], column = layout.localOf[call.root];
  const bool root = impl.world->rank() == call.root;
  const ReduceOp op = call.op, onHostOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const int carrier = layout.holder(host, column);
  // As phases' reduce: only the root's recv is the caller's; the other carriers' partial sums go to
  // the Comm's memory (reserved on every rank alike).
  char* partial = temp(call.count * es);
  char* sums = root ? recv() : local == carrier ? partial : nullptr;
  const AcrossHostsPieces cut = acrossHostsPieces(call.count, es, 1, impl.acrossHostsPiece);
  const auto piece = [&](std::uint64_t k) { return pieceOf(cut, k); };
  const auto reduceOnHost = [&](std::uint64_t k) {
    const Range p = piece(k);
    onHost(Collective::Reduce, send() + p.begin * es, sums != nullptr ? sums + p.begin * es : nullptr, p.size(),
           onHostOp, carrier, /*unregistered=*/host != rootHost);
  };
  const auto exchange = [&](std::uint64_t k, cudaStream_t side) {
    const Range p = piece(k);
    acrossPartners(towardRoot(sums + p.begin * es, p.size(), rootHost), op, column, static_cast<int>(k), side);
  };
  if (local != carrier || cut.pieces == 1) {
    for (std::uint64_t k = 0; k < cut.pieces; ++k) reduceOnHost(k);
    if (local == carrier) exchange(0, nullptr);
    return;
  }
  produceThenExchange(cut.pieces, reduceOnHost, exchange);
}

}  // namespace ferry
