#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>

#include "comm/comm_impl.hpp"
#include "core/logger.hpp"
#include "ferry/env.hpp"

namespace ferry {
std::shared_ptr<Bootstrap> checkedBootstrap(std::shared_ptr<Bootstrap> b) {
  if (!b) throw Error(ErrorCode::InvalidUsage, "Comm: the bootstrap is null");
  if (std::string why = Comm::whyNot(*b); !why.empty()) throw Error(ErrorCode::NotSupported, why);
  return b;
}

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



Comm::Comm(std::shared_ptr<Bootstrap> bootstrap) : Comm(std::move(bootstrap), CommOptions{}) {}

Comm::Comm(std::shared_ptr<Bootstrap> bootstrap, const CommOptions& options)
    : impl_(makeCommImpl(std::move(bootstrap), options)) {}

Comm::~Comm() {
  // Kernels of this Comm may still be queued: its buffers must outlive them. Only this Comm's work
  // is waited for (StreamWork), never the whole device.
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess) {
    (void)cudaSetDevice(impl_->device);
    try {
      impl_->work->drain("destroying the Comm", env().deviceTimeout);
    } catch (const std::exception& e) {
      FERRY_LOG(Error, Collectives) << e.what() << "; freeing its buffers anyway";
    }
    // Across hosts: the partners' proxies stop before the control stream goes, which a failing
    // partner's callback (comm_across_hosts.cpp) aborts this host's calls on.
    {
      const std::lock_guard lock(impl_->peerLinksMu);
      impl_->peerLinks.clear();
    }
    impl_->morePartners.clear();
    impl_->partners.reset();
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
  const int here = static_cast<int>(b.hostRanks().size());
  if (here == b.size())
    return b.size() > kMaxRanks ? who + "supports up to " + std::to_string(kMaxRanks) + " ranks, not " +
                                      std::to_string(b.size())
                                : std::string();
  if (!env().multiHost)
    return who + "needs every rank on one host: " + std::to_string(here) + " of " + std::to_string(b.size()) +
           " ranks are on this host, and a Comm across hosts is experimental (FERRY_MULTI_HOST=1: the "
           "collectives, send and recv; docs/multi-node.md)";
  if (dynamic_cast<const TcpBootstrap*>(&b) == nullptr)
    return who + "across hosts needs a TcpBootstrap (it splits it into this host's ranks and the partners)";
  if (b.numNodes() > kMaxHosts)
    return who + "across hosts supports up to " + std::to_string(kMaxHosts) + " hosts, not " +
           std::to_string(b.numNodes());
  return {};
}

int Comm::rank() const noexcept { return (impl_->world ? impl_->world : impl_->bootstrap)->rank(); }
int Comm::worldSize() const noexcept { return (impl_->world ? impl_->world : impl_->bootstrap)->size(); }
int Comm::device() const noexcept { return impl_->device; }

namespace {

// A collective of this host's ranks, or of a Comm across hosts.
void run(Comm::Impl& impl, const CollectiveCall& call) {
  if (impl.partners) return runAcrossHosts(impl, call);
  impl.run(call);
}

// A reduction whose caller did not choose its accumulation: FERRY_ACCUMULATION's, on the ranks of
// one host (a Comm across hosts adds partial sums, which cannot take float32: stepwise there).
void runReduction(Comm::Impl& impl, CollectiveCall call) {
  static const bool float32 = env().accumulation == "float32";  // (the environment is read once)
  if (float32 && !impl.partners) call.accumulation = Accumulation::Float32;
  run(impl, call);
}

// A reduction with the accumulation its caller chose.
void runReduction(Comm::Impl& impl, CollectiveCall call, Accumulation accumulation) {
  call.accumulation = accumulation;
  run(impl, call);
}

}  // namespace

void Comm::allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                     cudaStream_t stream) {
  runReduction(*impl_, {Collective::AllReduce, send, recv, count, type, op, 0, stream});
}

void Comm::allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                     Accumulation accumulation, cudaStream_t stream) {
  runReduction(*impl_, {Collective::AllReduce, send, recv, count, type, op, 0, stream}, accumulation);
}

void Comm::allReduce(const void* send, void* recv, std::size_t count, DataType type, const PreMulSum& op,
                     cudaStream_t stream) {
  impl_->runPreMul({Collective::AllReduce, send, recv, count, type, ReduceOp::Sum, 0, stream}, op);
}

void Comm::allGather(const void* send, void* recv, std::size_t sendCount, DataType type, cudaStream_t stream) {
  run(*impl_, {Collective::AllGather, send, recv, sendCount, type, ReduceOp::Sum, 0, stream});
}

void Comm::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op,
                         cudaStream_t stream) {
  runReduction(*impl_, {Collective::ReduceScatter, send, recv, recvCount, type, op, 0, stream});
}

void Comm::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op,
                         Accumulation accumulation, cudaStream_t stream) {
  runReduction(*impl_, {Collective::ReduceScatter, send, recv, recvCount, type, op, 0, stream}, accumulation);
}

void Comm::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type,
                         const PreMulSum& op, cudaStream_t stream) {
  impl_->runPreMul({Collective::ReduceScatter, send, recv, recvCount, type, ReduceOp::Sum, 0, stream}, op);
}

void Comm::allToAll(const void* send, void* recv, std::size_t count, DataType type, cudaStream_t stream) {
  run(*impl_, {Collective::AllToAll, send, recv, count, type, ReduceOp::Sum, 0, stream});
}

void Comm::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root, cudaStream_t stream) {
  run(*impl_, {Collective::Broadcast, send, recv, count, type, ReduceOp::Sum, root, stream});
}

void Comm::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                  cudaStream_t stream) {
  runReduction(*impl_, {Collective::Reduce, send, recv, count, type, op, root, stream});
}

void Comm::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  Accumulation accumulation, int root, cudaStream_t stream) {
  runReduction(*impl_, {Collective::Reduce, send, recv, count, type, op, root, stream}, accumulation);
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
  impl_->registry->checkLive(registration.id);
  // Queued calls may still use the mappings: wait for this Comm's work, nobody else's.
  DeviceGuard scope(impl_->device);
  impl_->work->drain("deregisterBuffer", env().deviceTimeout);
  impl_->registry->remove(registration.id);
}

void Comm::abort() {
  if (impl_->resources) {
    DeviceGuard scope(impl_->device);
    RelaxedCapture relaxed;
    raiseAbort(impl_->resources->context(), impl_->control);
  }
  // Then the partners (aborting NCCL's communicator, on its network, may take a while).
  impl_->forEachPartners([](Partners& p) { p.abort(); });
  impl_->abortedHere = true;
}

bool Comm::aborted() const {
  if (impl_->abortedHere) return true;
  bool partnerFailed = false;
  impl_->forEachPartners([&](const Partners& p) { partnerFailed = partnerFailed || p.failed(); });
  if (partnerFailed) return true;
  if (!impl_->resources) return false;
  DeviceGuard scope(impl_->device);
  RelaxedCapture relaxed;
  std::uint32_t flag = 0;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(&flag, &impl_->resources->context().state->aborted, sizeof flag,
                                   cudaMemcpyDeviceToHost, impl_->control));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(impl_->control));
  return flag != 0;
}

Communicator& Comm::communicator() { return impl_->communicator; }

std::string Comm::topology() const {
  return toString(impl_->resources ? impl_->resources->limits().fabric : Fabric::Unknown);
}

}  // namespace ferry
