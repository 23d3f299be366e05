#pragma once
// The device memory each algorithm keeps for itself in one Comm (Algorithm::deviceStateBytes):
// counters its blocks meet at, say. Allocated zeroed when the algorithm joins the Comm (made with
// it, or added), never while a stream is being captured, and kept until the Comm goes, because
// queued kernels and captured graphs of a removed algorithm may still use it. No other algorithm,
// and no other Comm, sees it.
#include <memory>
#include <unordered_map>

#include "kernels/algorithm.hpp"

namespace ferry {

class AlgorithmStates {
 public:
  // Gives `algorithm` its zeroed state here if it keeps one and has none yet. @pre a current device.
  void reserve(const Algorithm& algorithm);
  // The state reserve() gave `algorithm`; nullptr when it keeps none.
  void* of(const Algorithm& algorithm) const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unordered_map<const Algorithm*, std::unique_ptr<void, Free>> states_;
};

}  // namespace ferry
