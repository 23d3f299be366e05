#pragma once
// Registered stand-ins for a call's unregistered buffers. Some algorithms only run on registered
// buffers (the plans that read or write the peers' input and output: Algorithm::
// needsRegisteredBuffers); an unregistered call of theirs runs on a registered staging buffer of the
// Comm instead: its input is copied in, the algorithm runs there, its output is copied back, all on
// the call's stream (so graphs capture it like any call).
//
//   StagedLayout layout = stagedLayout(call);         // where each buffer goes in the staging buffer
//   CollectiveCall staged = staging.stageIn(call);    // copies in; may grow (collective)
//   algorithm.launch(staged, context, state);
//   staging.stageOut(call, staged);                   // copies the output back
//
// Every rank stages the same calls (the choice of algorithm is the same everywhere), so every rank
// grows its staging buffer at the same call, which keeps the growth's registration collective.
// Outgrown buffers stay allocated and registered until the Comm goes: a graph captured earlier
// still uses them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/buffer_registry.hpp"
#include "kernels/collective_call.hpp"

namespace ferry {

// Byte offsets of a call's buffers in its staging buffer. In place, the buffer that holds the
// other (recv for allGather, send for reduceScatter, either for the rest) is staged whole, so the
// staged call is in place by the same rule; out of place, send comes first and recv after it.
struct StagedLayout {
  std::uint64_t bytes = 0;       // of the staging buffer the call needs
  std::uint64_t sendOffset = 0;  // where the staged send starts (unused when the rank reads none)
  std::uint64_t recvOffset = 0;
  // What is copied in before the call: `inBytes` from the user's `inFrom` to the buffer's start.
  const void* inFrom = nullptr;
  std::uint64_t inBytes = 0;
  // What is copied back after it: the staged recv, recvBytes to the user's recv (0 when the rank
  // writes no output: a reduce off the root).
  std::uint64_t outBytes = 0;
};

StagedLayout stagedLayout(const CollectiveCall& call);

// Growth of the Comm's stand-in buffers (these and CommScratch's). A buffer of `capacity` bytes
// that must hold `bytes` grows to this: at least double, so that a growing series of calls grows a
// logarithmic number of times, in 2 MiB steps.
std::uint64_t grownCapacity(std::uint64_t bytes, std::uint64_t capacity);
// Error(InvalidUsage) when call.stream is being captured: a graph must not hold an allocation
// (`why` says which buffer must grow, why the call needs it, and any other way out).
void refuseGrowthInCapture(const CollectiveCall& call, const std::string& why);

class Staging {
 public:
  // registry: the Comm's; the staging buffers are registered there.
  explicit Staging(BufferRegistry& registry) : registry_(registry) {}

  // Queues the copy-in on call.stream and returns the call on the staging buffer (registered).
  // Collective when the buffer must grow: allocates and registers a larger one.
  CollectiveCall stageIn(const CollectiveCall& call);
  // Queues the copy of the staged output back into call's recv (nothing on a reduce's non-root).
  static void stageOut(const CollectiveCall& call, const CollectiveCall& staged);

  std::uint64_t capacity() const { return buffers_.empty() ? 0 : buffers_.back().bytes; }

 private:
  struct Buffer {
    std::shared_ptr<void> memory;
    std::uint64_t bytes = 0;
    std::uint64_t id = 0;  // its registration
  };
  void grow(std::uint64_t bytes);

  BufferRegistry& registry_;
  std::vector<Buffer> buffers_;  // the last one is in use; the others back earlier graphs
};

}  // namespace ferry
