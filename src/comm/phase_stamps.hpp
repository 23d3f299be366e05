#pragma once
// The host side of FERRY_PHASE_STAMPS (kernels/phase_stamps.hpp): the ring the kernels write, and
// the summary printed when its Comm goes away.
#include <string>

#include "kernels/phase_stamps.hpp"

namespace ferry {

class PhaseStamps {
 public:
  // Allocates and zeroes the ring on the current device.
  explicit PhaseStamps(int rank);
  ~PhaseStamps();  // prints summary() to stderr
  PhaseStamps(const PhaseStamps&) = delete;
  PhaseStamps& operator=(const PhaseStamps&) = delete;

  PhaseRecord* ring() const { return ring_; }
  // Waits for the device, then: one line per (collective, count) with the medians, in us, of the
  // launch gap (global timer: the previous call's exit to this call's entry), each phase (SM clock at
  // the device's rated clock) and the whole kernel (global timer).
  std::string summary() const;

 private:
  int rank_;
  int device_ = 0;
  PhaseRecord* ring_ = nullptr;
};

}  // namespace ferry
