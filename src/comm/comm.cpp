#include "ferry/comm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "comm/buffer_registry.hpp"
#include "kernels/collective_call.hpp"
#include "comm/comm_resources.hpp"
#include "comm/native_algorithm.hpp"
#include "kernels/copy_engine_host.hpp"
#include "collectives/p2p.hpp"
#include "collectives/p2p_group.hpp"
#include "collectives/premul_sum.hpp"
#include "comm/premul_scratch.hpp"
#include "comm/selector.hpp"
#include "comm/staging.hpp"
#include "platform/cuda_check.hpp"
#include "core/logger.hpp"
#include "executor/device_plans.hpp"
#include "executor/plan_algorithm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

// Makes the Comm's device current for one call and restores the caller's afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    FERRY_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) FERRY_CUDA_CHECK(cudaSetDevice(device));
    switched_ = previous_ != device;
  }
  ~DeviceScope() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Lets this thread make stream calls while another thread captures a CUDA graph in global mode
// (PyTorch's default): abort() and aborted() are called from watchdog threads at any time.
class RelaxedCapture {
 public:
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

std::shared_ptr<Bootstrap> checkedBootstrap(std::shared_ptr<Bootstrap> b) {
  if (!b) throw Error(ErrorCode::InvalidUsage, "Comm: the bootstrap is null");
  if (std::string why = Comm::whyNot(*b); !why.empty()) throw Error(ErrorCode::NotSupported, why);
  return b;
}

// Every kernel a Comm may launch, loaded into this device's context before the first call
// (launch.hpp says why), once per device and process.
void preloadKernelsOnce(int device) {
  static std::mutex mu;
  static std::set<int> done;
  std::lock_guard lock(mu);
  if (!done.insert(device).second) return;
  const auto start = std::chrono::steady_clock::now();
  for (const Algorithm* a : allAlgorithms()) a->preload();
  preloadP2P();
  preloadPreMul();
  FERRY_LOG(Info, Collectives) << "loaded the collective kernels on GPU " << device << " in "
                                << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
                                << " ms";
}

}  // namespace

struct Comm::Impl {
  std::shared_ptr<Bootstrap> bootstrap;
  int device = 0;
  Communicator communicator;
  Selector selector;
  SelectionCache selection;  // the selector's answers per call shape
  // What removed algorithms owned: queued kernels and captured graphs may still run them.
  std::vector<std::shared_ptr<const void>> retired;
  std::unique_ptr<CommResources> resources;
  std::unique_ptr<P2PResources> p2p;
  int p2pResidentBlocks = 0;  // blocks of the send/recv kernel that fit on the GPU at once
  int p2pMaxBlocks = 0;       // this rank's CommOptions::maxBlocks (0: none); the ranks need not agree
  // Before the registry: freed after it has dropped their registrations.
  std::unique_ptr<Staging> staging;  // registered stand-ins for unregistered calls that need them
  PreMulScratch preMulScratch;       // scaled inputs of PreMulSum reduceScatters and reduces
  std::unique_ptr<BufferRegistry> registry;
  std::unique_ptr<executor::DevicePlans> plans;
  // After resources: destroyed first, so copies in flight finish before the buffers go.
  std::unique_ptr<CopyEngine> copyEngine;
  int groupDepth = 0;
  std::uint64_t soloRegistrations = 0;
  std::vector<PeerCall> pending;  // the open group's sends and recvs
  // Beside the callers' streams, never behind them: the abort word's writes and reads (copies).
  cudaStream_t control = nullptr;
  bool abortedHere = false;  // this rank called abort()

  void checkNotAborted(const char* what) const {
    if (abortedHere)
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(bootstrap->rank()) + ": " + what +
                                               ": the Comm was aborted; destroy it and make a new one");
  }

  Impl(std::shared_ptr<Bootstrap> b, const CommOptions& options)
      : bootstrap(checkedBootstrap(std::move(b))), communicator(bootstrap), selector(Selector::fromEnvironment()) {
    checkOptions(options);
    FERRY_CUDA_CHECK(cudaGetDevice(&device));
    if (bootstrap->size() > 1) {
      resources = std::make_unique<CommResources>(communicator, env().llBytes, env().scratchBytes);
      agreeOnLimits(options);
      p2p = std::make_unique<P2PResources>(communicator, &resources->context().state->aborted);
      int least = 0, greatest = 0;
      FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&control, cudaStreamNonBlocking, greatest));
      p2pResidentBlocks = ferry::p2pResidentBlocks();
      p2pMaxBlocks = options.maxBlocks;
      preloadKernelsOnce(device);
      registry = std::make_unique<BufferRegistry>(communicator);
      staging = std::make_unique<Staging>(*registry);
      resources->setRegistrationTable(registry->table());
      plans = std::make_unique<executor::DevicePlans>(bootstrap->rank(), bootstrap->size());
      resources->setPlans(plans.get());
      copyEngine = std::make_unique<CopyEngine>(bootstrap->rank(), bootstrap->size(), device);
      resources->setCopyEngine(copyEngine.get());
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
  // (the plans' lanes too: FERRY_PLAN_LANES is read by each process). In the same round, the
  // fabric: the selector must pick alike on every rank.
  void agreeOnLimits(const CommOptions& o) {
    struct Bounds {
      int lo, hi, lanes;
      Fabric fabric;
    };
    std::vector<Bounds> all(static_cast<std::size_t>(bootstrap->size()));
    const auto lanes = static_cast<int>(std::clamp<std::int64_t>(env().planLanes, 1, kMaxBlocks));
    all[static_cast<std::size_t>(bootstrap->rank())] = {
        std::clamp(o.minBlocks, 1, kMaxBlocks),
        o.maxBlocks == 0 ? kMaxBlocks : std::min(o.maxBlocks, kMaxBlocks), lanes, localFabric(device)};
    bootstrap->allGather(all.data(), sizeof(Bounds));
    int lo = 1, hi = kMaxBlocks, planLanes = kMaxBlocks;
    std::vector<Fabric> fabrics;
    for (const Bounds& b : all) {
      lo = std::max(lo, b.lo);
      hi = std::min(hi, b.hi);
      planLanes = std::min(planLanes, b.lanes);
      fabrics.push_back(b.fabric);
    }
    resources->setFabric(commFabric(fabrics));
    resources->setBlockLimits(std::min(lo, hi), hi);
    resources->setPlanLanes(planLanes);
    if (lo > 1 || hi < kMaxBlocks)
      FERRY_LOG(Info, Collectives) << "Comm kernels run " << std::min(lo, hi) << " to " << hi << " thread blocks";
  }

  // Checks `call` and fills in who runs it; false when there is nothing to do.
  bool prepare(CollectiveCall& call) {
    checkNotAborted("collective call");
    call.rank = bootstrap->rank();
    call.worldSize = bootstrap->size();
    validateCall(call, device);
    return call.count != 0;
  }

  void run(CollectiveCall call) {
    if (!prepare(call)) return;
    DeviceScope scope(device);
    dispatch(call);
  }

  // A sum with each rank's input scaled first (premul_sum.hpp).
  void runPreMul(CollectiveCall call, const PreMulSum& op) {
    call.op = ReduceOp::Sum;
    if (!prepare(call)) return;
    validatePreMul(call, op, device);
    DeviceScope scope(device);
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

  // Queues a checked call (prepare) on the current device.
  void dispatch(CollectiveCall call) {
    if (!call.usesRecv()) call.recv = nullptr;  // a reduce's non-root recv: never read nor written
    if (call.worldSize == 1) {
      // The answer is the input itself (avg over one rank included).
      const bool needsCopy = call.send != nullptr && !call.inPlace();
      if (needsCopy)
        FERRY_CUDA_CHECK(cudaMemcpyAsync(call.recv, call.send, call.recvElements() * call.elementBytes(),
                                         cudaMemcpyDeviceToDevice, call.stream));
      return;
    }
    if (registry) {
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
    const Algorithm& algorithm = selection.select(selector, call, resources->limits());
    if (call.registered() || !algorithm.needsRegisteredBuffers(call)) {
      algorithm.launch(call, resources->context());
      return;
    }
    const CollectiveCall staged = staging->stageIn(call);
    algorithm.launch(staged, resources->context());
    staging->stageOut(call, staged);
  }

  std::string who(const char* operation) const {
    return "rank " + std::to_string(bootstrap->rank()) + ": " + operation;
  }

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

  void addPeerCall(PeerCall call) {
    checkNotAborted(call.isSend ? "send" : "recv");
    call.rank = bootstrap->rank();
    call.worldSize = bootstrap->size();
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
    // A Comm of one rank has no send/recv kernel: all it can hold is copies to itself.
    const P2PBatch batch = planP2PGroup(calls, p2p ? p2pResidentBlocks : 1, p2pMaxBlocks);
    DeviceScope scope(device);
    if (p2p) return launchP2P(batch, p2p->context(), calls.front().stream);
    for (int i = 0; i < batch.messages; ++i)
      FERRY_CUDA_CHECK(cudaMemcpyAsync(batch.message[i].buffer, batch.message[i].source,
                                       batch.message[i].bytes, cudaMemcpyDeviceToDevice,
                                       calls.front().stream));
  }
};

Comm::Comm(std::shared_ptr<Bootstrap> bootstrap) : Comm(std::move(bootstrap), CommOptions{}) {}

Comm::Comm(std::shared_ptr<Bootstrap> bootstrap, const CommOptions& options)
    : impl_(std::make_unique<Impl>(std::move(bootstrap), options)) {}

Comm::~Comm() {
  // Kernels of this Comm may still be queued: its buffers must outlive them.
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess) {
    (void)cudaSetDevice(impl_->device);
    (void)cudaDeviceSynchronize();
    if (impl_->control != nullptr) (void)cudaStreamDestroy(impl_->control);
    (void)cudaSetDevice(current);
  }
  // No barrier with the peers: a peer's last kernel may still write into this rank's buffers (a
  // send/recv acknowledgement, a ring's final signal), but they are cuMem allocations, whose pages
  // stay alive while a peer maps them; such writes land in memory nobody reads. (A barrier here
  // would stall one thread that destroys the Comms of several GPUs in turn.)
}

std::string Comm::whyNot(const Bootstrap& b) {
  const std::string who = "rank " + std::to_string(b.rank()) + ": Comm ";
  if (b.size() > kMaxRanks)
    return who + "supports up to " + std::to_string(kMaxRanks) + " ranks, not " + std::to_string(b.size());
  if (static_cast<int>(b.hostRanks().size()) != b.size())
    return who + "needs every rank on one host; this host has " + std::to_string(b.hostRanks().size()) +
           " of " + std::to_string(b.size()) + " ranks (inter-node transports are not built yet)";
  return {};
}

int Comm::rank() const noexcept { return impl_->bootstrap->rank(); }
int Comm::worldSize() const noexcept { return impl_->bootstrap->size(); }
int Comm::device() const noexcept { return impl_->device; }

void Comm::allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                     cudaStream_t stream) {
  impl_->run({Collective::AllReduce, send, recv, count, type, op, 0, stream});
}

void Comm::allReduce(const void* send, void* recv, std::size_t count, DataType type, const PreMulSum& op,
                     cudaStream_t stream) {
  impl_->runPreMul({Collective::AllReduce, send, recv, count, type, ReduceOp::Sum, 0, stream}, op);
}

void Comm::allGather(const void* send, void* recv, std::size_t sendCount, DataType type, cudaStream_t stream) {
  impl_->run({Collective::AllGather, send, recv, sendCount, type, ReduceOp::Sum, 0, stream});
}

void Comm::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op,
                         cudaStream_t stream) {
  impl_->run({Collective::ReduceScatter, send, recv, recvCount, type, op, 0, stream});
}

void Comm::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type,
                         const PreMulSum& op, cudaStream_t stream) {
  impl_->runPreMul({Collective::ReduceScatter, send, recv, recvCount, type, ReduceOp::Sum, 0, stream}, op);
}

void Comm::allToAll(const void* send, void* recv, std::size_t count, DataType type, cudaStream_t stream) {
  impl_->run({Collective::AllToAll, send, recv, count, type, ReduceOp::Sum, 0, stream});
}

void Comm::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root, cudaStream_t stream) {
  impl_->run({Collective::Broadcast, send, recv, count, type, ReduceOp::Sum, root, stream});
}

void Comm::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                  cudaStream_t stream) {
  impl_->run({Collective::Reduce, send, recv, count, type, op, root, stream});
}

void Comm::reduce(const void* send, void* recv, std::size_t count, DataType type, const PreMulSum& op,
                  int root, cudaStream_t stream) {
  impl_->runPreMul({Collective::Reduce, send, recv, count, type, ReduceOp::Sum, root, stream}, op);
}

void Comm::send(const void* buffer, std::size_t count, DataType type, int peer, cudaStream_t stream) {
  impl_->addPeerCall({true, buffer, count, type, peer, stream});
}

void Comm::recv(void* buffer, std::size_t count, DataType type, int peer, cudaStream_t stream) {
  impl_->addPeerCall({false, buffer, count, type, peer, stream});
}

void Comm::groupStart() { ++impl_->groupDepth; }

void Comm::groupEnd() {
  if (impl_->groupDepth == 0)
    throw Error(ErrorCode::InvalidUsage,
                "rank " + std::to_string(rank()) + ": groupEnd without a matching groupStart");
  if (--impl_->groupDepth == 0) impl_->runGroup();
}

BufferRegistration Comm::registerBuffer(void* ptr, std::size_t bytes) {
  if (!impl_->registry) {  // one rank: there is nothing to share, and no zero-copy to enable
    if (ptr == nullptr || bytes == 0)
      throw Error(ErrorCode::InvalidUsage, "rank 0: registerBuffer: the buffer is null or empty");
    return {++impl_->soloRegistrations};
  }
  return {impl_->registry->add(ptr, bytes)};
}

void Comm::deregisterBuffer(BufferRegistration registration) {
  if (!impl_->registry) return;
  impl_->registry->remove(registration.id);
}

void Comm::abort() {
  if (impl_->resources) {
    DeviceScope scope(impl_->device);
    RelaxedCapture relaxed;
    raiseAbort(impl_->resources->context(), impl_->control);
  }
  impl_->abortedHere = true;
}

bool Comm::aborted() const {
  if (impl_->abortedHere) return true;
  if (!impl_->resources) return false;
  DeviceScope scope(impl_->device);
  RelaxedCapture relaxed;
  std::uint32_t flag = 0;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(&flag, &impl_->resources->context().state->aborted, sizeof flag,
                                   cudaMemcpyDeviceToHost, impl_->control));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(impl_->control));
  return flag != 0;
}

void Comm::setAlgorithm(Collective c, std::string_view name) { impl_->selector.force(c, name); }

std::vector<AlgorithmInfo> Comm::algorithms() const {
  CommLimits limits;
  limits.worldSize = worldSize();
  if (impl_->resources) limits = impl_->resources->limits();
  std::vector<AlgorithmInfo> out;
  for (const auto& e : impl_->selector.registry().entries()) {
    const Algorithm& a = *e.algorithm;
    out.push_back({a.name(), a.collective(), e.kind, a.constraints(limits),
                   impl_->selector.forced(a.collective()) == a.name()});
  }
  return out;
}

void Comm::addPlan(const Plan& plan) {
  Impl& I = *impl_;
  I.checkNotAborted("addPlan");
  const std::string name = plan.algorithmName();
  if (plan.worldSize() != worldSize())
    throw Error(ErrorCode::InvalidUsage, I.who("addPlan") + ": " + name + " is a plan for " +
                                             std::to_string(plan.worldSize()) + " ranks; this Comm has " +
                                             std::to_string(worldSize()));
  I.agree("addPlan", name);
  const auto& algorithm = executor::algorithmOf(plan);
  I.withContext("addPlan", [&] {
    if (I.selector.registry().find(name) != nullptr)
      throw Error(ErrorCode::InvalidUsage, "an algorithm named '" + name + "' is already registered");
    if (I.plans) {
      DeviceScope scope(I.device);
      I.plans->add(&algorithm.forWorldSize(worldSize())->programs[static_cast<std::size_t>(rank())]);
    }
    I.selector.add(&algorithm, AlgorithmKind::Plan, plan.impl());
  });
}

void Comm::addAlgorithm(std::shared_ptr<NativeAlgorithm> algorithm) {
  Impl& I = *impl_;
  I.checkNotAborted("addAlgorithm");
  std::shared_ptr<NativeAlgorithmAdapter> adapter;
  I.withContext("addAlgorithm", [&] { adapter = std::make_shared<NativeAlgorithmAdapter>(std::move(algorithm)); });
  const std::string name = adapter->name();
  I.agree("addAlgorithm", name);
  I.withContext("addAlgorithm", [&] {
    if (I.selector.registry().find(name) != nullptr)
      throw Error(ErrorCode::InvalidUsage, "an algorithm named '" + name + "' is already registered");
  });
  // Registered only where setup succeeded on every rank, so the registries stay alike.
  std::string failure;
  try {
    DeviceScope scope(I.device);
    adapter->user().setup(*this);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::vector<char> ok(static_cast<std::size_t>(worldSize()));
  ok[static_cast<std::size_t>(rank())] = failure.empty() ? 1 : 0;
  I.bootstrap->allGather(ok.data(), 1);
  std::string failed;
  for (int r = 0; r < worldSize(); ++r)
    if (!ok[static_cast<std::size_t>(r)]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    throw Error(ErrorCode::InvalidUsage, I.who("addAlgorithm") + " '" + name + "': setup failed on rank(s) " +
                                             failed + (failure.empty() ? "" : ", here: " + failure) +
                                             "; the algorithm was not added on any rank");
  I.selector.add(adapter.get(), AlgorithmKind::Native, adapter);
}

void Comm::removeAlgorithm(std::string_view name) {
  Impl& I = *impl_;
  I.agree("removeAlgorithm", std::string(name));
  I.withContext("removeAlgorithm", [&] { I.retired.push_back(I.selector.remove(name).owner); });
}

Communicator& Comm::communicator() { return impl_->communicator; }

std::string Comm::topology() const {
  return toString(impl_->resources ? impl_->resources->limits().fabric : Fabric::Unknown);
}

std::string Comm::algorithmFor(Collective c, std::size_t bytes, DataType type, bool registered) const {
  if (worldSize() == 1) return "local_copy";
  CollectiveCall call;
  call.collective = c;
  call.type = type;
  call.rank = rank();
  call.worldSize = worldSize();
  const std::size_t esize = sizeOf(type);
  // bytes is the larger buffer: per-rank counts are a worldSize-th of it.
  const bool perRank = c == Collective::AllGather || c == Collective::ReduceScatter || c == Collective::AllToAll;
  call.count = esize ? bytes / esize / (perRank ? static_cast<std::size_t>(worldSize()) : 1) : 0;
  if (registered) call.sendId = call.recvId = 1;
  // Distinct addresses, so that the call is not taken for an in-place one.
  call.send = reinterpret_cast<const void*>(std::uintptr_t{1} << 40);
  call.recv = reinterpret_cast<void*>(std::uintptr_t{2} << 40);
  return impl_->selector.select(call, impl_->resources->limits()).name();
}

std::vector<std::string> Comm::algorithmNames(Collective c) {
  std::vector<std::string> names;
  for (const Algorithm* a : allAlgorithms())
    if (a->collective() == c) names.emplace_back(a->name());
  return names;
}

}  // namespace ferry
