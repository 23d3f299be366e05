#pragma once
// A buffer of the Comm that some calls need beside the caller's: the scaled input of a PreMulSum
// reduceScatter or reduce (collectives/premul_sum.hpp says why), the parts of a call across hosts
// (comm_across_hosts.cpp). It grows at need, never inside a graph capture.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/collective_call.hpp"

namespace ferry {

class CommScratch {
 public:
  // `purpose` ends the error of a growth refused in a capture: "<purpose>, which must grow to N bytes".
  explicit CommScratch(std::string purpose) : purpose_(std::move(purpose)) {}

  // At least `bytes` of device memory for `call`. Grows (at least 2x) when needed, except while
  // call.stream is being captured: Error(InvalidUsage) then, saying what to do. Outgrown buffers
  // stay allocated until the Comm goes: graphs captured earlier still use them.
  void* reserve(std::uint64_t bytes, const CollectiveCall& call);

 private:
  std::string purpose_;
  std::vector<std::shared_ptr<void>> buffers_;  // the last one is in use
  std::uint64_t capacity_ = 0;
};

}  // namespace ferry
