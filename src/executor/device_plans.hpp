#pragma once
// The loaded plans' programs for one rank, copied to its GPU once, when the Comm is made, so that a
// call (or a graph capture) allocates and copies nothing.
#include <cstdint>
#include <utility>
#include <vector>

#include "executor/rank_program.hpp"

namespace ferry::executor {

struct DeviceProgram {
  const ExecOp* ops = nullptr;
  const ExecRef* refs = nullptr;
  const std::uint32_t* tbFirst = nullptr;
};

class DevicePlans {
 public:
  // Uploads the program of `rank` of every loaded plan (planAlgorithms()) for `worldSize` ranks.
  // @pre the Comm's device is current.
  DevicePlans(int rank, int worldSize);
  ~DevicePlans();
  DevicePlans(const DevicePlans&) = delete;
  DevicePlans& operator=(const DevicePlans&) = delete;

  // nullptr when `program` was not uploaded here.
  const DeviceProgram* find(const RankProgram* program) const;

 private:
  void* memory_ = nullptr;
  std::vector<std::pair<const RankProgram*, DeviceProgram>> programs_;
};

}  // namespace ferry::executor
