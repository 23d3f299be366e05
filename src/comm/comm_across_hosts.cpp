// A Comm whose ranks span hosts (FERRY_MULTI_HOST, experimental; docs/multi-node.md, "A Comm across
// hosts"). It is a Comm of this host's ranks (every NVLink algorithm, unchanged) and this rank's
// partners on the other hosts (HostPartners: Ethernet PortChannels, nothing mapped). An allReduce
// runs in three phases on the caller's stream:
//   1. on this host, the allReduce of the whole buffer (op, or sum for an average);
//   2. across hosts, local rank l reduces part l of the buffer with its partners, in host order
//      (the average divides there, by the world's ranks);
//   3. on this host, each part is broadcast from the rank that holds it.
// Every rank ends with the same bits: phase 1 gives a host's ranks the same sums, phase 2 adds the
// hosts' in one order, phase 3 copies. Calls other than allReduce are refused with an error that
// says so, alike on every rank.
#include "comm/comm_impl.hpp"
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
  // The partners' slots take half as much device memory as the Comm's own scratch.
  impl->partners = std::make_unique<HostPartners>(partners, env().scratchBytes / 2);
  FERRY_LOG(Info, Collectives) << "Comm across hosts: rank " << b->rank() << " is rank " << local->rank() << " of "
                                << local->size() << " on host " << b->node() << " of " << b->numNodes();
  return impl;
}

void allReduceAcrossHosts(Comm::Impl& impl, CollectiveCall call) {
  const AcrossHostsPhase phase(impl);
  const ReduceOp op = call.op;
  const std::size_t count = call.count;
  CollectiveCall local = call;
  local.op = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  impl.run(local);  // checks the call (prepare) as any call of this host's Comm
  if (count == 0) return;
  const int ranksHere = impl.bootstrap->size(), me = impl.bootstrap->rank();
  const std::size_t es = sizeOf(call.type);
  char* out = static_cast<char*>(call.recv);
  const Range mine = splitRange(count, static_cast<std::uint64_t>(ranksHere), static_cast<std::uint64_t>(me), 1);
  {
    DeviceGuard scope(impl.device);
    impl.partners->allReduce(out + mine.begin * es, mine.size(), call.type, op, impl.world->size(), call.stream);
    impl.work->note(call.stream);  // destroying the Comm waits for it too (the partners' proxy goes then)
  }
  if (ranksHere == 1) return;
  for (int r = 0; r < ranksHere; ++r) {
    const Range part = splitRange(count, static_cast<std::uint64_t>(ranksHere), static_cast<std::uint64_t>(r), 1);
    if (part.size() == 0) continue;
    char* at = out + part.begin * es;
    impl.run({Collective::Broadcast, at, at, part.size(), call.type, ReduceOp::Sum, r, call.stream});
  }
}

}  // namespace ferry
