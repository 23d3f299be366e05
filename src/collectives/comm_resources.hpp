#pragma once
// The buffers a Comm's peers write into, made once per Comm: one gpuAlloc per rank laid out as
// device_context.hpp describes, registered and mapped by every peer. Building it is collective.
#include <memory>
#include <vector>

#include "collectives/algorithm.hpp"
#include "collectives/device_context.hpp"
#include "ferry/communicator.hpp"
#include "ferry/registered_memory.hpp"

namespace ferry {

class CommResources {
 public:
  // llSlotDataBytes: data one LL slot carries; scratchBytes: both halves together.
  // @pre a current CUDA device; comm's ranks all on this host; worldSize <= kMaxRanks.
  CommResources(Communicator& comm, std::uint64_t llSlotDataBytes, std::uint64_t scratchBytes);

  const CollectiveContext& context() const { return context_; }
  const CommLimits& limits() const { return limits_; }

 private:
  std::shared_ptr<void> memory_;
  RegisteredMemory local_;
  std::vector<RegisteredMemory> peers_;  // keeps the mappings alive
  CollectiveContext context_;
  CommLimits limits_;
};

}  // namespace ferry
