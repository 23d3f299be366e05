#pragma once
// The Algorithm interface: one named way to run one collective. Algorithms hold no per-Comm state;
// what they need (peer buffers, the call counter) comes in the CollectiveContext, and what limits
// them (the size of those buffers) in CommLimits, so the selector can ask without a GPU.
//
// Built-in algorithms live in src/collectives (one file per family, listed in
// collectives/builtin.hpp); plans are algorithms of src/executor (executor/plan_algorithm.hpp). The
// Comm layer (src/comm) is the only one that knows both: it registers them and selects among them.
#include <string>
#include <vector>

#include "kernels/collective_call.hpp"
#include "kernels/device_context.hpp"
#include "platform/fabric.hpp"

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
  // What the algorithm can run, in words, for Comm::algorithms(); empty when it runs any call of its
  // collective that the Comm's buffers hold.
  virtual std::string constraints(const CommLimits& limits) const {
    (void)limits;
    return {};
  }
  // Loads every kernel the algorithm may launch into the current device's context (launch.hpp,
  // preloadKernel). Comm calls it once per device, when it is made.
  virtual void preload() const {}
};

}  // namespace ferry
