#pragma once
// Comm::Impl: what a Comm holds and the steps its calls share, for the files that implement Comm
// (comm.cpp: making it, calls, buffers, groups, abort; comm_algorithms.cpp: its algorithm registry;
// comm_across_hosts.cpp: a Comm whose ranks span hosts).
#include "ferry/comm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <map>

#include "comm/buffer_registry.hpp"
#include "kernels/collective_call.hpp"
#include "comm/comm_resources.hpp"
#include "comm/native_algorithm.hpp"
#include "comm/comm_ports.hpp"
#include "comm/host_layout.hpp"
#include "comm/partners.hpp"
#include "comm/phase_stamps.hpp"
#include "collectives/p2p.hpp"
#include "collectives/p2p_group.hpp"
#include "collectives/premul_sum.hpp"
#include "comm/comm_scratch.hpp"
#include "comm/selector.hpp"
#include "comm/side_stream.hpp"
#include "comm/staging.hpp"
#include "comm/stream_work.hpp"
#include "platform/cuda_check.hpp"
#include "platform/device_guard.hpp"
#include "core/logger.hpp"
#include "executor/device_plans.hpp"
#include "executor/plan_algorithm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "platform/relaxed_capture.hpp"

namespace ferry {

// Comm's own helpers (comm.cpp).
std::shared_ptr<Bootstrap> checkedBootstrap(std::shared_ptr<Bootstrap> b);
// Every kernel a Comm may launch, loaded into this device's context before the first call
// (launch.hpp says why), once per device and process.
void preloadKernelsOnce(int device);
// A Comm's insides over `b`: of one host, or across hosts (comm_across_hosts.cpp).
std::unique_ptr<Comm::Impl> makeCommImpl(std::shared_ptr<Bootstrap> b, const CommOptions& options);
// A collective of a Comm across hosts: phases on this host's Comm and across the partners
// (comm_across_hosts.cpp says which). `call` names world ranks.
void runAcrossHosts(Comm::Impl& impl, CollectiveCall call);
// A group of sends and recvs of a Comm across hosts (p2p_across_hosts.cpp); peers are world ranks,
// the calls checked already.
void runGroupAcrossHosts(Comm::Impl& impl, std::vector<PeerCall> calls);

struct Comm::Impl {
  std::shared_ptr<Bootstrap> bootstrap;
  int device = 0;
  Communicator communicator;
  Selector selector;
  SelectionCache selection;  // the selector's answers per call shape
  AlgorithmStates states;    // each algorithm's own device memory in this Comm
  // What removed algorithms owned: queued kernels and captured graphs may still run them.
  std::vector<std::shared_ptr<const void>> retired;
  std::unique_ptr<CommResources> resources;
  std::unique_ptr<P2PResources> p2p;
  // The inboxes, the blocks of the send/recv kernel that fit on the GPU at once, and this rank's
  // CommOptions::maxBlocks (0: none; the ranks need not agree).
  P2PLauncher p2pLaunch;
  std::unique_ptr<PhaseStamps> p2pStamps;  // FERRY_PHASE_STAMPS: the send/recv kernel's ring
  // Before the registry: freed after it has dropped their registrations.
  std::unique_ptr<Staging> staging;  // registered stand-ins for unregistered calls that need them
  // Scaled inputs of PreMulSum reduceScatters and reduces.
  CommScratch preMulScratch{"with a PreMulSum op, its scaled input goes to a buffer of the Comm"};
  std::unique_ptr<BufferRegistry> registry;
  std::unique_ptr<executor::DevicePlans> plans;
  // After resources and registry: destroyed first, so copies in flight finish before the buffers go.
  std::unique_ptr<CommPorts> ports;
  std::unique_ptr<StreamWork> work;  // the streams this Comm queued work on, to wait for it alone
  int groupDepth = 0;
  std::uint64_t soloRegistrations = 0;
  std::vector<PeerCall> pending;  // the open group's sends and recvs
  // Beside the callers' streams, never behind them: the abort word's writes and reads (copies).
  cudaStream_t control = nullptr;
  bool abortedHere = false;  // this rank called abort()
  // A Comm across hosts (FERRY_MULTI_HOST, comm_across_hosts.cpp): this Impl is then the Comm of
  // this host's ranks (`bootstrap` is theirs), `world` every rank's bootstrap and `partners` this
  // rank's partners on the other hosts. Null on one host.
  std::shared_ptr<Bootstrap> world;
  std::unique_ptr<Partners> partners;  // those of this rank's own column (its local rank)
  // On a host smaller than the largest, those of the further columns this rank carries (HostLayout).
  std::map<int, std::unique_ptr<Partners>> morePartners;
  // send/recv with ranks of other hosts: a link (HostPartners of two) per such peer, by its world
  // rank, made at the pair's first matched call (p2p_across_hosts.cpp); added on the caller's
  // thread while Comm::abort and aborted may walk them from another (peerLinksMu). Each link's sends
  // and recvs run on streams of their own.
  mutable std::mutex peerLinksMu;
  std::map<int, std::unique_ptr<Partners>> peerLinks;
  struct PeerLinkState {
    std::unique_ptr<SideStream> sends, recvs;
  };
  std::map<int, PeerLinkState> peerLinkStates;  // (the caller's thread only)
  // What a partner's or link's failure does: ends this host's calls (across_hosts_setup.cpp).
  std::function<void()> partnerFailed;
  HostLayout hostLayout;
  bool acrossHostsPhase = false;  // a call across hosts is running its phases on this host's Comm
  // Device memory of the phases across hosts (parts of a reduceScatter or allToAll, a reduce's
  // partial sums).
  CommScratch acrossHostsScratch{"across hosts, its parts go to a buffer of the Comm"};
  // The pipelined allReduce across hosts (across_hosts_algorithms.hpp): its pieces' size, the
  // largest any rank asked for (FERRY_ACROSS_HOSTS_PIECE; every rank cuts alike), and the stream
  // its exchanges run on (null where the layout cannot run it).
  std::uint64_t acrossHostsPiece = 0;
  std::unique_ptr<SideStream> acrossHostsSide;

  template <class F>
  void forEachPartners(F&& f) const {
    if (partners) f(*partners);
    for (const auto& [column, p] : morePartners) f(*p);
    const std::lock_guard lock(peerLinksMu);
    for (const auto& [peer, p] : peerLinks) f(*p);
  }

  void checkNotAborted(const char* what) const {
    if (abortedHere)
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(worldRank()) + ": " + what +
                                               ": the Comm was aborted; destroy it and make a new one");
  }

  Impl(std::shared_ptr<Bootstrap> b, const CommOptions& options)
      : bootstrap(checkedBootstrap(std::move(b))), communicator(bootstrap), selector(Selector::fromEnvironment()) {
    checkOptions(options);
    FERRY_CUDA_CHECK(cudaGetDevice(&device));
    work = std::make_unique<StreamWork>(bootstrap->rank(), device);
    if (bootstrap->size() > 1) {
      resources = std::make_unique<CommResources>(communicator, env().llBytes, env().scratchBytes);
      agreeOnLimits(options);
      p2p = std::make_unique<P2PResources>(communicator, &resources->context().state->aborted);
      int least = 0, greatest = 0;
      FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&control, cudaStreamNonBlocking, greatest));
      p2pLaunch = P2PLauncher{&p2p->context(), ferry::p2pResidentBlocks(), options.maxBlocks,
                              resources->context().earlyLaunch};
      if (env().phaseStamps) {
        p2pStamps = std::make_unique<PhaseStamps>(bootstrap->rank());
        p2p->setStamps(p2pStamps->ring());
      }
      resources->setP2P(&p2pLaunch);
      preloadKernelsOnce(device);
      ports = std::make_unique<CommPorts>(communicator, options.connect, resources->memory(),
                                          &resources->context().state->aborted);
      resources->setPorts(ports.get());
      registry = std::make_unique<BufferRegistry>(communicator, &ports->service());
      staging = std::make_unique<Staging>(*registry);
      resources->setRegistrationTable(registry->table());
      plans = std::make_unique<executor::DevicePlans>(bootstrap->rank(), bootstrap->size());
      resources->setPlans(plans.get());
      for (const auto& e : selector.registry().entries()) states.reserve(*e.algorithm);
    }
    bootstrap->barrier();  // every rank has mapped every peer before anyone writes
    FERRY_LOG(Info, Collectives) << "Comm ready: rank " << bootstrap->rank() << " of " << bootstrap->size()
                                  << " on GPU " << device;
  }

  void checkOptions(const CommOptions& o) const {
    const std::string who = "rank " + std::to_string(bootstrap->rank()) + ": Comm: ";
    if (o.minBlocks < 0 || o.maxBlocks < 0)
      throw Error(ErrorCode::InvalidUsage, who + "CommOptions minBlocks " + std::to_string(o.minBlocks) +
                                               " and maxBlocks " + std::to_string(o.maxBlocks) +
                                               " must not be negative (0: ferry's choice)");
    if (o.minBlocks > 0 && o.maxBlocks > 0 && o.minBlocks > o.maxBlocks)
      throw Error(ErrorCode::InvalidUsage, who + "CommOptions minBlocks " + std::to_string(o.minBlocks) +
                                               " exceeds maxBlocks " + std::to_string(o.maxBlocks));
  }

  // The ranks' kernels pair up block by block, so every rank takes the tightest bounds any asked for
  // (the plans' lanes and port mode too: FERRY_PLAN_LANES and FERRY_PLAN_PORTS are read by each
  // process). In the same round, the fabric: the selector must pick alike on every rank.
  void agreeOnLimits(const CommOptions& o) {
    struct Bounds {
      int lo, hi, lanes;
      Fabric fabric;
      int portsAsMemory;  // FERRY_PLAN_PORTS=memory, on the Comm's own connections
    };
    std::vector<Bounds> all(static_cast<std::size_t>(bootstrap->size()));
    const auto lanes = static_cast<int>(std::clamp<std::int64_t>(env().planLanes, 1, kMaxBlocks));
    all[static_cast<std::size_t>(bootstrap->rank())] = {
        std::clamp(o.minBlocks, 1, kMaxBlocks),
        o.maxBlocks == 0 ? kMaxBlocks : std::min(o.maxBlocks, kMaxBlocks), lanes, localFabric(device),
        env().planPorts == "memory" && !o.connect ? 1 : 0};
    bootstrap->allGather(all.data(), sizeof(Bounds));
    int lo = 1, hi = kMaxBlocks, planLanes = kMaxBlocks;
    bool portsAsMemory = true;
    std::vector<Fabric> fabrics;
    for (const Bounds& b : all) {
      lo = std::max(lo, b.lo);
      hi = std::min(hi, b.hi);
      planLanes = std::min(planLanes, b.lanes);
      portsAsMemory = portsAsMemory && b.portsAsMemory != 0;
      fabrics.push_back(b.fabric);
    }
    resources->setFabric(commFabric(fabrics));
    resources->setBlockLimits(std::min(lo, hi), hi);
    resources->setPlanLanes(planLanes);
    resources->setPlanPortsAsMemory(portsAsMemory);
    if (lo > 1 || hi < kMaxBlocks)
      FERRY_LOG(Info, Collectives) << "Comm kernels run " << std::min(lo, hi) << " to " << hi << " thread blocks";
  }

  // Checks `call` and fills in who runs it; false when there is nothing to do.
  bool prepare(CollectiveCall& call) {
    checkNotAborted("collective call");
    if (partners && !acrossHostsPhase) refuseAcrossHosts(toString(call.collective));
    call.rank = bootstrap->rank();
    call.worldSize = bootstrap->size();
    validateCall(call, device);
    return call.count != 0;
  }

  void run(CollectiveCall call) {
    if (!prepare(call)) return;
    DeviceGuard scope(device);
    work->orderAfterLast(call.stream);
    dispatch(call);
  }

  // A sum with each rank's input scaled first (premul_sum.hpp).
  void runPreMul(CollectiveCall call, const PreMulSum& op) {
    call.op = ReduceOp::Sum;
    if (partners) return runPreMulAcrossHosts(call, op);
    if (!prepare(call)) return;
    validatePreMul(call, op, device);
    DeviceGuard scope(device);
    work->orderAfterLast(call.stream);  // the scaling pass writes the Comm's premul scratch
    const int maxBlocks = resources ? resources->context().maxBlocks : kMaxBlocks;
    if (call.worldSize == 1 || call.collective == Collective::AllReduce) {
      // Same size in and out (one rank has nothing to sum): scale into recv, sum in place there.
      if (call.usesRecv())
        launchPreMul(call.recv, call.send, call.recvElements(), call.type, op, maxBlocks, call.stream);
      call.send = call.recv;
    } else {
      const std::uint64_t bytes = call.sendElements() * call.elementBytes();
      void* scaled = preMulScratch.reserve(bytes, call);
      launchPreMul(scaled, call.send, call.sendElements(), call.type, op, maxBlocks, call.stream);
      call.send = scaled;
    }
    dispatch(call);
  }

  // runPreMul on a Comm across hosts: the call checked in world ranks first (as runAcrossHosts
  // does), each rank's input scaled into the Comm's memory (allReduce's into recv, summed in place
  // there), then a sum across hosts of the scaled inputs: the hosts' phases and the partners' sums
  // add the products as one host's ranks do.
  void runPreMulAcrossHosts(CollectiveCall call, const PreMulSum& op) {
    checkNotAborted("collective call");
    forEachPartners([](Partners& p) {
      if (p.failed()) p.throwFailure();  // (before anything is queued: an in-place input stays as it was)
    });
    CollectiveCall whole = call;
    whole.rank = world->rank();
    whole.worldSize = world->size();
    validateCall(whole, device);
    if (call.count == 0) return;
    validatePreMul(whole, op, device);
    DeviceGuard scope(device);
    work->orderAfterLast(call.stream);  // the scaling pass writes recv or the Comm's premul scratch
    const int maxBlocks = resources ? resources->context().maxBlocks : kMaxBlocks;
    if (call.collective == Collective::AllReduce) {
      launchPreMul(call.recv, call.send, whole.recvElements(), call.type, op, maxBlocks, call.stream);
      call.send = call.recv;
    } else {
      void* scaled = preMulScratch.reserve(whole.sendElements() * whole.elementBytes(), whole);
      launchPreMul(scaled, call.send, whole.sendElements(), call.type, op, maxBlocks, call.stream);
      call.send = scaled;
    }
    work->note(call.stream);
    runAcrossHosts(*this, call);
  }

  // Queues a checked call (prepare) on the current device.
  void dispatch(CollectiveCall call) {
    if (!call.usesRecv()) call.recv = nullptr;  // a reduce's non-root recv: never read nor written
    if (call.worldSize == 1) {
      // The answer is the input itself (avg over one rank included).
      const bool needsCopy = call.send != nullptr && !call.inPlace();
      if (needsCopy)
        FERRY_CUDA_CHECK(cudaMemcpyAsync(call.recv, call.send, call.recvElements() * call.elementBytes(),
                                         cudaMemcpyDeviceToDevice, call.stream));
      work->note(call.stream);  // (a Comm across hosts' phases read its buffers here too)
      return;
    }
    if (registry && !call.unregistered) {
      const std::size_t es = call.elementBytes();
      if (call.usesSend()) {
        const auto hit = registry->find(call.send, call.sendElements() * es);
        call.sendId = hit.id;
        call.sendOffset = hit.offset;
      }
      if (call.usesRecv()) {
        const auto hit = registry->find(call.recv, call.recvElements() * es);
        call.recvId = hit.id;
        call.recvOffset = hit.offset;
      }
    }
    const SelectionCache::Choice choice = selection.select(selector, states, call, resources->limits());
    const Algorithm& algorithm = *choice.algorithm;
    if (call.registered() || !algorithm.needsRegisteredBuffers(call)) {
      algorithm.launch(call, resources->context(), choice.state);
    } else {
      const CollectiveCall staged = staging->stageIn(call);
      algorithm.launch(staged, resources->context(), choice.state);
      staging->stageOut(call, staged);
    }
    work->note(call.stream);  // after the call's work, which the event then covers
  }

  std::string who(const char* operation) const {
    return "rank " + std::to_string(worldRank()) + ": " + operation;
  }

  // The rank the caller knows: across hosts, the world's (bootstrap is this host's ranks').
  int worldRank() const { return world ? world->rank() : bootstrap->rank(); }

  // Every rank must change its registry alike, or their selectors would pick different algorithms
  // for the same call: compares this rank's change with every other's (one bootstrap round).
  void agree(const char* operation, const std::string& name) {
    struct Change {
      char text[120];
    };
    std::vector<Change> all(static_cast<std::size_t>(bootstrap->size()));
    Change& mine = all[static_cast<std::size_t>(bootstrap->rank())];
    std::snprintf(mine.text, sizeof mine.text, "%s %s", operation, name.c_str());
    const std::string text = mine.text;
    bootstrap->allGather(all.data(), sizeof(Change));
    for (int r = 0; r < bootstrap->size(); ++r) {
      const Change& other = all[static_cast<std::size_t>(r)];
      if (std::strncmp(other.text, text.c_str(), sizeof other.text) != 0)
        throw Error(ErrorCode::InvalidUsage,
                    who(operation) + " '" + name + "': rank " + std::to_string(r) + " made another change (" +
                        std::string(other.text, strnlen(other.text, sizeof other.text)) +
                        "); every rank must add and remove the same algorithms, in the same order");
    }
  }

  // Runs f, prefixing the rank and the operation to an Error's message.
  template <class F>
  void withContext(const char* operation, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      throw Error(e.code(), who(operation) + ": " + e.detail());
    }
  }

  // What a Comm across hosts does not run yet: an error on every rank alike (the call is the same).
  void refuseAcrossHosts(std::string_view what) const {
    throw Error(ErrorCode::NotSupported,
                "rank " + std::to_string(world->rank()) + ": " + std::string(what) +
                    ": a Comm across hosts runs allReduce, allGather, reduceScatter, allToAll, broadcast, "
                    "reduce, send and recv so far (FERRY_MULTI_HOST is experimental, "
                    "docs/multi-node.md); "
                    "make this call on a Comm of one host, or leave FERRY_MULTI_HOST unset so that the NCCL "
                    "library and the torch backend hand the communicator to NCCL");
  }

  void addPeerCall(PeerCall call) {
    checkNotAborted(call.isSend ? "send" : "recv");
    // (Across hosts, the call names world ranks: checked as such, run by runGroupAcrossHosts.)
    call.rank = world ? world->rank() : bootstrap->rank();
    call.worldSize = world ? world->size() : bootstrap->size();
    validatePeerCall(call, device);
    pending.push_back(call);
    if (groupDepth == 0) runGroup();
  }

  // Queues the pending sends and recvs, the pairs of a rank with itself included, as one kernel.
  // Checks everything before queuing anything; the group is gone either way.
  void runGroup() {
    std::vector<PeerCall> calls;
    calls.swap(pending);
    std::erase_if(calls, [](const PeerCall& c) { return c.count == 0; });
    if (calls.empty()) return;
    if (partners && !acrossHostsPhase) return runGroupAcrossHosts(*this, std::move(calls));
    // A Comm of one rank has no send/recv kernel: all it can hold is copies to itself.
    const P2PBatch batch = planP2PGroup(calls, p2p ? p2pLaunch.residentBlocks : 1, p2pLaunch.maxBlocks);
    DeviceGuard scope(device);
    work->orderAfterLast(calls.front().stream);
    if (p2p) {
      launchP2P(batch, p2p->context(), calls.front().stream, p2pLaunch.early);
    } else {
      for (int i = 0; i < batch.messages; ++i)
        FERRY_CUDA_CHECK(cudaMemcpyAsync(batch.message[i].buffer, batch.message[i].source,
                                         batch.message[i].bytes, cudaMemcpyDeviceToDevice,
                                         calls.front().stream));
    }
    work->note(calls.front().stream);
  }
};

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

}  // namespace ferry
