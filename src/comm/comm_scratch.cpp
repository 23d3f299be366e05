#include "comm/comm_scratch.hpp"

#include <string>

#include "comm/staging.hpp"
#include "ferry/memory.hpp"

namespace ferry {

void* CommScratch::reserve(std::uint64_t bytes, const CollectiveCall& call) {
  if (bytes > capacity_) {
    refuseGrowthInCapture(call, purpose_ + ", which must grow to " + std::to_string(bytes) + " bytes");
    const std::uint64_t want = grownCapacity(bytes, capacity_);
    buffers_.push_back(gpuAlloc(want));
    capacity_ = want;
  }
  return buffers_.back().get();
}

}  // namespace ferry
