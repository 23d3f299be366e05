#pragma once
// The plans' programs of one rank of one Comm, copied to its GPU when the Comm is made (FERRY_PLAN_DIR's)
// or when a plan is added to it (Comm::addPlan), so that a call (or a graph capture) allocates and
// copies nothing. Programs stay on the GPU until the Comm goes: a removed plan's may still be in
// use by queued kernels or captured graphs.
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

  // Uploads one more program (synchronously). @pre the Comm's device is current.
  void add(const RankProgram* program);
  // nullptr when `program` was not uploaded here.
  const DeviceProgram* find(const RankProgram* program) const;

 private:
  void upload(const std::vector<const RankProgram*>& programs);

  std::vector<void*> memory_;
  std::vector<std::pair<const RankProgram*, DeviceProgram>> programs_;
};

}  // namespace ferry::executor
