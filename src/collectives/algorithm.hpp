#pragma once
// The Algorithm interface: one named way to run one collective. Algorithms hold no per-Comm state;
// what they need (peer buffers, the call counter) comes in the CollectiveContext, and what limits
// them (the size of those buffers) in CommLimits, so the selector can ask without a GPU.
//
// Adding one: implement the interface in a .cu file of this folder, list it in allAlgorithms()
// (registry.cpp) and, if it should be picked by default, in defaultTuning() (tuning.cpp).
#include <string>
#include <vector>

#include "collectives/collective_call.hpp"
#include "collectives/device_context.hpp"
#include "collectives/fabric.hpp"

namespace ferry {

// Sizes of a Comm's shared buffers (CommResources), per rank, and how its GPUs are joined.
struct CommLimits {
  int worldSize = 1;
  std::uint64_t llSlotDataBytes = 0;  // data one LL packet slot carries (half its bytes)
  std::uint64_t scratchHalfBytes = 0;
  int maxBlocks = kMaxBlocks;  // the most thread blocks a kernel of the Comm may have (CommOptions)
  Fabric fabric = Fabric::Unknown;  // how the Comm's GPUs are joined (fabric.hpp)
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  virtual Collective collective() const = 0;
  // Empty when the algorithm can run `call` within `limits`; otherwise why not, as a phrase that
  // fits after "cannot run this call: ".
  virtual std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const = 0;
  // Queues the call on call.stream. @pre whyNot(call, ...) is empty and the call is valid, and its
  // buffers are registered if needsRegisteredBuffers(call).
  virtual void launch(const CollectiveCall& call, const CollectiveContext& context) const = 0;
  // True when the algorithm reads or writes the peers' own buffers for `call` and so needs them
  // registered, but runs an unregistered call on registered stand-ins instead of refusing it
  // (staging.hpp; whyNot then leaves registration out). The built-in zero-copy algorithms refuse
  // instead: the selector has scratch algorithms for such calls.
  virtual bool needsRegisteredBuffers(const CollectiveCall&) const { return false; }
  // Loads every kernel the algorithm may launch into the current device's context (launch.hpp,
  // preloadKernel). Comm calls it once per device, when it is made.
  virtual void preload() const {}
};

// Every algorithm, grouped by collective, each group in order of preference when nothing else
// decides.
const std::vector<const Algorithm*>& allAlgorithms();
// nullptr when there is none of that name.
const Algorithm* findAlgorithm(std::string_view name);

// The algorithms of each collective, defined beside their kernels.
std::vector<const Algorithm*> allReduceAlgorithms();
std::vector<const Algorithm*> allGatherAlgorithms();
std::vector<const Algorithm*> reduceScatterAlgorithms();
std::vector<const Algorithm*> allToAllAlgorithms();
std::vector<const Algorithm*> broadcastAlgorithms();
std::vector<const Algorithm*> reduceAlgorithms();
// The zero-copy algorithms of every collective (direct.cu), on registered buffers only.
std::vector<const Algorithm*> directAlgorithms();
// The copy-engine algorithms (ce_collectives.cu), on registered buffers only.
std::vector<const Algorithm*> copyEngineAlgorithms();

}  // namespace ferry
