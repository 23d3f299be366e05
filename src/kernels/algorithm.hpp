#pragma once
// The Algorithm interface: one named way to run one collective. An Algorithm object holds no
// per-Comm state (one object serves every Comm of the process): what it shares with every algorithm
// (peer buffers, the call counter) comes in the CollectiveContext, its own device memory in each
// Comm as launch()'s `state`, and what limits it (the size of the shared buffers, the ranks) in
// CommLimits, so the selector can ask without a GPU.
//
// Built-in algorithms live in src/collectives (one file per family, listed in
// collectives/builtin.hpp); plans are algorithms of src/executor (executor/plan_algorithm.hpp). The
// Comm layer (src/comm) is the only one that knows both: it registers them and selects among them.
#include <cstddef>
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
  // buffers are registered if needsRegisteredBuffers(call). state: this algorithm's own device memory
  // in this Comm (deviceStateBytes), nullptr when it keeps none.
  virtual void launch(const CollectiveCall& call, const CollectiveContext& context, void* state) const = 0;
  // Bytes of device memory the algorithm keeps for itself in each Comm (counters its blocks meet at,
  // say): the Comm allocates them zeroed when the algorithm joins it and passes them to every
  // launch(). Each call must leave them as the next call expects to find them.
  virtual std::size_t deviceStateBytes() const { return 0; }
  // True when the algorithm reads or writes the peers' own buffers for `call` and so needs them
  // registered, but runs an unregistered call on registered stand-ins instead of refusing it
  // (staging.hpp; whyNot then leaves registration out). The built-in zero-copy algorithms refuse
  // instead: the selector has scratch algorithms for such calls.
  virtual bool needsRegisteredBuffers(const CollectiveCall&) const { return false; }
  // The most ranks it runs on. The selector asks before whyNot (whyNotRun below). A Comm itself
  // holds up to kMaxRanks (its shared buffers have a row per rank).
  virtual int maxRanks() const { return kMaxRanks; }
  // What the algorithm can run, in words, for Comm::algorithms(); empty when it runs any call of its
  // collective that the Comm's buffers hold.
  virtual std::string constraints(const CommLimits& limits) const {
    (void)limits;
    return {};
  }
  // Whether a reduction it runs gives exactly the sum (or product, ...) taken in rank order, rank 0
  // first, as the tests' references do; false where it starts each chunk at another rank (a ring)
  // or sums in an order a program chose (a plan): the last bits of floats may then differ.
  virtual bool reducesInRankOrder() const { return true; }
  // Whether it runs calls that ask for float32 accumulation (CollectiveCall::sumsInFloat32): true
  // where every element's terms meet in one place, so one float sum of them rounds once. The
  // selector keeps the others off such calls (whyNotRun).
  virtual bool sumsInFloat32() const { return false; }
  // Loads every kernel the algorithm may launch into the current device's context (launch.hpp,
  // preloadKernel). Comm calls it once per device, when it is made.
  virtual void preload() const {}
};

// Why `algorithm` cannot run `call` within `limits`, its rank limit included; empty when it can.
inline std::string whyNotRun(const Algorithm& algorithm, const CollectiveCall& call, const CommLimits& limits) {
  if (limits.worldSize > algorithm.maxRanks())
    return "it runs on up to " + std::to_string(algorithm.maxRanks()) + " ranks, not " +
           std::to_string(limits.worldSize);
  if (call.sumsInFloat32() && !algorithm.sumsInFloat32())
    return "it rounds a sum of 16- and 8-bit floats after each rank, and the call asks for float32 "
           "accumulation (Accumulation::Float32)";
  return algorithm.whyNot(call, limits);
}

}  // namespace ferry
