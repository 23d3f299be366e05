#pragma once
// One collective call of a Comm across hosts (docs/multi-node.md, "A Comm across hosts"): what its
// phases need, the helpers they share, and the collectives as members. comm_across_hosts.cpp says
// what each collective does in phases (the algorithm across_hosts) and runs a call;
// comm_across_hosts_pipelined.cpp holds the across_hosts_pipelined forms
// (across_hosts_algorithms.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "comm/across_hosts_algorithms.hpp"
#include "comm/comm_impl.hpp"
#include "core/host_id.hpp"
#include "kernels/ranges.hpp"

namespace ferry {

// The mask of every host but `me`.
inline std::uint32_t othersThan(int me, int hosts) { return ((1u << hosts) - 1u) & ~(1u << me); }

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
    return fnv1a({static_cast<std::uint64_t>(call.collective), static_cast<std::uint64_t>(call.count),
                  static_cast<std::uint64_t>(call.type), static_cast<std::uint64_t>(call.op),
                  static_cast<std::uint64_t>(call.root), static_cast<std::uint64_t>(algorithm),
                  static_cast<std::uint64_t>(column), static_cast<std::uint64_t>(step), count});
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

  // The side stream (side_stream.hpp) waits for what the caller's stream has queued so far, marked
  // by its event `event` (each mark of one call an index of its own).
  void forkSide(int event) {
    impl.acrossHostsSide->record(event, call.stream);
    impl.acrossHostsSide->wait(impl.acrossHostsSide->stream(), event);
  }
  // After an error, once the side stream was forked: the caller's stream waits for all it was
  // given (a capture joins every stream it forked), and destroying the Comm waits for it too.
  void joinSideOnError() noexcept {
    impl.acrossHostsSide->join(call.stream);
    try {
      impl.work->note(call.stream);
    } catch (...) {  // (the call's own error is the one to report)
    }
  }

  // The pipeline of reduceScatter and reduce across hosts: for each of `pieces` pieces, produce(k)
  // on the caller's stream, then exchange(k, side) on the side stream once that is done, while the
  // caller's stream produces piece k + 1; the caller's stream waits for the last exchange (the
  // exchanges follow each other on the side stream, so the mark after the last is the mark of all).
  template <class Produce, class Exchange>
  void produceThenExchange(std::uint64_t pieces, Produce&& produce, Exchange&& exchange) {
    SideStream& side = *impl.acrossHostsSide;
    DeviceGuard scope(impl.device);
    const auto produced = [](std::uint64_t k) { return static_cast<int>(2 * k); };
    constexpr int kExchanged = 1;  // (an odd index, apart from every produced(k))
    bool forked = false;
    try {
      for (std::uint64_t k = 0; k < pieces; ++k) {
        produce(k);
        forkSide(produced(k));
        forked = true;
        exchange(k, side.stream());
      }
      side.record(kExchanged, side.stream());
      side.wait(call.stream, kExchanged);
      impl.work->note(call.stream);  // (so that destroying the Comm, or a call on another stream, waits for them)
    } catch (...) {
      if (forked) joinSideOnError();
      throw;
    }
  }
  // reduce's exchange across the root's column: every other host's partial sum at `sums` (count
  // elements) to the root's host, which sums them into its own in host order.
  PartnerExchange towardRoot(char* sums, std::uint64_t count, int rootHost) const {
    PartnerExchange x;
    x.src = x.dst = sums;
    x.count = count;
    if (host == rootHost)
      x.recvFrom = othersThan(host, hosts);
    else
      x.sendTo = 1u << rootHost;
    x.reduce = true;
    x.divisor = impl.world->size();
    return x;
  }
  // Piece k of the call's count, cut as `cut` says (across_hosts_algorithms.hpp).
  Range pieceOf(const AcrossHostsPieces& cut, std::uint64_t k) const {
    const std::uint64_t begin = k * cut.pieceCount;
    return Range{begin, std::min<std::uint64_t>(begin + cut.pieceCount, call.count)};
  }
  // The part of piece p a rank of this host takes (the pieces of allReduce and broadcast), and
  // this rank's in recv.
  std::uint64_t partOf(const Range& p) const { return p.size() / static_cast<std::uint64_t>(perHost); }
  char* partInRecv(const Range& p) const {
    return recv() + (p.begin + static_cast<std::uint64_t>(local) * partOf(p)) * es;
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
  // `rows` rows of `width` bytes, `fromPitch` apart in `from`, `toPitch` apart in `to`, on the
  // call's stream (one 2-D copy, or a copy a row where a pitch is beyond what a 2-D copy takes).
  void copyRows(void* to, std::uint64_t toPitch, const void* from, std::uint64_t fromPitch, std::uint64_t width,
                std::uint64_t rows) {
    if (width == 0 || rows == 0) return;
    DeviceGuard scope(impl.device);
    impl.work->orderAfterLast(call.stream);
    constexpr std::uint64_t kMaxPitch = (1ull << 31) - 1;  // cudaDevAttrMaxPitch on every GPU ferry runs on
    if (toPitch <= kMaxPitch && fromPitch <= kMaxPitch) {
      FERRY_CUDA_CHECK(cudaMemcpy2DAsync(to, toPitch, from, fromPitch, width, rows, cudaMemcpyDeviceToDevice,
                                         call.stream));
    } else {
      for (std::uint64_t r = 0; r < rows; ++r)
        FERRY_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(to) + r * toPitch,
                                         static_cast<const char*>(from) + r * fromPitch, width,
                                         cudaMemcpyDeviceToDevice, call.stream));
    }
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

  // Round j of host h (column j * perHost + local of it, the one this rank carries) among all
  // hosts' rounds, as an offset in chunks: where reduceScatter keeps this host's partial sums of
  // it (one chunk) and allToAll what its ranks send to this host (perHost chunks).
  std::uint64_t slot(int h, int j) const {
    return static_cast<std::uint64_t>(layout.roundsBefore(h, perHost) + j) * call.count * es;
  }
  // Where rounds are whole hosts whose ranks are consecutive (decided alike on every rank), every
  // phase on the host runs in place in the caller's buffers: no round buffers are needed.
  bool direct() const { return layout.even && layout.contiguous; }

  // The collectives as the algorithm across_hosts runs them (comm_across_hosts.cpp); each one
  // hands over to its across_hosts_pipelined form where that is the algorithm
  // (comm_across_hosts_pipelined.cpp).
  void allReduce();
  void allGather();
  void reduceScatter();
  void allToAll();
  void broadcast();
  void reduce();
  void allReducePipelined();
  void allGatherOverlapped();
  void reduceScatterPipelined();
  void allToAllOverlapped();
  void broadcastPipelined();
  void reducePipelined();
};

}  // namespace ferry
