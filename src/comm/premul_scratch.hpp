#pragma once
// Where the scaled input of a PreMulSum reduceScatter or reduce goes (collectives/premul_sum.hpp
// says why those need a buffer of the Comm).
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/collective_call.hpp"

namespace ferry {

class PreMulScratch {
 public:
  // At least `bytes` of device memory for `call`'s scaled input. Grows (at least 2x) when needed,
  // except while call.stream is being captured: Error(InvalidUsage) then, saying what to do.
  // Outgrown buffers stay allocated until the Comm goes: graphs captured earlier still use them.
  void* reserve(std::uint64_t bytes, const CollectiveCall& call);

 private:
  std::vector<std::shared_ptr<void>> buffers_;  // the last one is in use
  std::uint64_t capacity_ = 0;
};

}  // namespace ferry
