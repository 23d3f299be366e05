#pragma once
// The buffers a Comm's peers write into for collectives, made once per Comm: one allocation per
// rank laid out as device_context.hpp describes, mapped by every peer. Building it is collective.
#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/algorithm.hpp"
#include "comm/phase_stamps.hpp"
#include "kernels/device_context.hpp"
#include "transport/peer_memory.hpp"

namespace ferry {

// Raises the abort word (CallState::aborted) of every rank of `context` and returns once they are
// written. Copies on `stream`, which must not be behind the Comm's own work: copy engines, not SMs,
// so the copies run even while stuck kernels hold every SM (Comm::abort).
void raiseAbort(const CollectiveContext& context, cudaStream_t stream);

class CommResources {
 public:
  // llSlotDataBytes: data one LL slot carries; scratchBytes: both halves together.
  // @pre a current CUDA device; comm's ranks all on this host; worldSize <= kMaxRanks.
  CommResources(Communicator& comm, std::uint64_t llSlotDataBytes, std::uint64_t scratchBytes);

  const CollectiveContext& context() const { return context_; }
  // Where kernels find the registered buffers' table (BufferRegistry).
  void setRegistrationTable(const RegTable* table) { context_.regs = table; }
  // Where plan algorithms find their programs on this GPU (executor/device_plans.hpp).
  void setPlans(const executor::DevicePlans* plans) { context_.plans = plans; }
  // The Comm's channels to its peers, for the proxy-driven algorithms and plans (port_peers.hpp).
  void setPorts(PortPeersSource* ports) { context_.ports = ports; }
  // The Comm's send/recv kernel, for the algorithms that run a collective on it (p2p_collectives.hpp).
  void setP2P(const P2PLauncher* p2p) { context_.p2p = p2p; }
  // Every rank's shared allocation (what PortPeers::region names).
  const PeerMemory& memory() const { return *memory_; }
  // @pre 1 <= minBlocks <= maxBlocks <= kMaxBlocks, the same on every rank.
  void setBlockLimits(int minBlocks, int maxBlocks) {
    context_.minBlocks = minBlocks;
    context_.maxBlocks = limits_.maxBlocks = maxBlocks;
  }
  // @pre the same on every rank.
  void setFabric(Fabric fabric) { limits_.fabric = fabric; }
  // @pre 1 <= lanes, the same on every rank.
  void setPlanLanes(int lanes) { context_.planLanes = lanes; }
  void setPlanPortsAsMemory(bool asMemory) { context_.planPortsAsMemory = asMemory; }
  const CommLimits& limits() const { return limits_; }

 private:
  std::unique_ptr<PeerMemory> memory_;
  std::unique_ptr<PhaseStamps> stamps_;  // FERRY_PHASE_STAMPS only
  CollectiveContext context_;
  CommLimits limits_;
};

}  // namespace ferry
