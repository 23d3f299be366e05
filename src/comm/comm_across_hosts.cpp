// A Comm whose ranks span hosts (FERRY_MULTI_HOST, experimental; docs/multi-node.md, "A Comm across
// hosts"). It is a Comm of this host's ranks (every NVLink algorithm, unchanged) and this rank's
// partners on the other hosts (HostPartners: Ethernet PortChannels, nothing mapped). A call runs in
// phases on the caller's stream, each a call of this host's Comm or one partner exchange
// (collectives/partner_exchange.hpp); with H hosts of L ranks, rank (h, l) does:
//   allReduce      on the host, the whole buffer (op, or sum for an average); across the partners,
//                  part l of it, in host order (the average divides there, by the world's ranks);
//                  on the host, each part broadcast from the rank that holds it.
//   allGather      on the host, into this host's block; across the partners, this rank's own chunk
//                  to theirs; on the host, each other host's block gathered in place.
//   reduceScatter  on the host, each host's block reduced and scattered (part h' of a temporary);
//                  across the partners, part h' to host h', reduced in host order.
//   allToAll       across the partners, the block for host h' to partner h' (into a temporary);
//                  on the host, this host's block and each temporary block exchanged.
//   broadcast      on the root's host, from the root; across the partners, part l from the root's
//                  host; on every other host, each part broadcast from the rank that received it.
//   reduce         on each host, to the root's local rank; across that column of partners, into the
//                  root, in host order.
// Every rank that ends with a reduced value ends with the same bits: a host's phase gives its
// ranks the same sums, and the partners add the hosts' in one order. allGather, reduceScatter and
// allToAll need each host's ranks numbered consecutively (HostLayout::contiguous: a host's part is
// then one block); other numberings, PreMulSum and send/recv are refused alike on every rank.
#include "comm/comm_impl.hpp"
#include "comm/staging.hpp"
#include "ferry/memory.hpp"
#include "kernels/ranges.hpp"

namespace ferry {
namespace {

// Lets the phases of a call across hosts through Comm::Impl::prepare, whatever ends the call.
class AcrossHostsPhase {
 public:
  explicit AcrossHostsPhase(Comm::Impl& impl) : impl_(impl) { impl_.acrossHostsPhase = true; }
  ~AcrossHostsPhase() { impl_.acrossHostsPhase = false; }
  AcrossHostsPhase(const AcrossHostsPhase&) = delete;
  AcrossHostsPhase& operator=(const AcrossHostsPhase&) = delete;

 private:
  Comm::Impl& impl_;
};

HostLayout gatherLayout(Bootstrap& world, const Bootstrap& local, int perHost) {
  struct Place {
    int host, local;
  };
  std::vector<Place> places(static_cast<std::size_t>(world.size()));
  places[static_cast<std::size_t>(world.rank())] = {world.node(), local.rank()};
  world.allGather(places.data(), sizeof(Place));
  std::vector<int> host, rank;
  for (const Place& p : places) {
    host.push_back(p.host);
    rank.push_back(p.local);
  }
  return HostLayout(std::move(host), std::move(rank), world.numNodes(), perHost);
}

// The mask of every host but `me`.
std::uint32_t othersThan(int me, int hosts) { return ((1u << hosts) - 1u) & ~(1u << me); }

// One call across hosts: what every phase needs.
struct AcrossHosts {
  Comm::Impl& impl;
  CollectiveCall call;  // as the caller made it, in world ranks
  const HostLayout& layout;
  int host, local, hosts, perHost;
  std::size_t es;

  AcrossHosts(Comm::Impl& i, const CollectiveCall& c)
      : impl(i), call(c), layout(i.hostLayout), host(i.partners->host()), local(i.bootstrap->rank()),
        hosts(i.partners->hosts()), perHost(i.bootstrap->size()), es(sizeOf(c.type)) {}

  // A call of this host's Comm (its checks, its algorithms, its order on the stream).
  void onHost(Collective c, const void* send, void* recv, std::size_t count, ReduceOp op, int root = 0,
              bool unregistered = false) {
    CollectiveCall local{c, send, recv, count, call.type, op, root, call.stream};
    local.unregistered = unregistered;
    impl.run(local);
  }

  void acrossPartners(const PartnerExchange& x, ReduceOp op) {
    DeviceGuard scope(impl.device);
    impl.work->orderAfterLast(call.stream);
    impl.partners->exchange(x, call.type, op, call.stream);
    impl.work->note(call.stream);  // destroying the Comm waits for it too (the partners' proxy goes then)
  }

  // `bytes` of the Comm's device memory for the phases (grown outside a capture only).
  char* temp(std::uint64_t bytes) {
    if (bytes > impl.acrossHostsTempBytes) {
      CollectiveCall world = call;
      world.rank = impl.world->rank();
      refuseGrowthInCapture(world, "across hosts, its parts go to a buffer of the Comm, which must grow to " +
                                       std::to_string(bytes) + " bytes");
      DeviceGuard scope(impl.device);
      const std::uint64_t want = grownCapacity(bytes, impl.acrossHostsTempBytes);
      impl.acrossHostsTemp.push_back(gpuAlloc(want));
      impl.acrossHostsTempBytes = want;
    }
    return static_cast<char*>(impl.acrossHostsTemp.back().get());
  }

  char* recv() const { return static_cast<char*>(call.recv); }
  const char* send() const { return static_cast<const char*>(call.send); }
  std::uint64_t block(int h) const { return static_cast<std::uint64_t>(layout.firstOf[h]) * call.count * es; }
  Range part(std::size_t count, int l) const {
    return splitRange(count, static_cast<std::uint64_t>(perHost), static_cast<std::uint64_t>(l), 1);
  }

  // Each part of recv[0, count) broadcast on this host from the rank that holds it.
  void broadcastParts(std::size_t count) {
    if (perHost == 1) return;
    for (int r = 0; r < perHost; ++r) {
      const Range p = part(count, r);
      if (p.size() == 0) continue;
      char* at = recv() + p.begin * es;
      onHost(Collective::Broadcast, at, at, p.size(), ReduceOp::Sum, r);
    }
  }

  void allReduce() {
    const ReduceOp op = call.op;
    onHost(Collective::AllReduce, call.send, call.recv, call.count, op == ReduceOp::Avg ? ReduceOp::Sum : op);
    const Range mine = part(call.count, local);
    PartnerExchange x;
    x.src = recv() + mine.begin * es;
    x.dst = recv() + mine.begin * es;
    x.count = mine.size();
    x.sendTo = x.recvFrom = othersThan(host, hosts);
    x.reduce = true;
    x.divisor = impl.world->size();
    acrossPartners(x, op);
    broadcastParts(call.count);
  }

  void allGather() {
    const std::size_t c = call.count;
    onHost(Collective::AllGather, call.send, recv() + block(host), c, ReduceOp::Sum);
    const std::uint64_t chunk = c * es;
    PartnerExchange x;
    x.src = recv();
    x.dst = recv();
    for (int h = 0; h < hosts; ++h) {
      x.srcOffset[h] = block(host) + static_cast<std::uint64_t>(local) * chunk;
      x.dstOffset[h] = block(h) + static_cast<std::uint64_t>(local) * chunk;
    }
    x.count = c;
    x.sendTo = x.recvFrom = othersThan(host, hosts);
    acrossPartners(x, ReduceOp::Sum);
    for (int h = 0; h < hosts; ++h) {
      if (h == host || perHost == 1) continue;
      char* at = recv() + block(h);
      onHost(Collective::AllGather, at + static_cast<std::uint64_t>(local) * chunk, at, c, ReduceOp::Sum);
    }
  }

  void reduceScatter() {
    const std::size_t c = call.count;
    const std::uint64_t chunk = c * es;
    char* parts = temp(chunk * static_cast<std::uint64_t>(hosts));
    const ReduceOp op = call.op;
    for (int h = 0; h < hosts; ++h)
      onHost(Collective::ReduceScatter, send() + block(h), parts + static_cast<std::uint64_t>(h) * chunk, c,
             op == ReduceOp::Avg ? ReduceOp::Sum : op);
    PartnerExchange x;
    x.src = parts;
    x.dst = recv();
    for (int h = 0; h < hosts; ++h) x.srcOffset[h] = static_cast<std::uint64_t>(h) * chunk;
    x.count = c;
    x.sendTo = x.recvFrom = othersThan(host, hosts);
    x.reduce = true;
    x.divisor = impl.world->size();
    acrossPartners(x, op);
  }

  void allToAll() {
    const std::size_t c = call.count;
    const std::uint64_t hostBlock = c * es * static_cast<std::uint64_t>(perHost);
    char* blocks = temp(hostBlock * static_cast<std::uint64_t>(hosts));
    PartnerExchange x;
    x.src = send();
    x.dst = blocks;
    for (int h = 0; h < hosts; ++h) {
      x.srcOffset[h] = block(h);
      x.dstOffset[h] = static_cast<std::uint64_t>(h) * hostBlock;
    }
    x.count = c * static_cast<std::size_t>(perHost);
    x.sendTo = x.recvFrom = othersThan(host, hosts);
    acrossPartners(x, ReduceOp::Sum);
    onHost(Collective::AllToAll, send() + block(host), recv() + block(host), c, ReduceOp::Sum);
    for (int h = 0; h < hosts; ++h)
      if (h != host)
        onHost(Collective::AllToAll, blocks + static_cast<std::uint64_t>(h) * hostBlock, recv() + block(h), c,
               ReduceOp::Sum);
  }

  void broadcast() {
    const int rootHost = layout.hostOf[call.root], rootLocal = layout.localOf[call.root];
    if (host == rootHost) onHost(Collective::Broadcast, call.send, call.recv, call.count, ReduceOp::Sum, rootLocal);
    const Range mine = part(call.count, local);
    PartnerExchange x;
    x.src = recv() + mine.begin * es;
    x.dst = recv() + mine.begin * es;
    x.count = mine.size();
    if (host == rootHost)
      x.sendTo = othersThan(host, hosts);
    else
      x.recvFrom = 1u << rootHost;
    acrossPartners(x, ReduceOp::Sum);
    if (host != rootHost) broadcastParts(call.count);
  }

  void reduce() {
    const int rootHost = layout.hostOf[call.root], rootLocal = layout.localOf[call.root];
    const bool root = impl.world->rank() == call.root;
    const ReduceOp op = call.op;
    // Only the root's recv is the caller's to fill: the partial sums of the other hosts' ranks at
    // the root's local index go to the Comm's memory (unregistered, so on those hosts every rank
    // runs the reduce as unregistered, alike); the other ranks have none.
    char* sums = root ? recv() : local == rootLocal ? temp(call.count * es) : nullptr;
    onHost(Collective::Reduce, call.send, sums, call.count, op == ReduceOp::Avg ? ReduceOp::Sum : op, rootLocal,
           /*unregistered=*/host != rootHost);
    if (local != rootLocal) return;
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
    acrossPartners(x, op);
  }
};

}  // namespace

std::unique_ptr<Comm::Impl> makeCommImpl(std::shared_ptr<Bootstrap> b, const CommOptions& options) {
  if (!b || b->numNodes() <= 1) return std::make_unique<Comm::Impl>(std::move(b), options);
  b = checkedBootstrap(std::move(b));  // FERRY_MULTI_HOST, a TcpBootstrap, the limits (Comm::whyNot)
  auto tcp = std::dynamic_pointer_cast<TcpBootstrap>(b);
  // Every rank decides alike from every host's size: each needs a partner on every other host.
  std::vector<int> sizes(static_cast<std::size_t>(b->size()));
  sizes[static_cast<std::size_t>(b->rank())] = b->localSize();
  b->allGather(sizes.data(), sizeof(int));
  for (std::size_t r = 0; r < sizes.size(); ++r)
    if (sizes[r] != sizes[0])
      throw Error(ErrorCode::NotSupported,
                  "rank " + std::to_string(b->rank()) + ": Comm across hosts: rank 0's host has " +
                      std::to_string(sizes[0]) + " ranks and rank " + std::to_string(r) + "'s " +
                      std::to_string(sizes[r]) +
                      "; it needs the same number on every host so far (leave FERRY_MULTI_HOST unset to "
                      "hand such a communicator to NCCL)");
  // (Here, not in Comm::whyNot, which must answer alike on every rank from what the rank sees.)
  if (sizes[0] > kMaxRanks)
    throw Error(ErrorCode::NotSupported, "rank " + std::to_string(b->rank()) + ": Comm across hosts: " +
                                             std::to_string(sizes[0]) + " ranks a host; at most " +
                                             std::to_string(kMaxRanks) + " are supported");
  // Both splits on every rank, in the same order (TcpBootstrap::split is collective).
  std::shared_ptr<TcpBootstrap> local = tcp->split(b->node(), b->rank());
  std::shared_ptr<TcpBootstrap> partners = tcp->split(b->localRank(), b->node());
  auto impl = std::make_unique<Comm::Impl>(local, options);
  impl->world = b;
  impl->hostLayout = gatherLayout(*b, *local, sizes[0]);
  HostPartnersOptions po;
  po.worldRank = b->rank();
  po.worldRanks.assign(static_cast<std::size_t>(partners->size()), -1);
  for (std::size_t r = 0; r < impl->hostLayout.hostOf.size(); ++r)
    if (impl->hostLayout.localOf[r] == local->rank())
      po.worldRanks[static_cast<std::size_t>(impl->hostLayout.hostOf[r])] = static_cast<int>(r);
  // A partner gone mid-call ends this host's calls too: its other ranks may be waiting for this one
  // in a phase on the host (Comm::abort's way, from the proxy thread; destroyed before resources).
  po.onFailure = [raw = impl.get()] {
    if (!raw->resources) return;
    try {
      DeviceGuard scope(raw->device);
      raiseAbort(raw->resources->context(), raw->control);
    } catch (const std::exception& e) {
      FERRY_LOG(Error, Collectives) << "Comm across hosts: ending this host's calls after a partner failed: "
                                    << e.what();
    }
  };
  // The partners' slots take half as much device memory as the Comm's own scratch.
  impl->partners = std::make_unique<HostPartners>(partners, env().scratchBytes / 2, std::move(po));
  FERRY_LOG(Info, Collectives) << "Comm across hosts: rank " << b->rank() << " is rank " << local->rank() << " of "
                                << local->size() << " on host " << b->node() << " of " << b->numNodes()
                                << (impl->hostLayout.contiguous ? "" : " (hosts' ranks not consecutive)");
  return impl;
}

void runAcrossHosts(Comm::Impl& impl, CollectiveCall call) {
  impl.checkNotAborted("collective call");
  if (impl.partners->failed()) impl.partners->throwFailure();  // a partner went away in an earlier call
  // The whole call is checked in world ranks first (root, in place, the buffers' sizes), so that a
  // bad argument is named as the caller made it, before any phase runs.
  CollectiveCall world = call;
  world.rank = impl.world->rank();
  world.worldSize = impl.world->size();
  validateCall(world, impl.device);
  const bool blocks = call.collective == Collective::AllGather || call.collective == Collective::ReduceScatter ||
                      call.collective == Collective::AllToAll;
  if (blocks && !impl.hostLayout.contiguous)
    throw Error(ErrorCode::NotSupported,
                "rank " + std::to_string(world.rank) + ": " + std::string(toString(call.collective)) +
                    ": a Comm across hosts runs it only where each host's ranks are consecutive world ranks (as "
                    "torchrun and mpirun number them); number the ranks so, or leave FERRY_MULTI_HOST unset so "
                    "that the NCCL library and the torch backend hand the communicator to NCCL");
  if (call.count == 0) return;
  const AcrossHostsPhase phase(impl);
  AcrossHosts run(impl, world);
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
