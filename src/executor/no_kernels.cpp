// A build without CUDA (FERRY_BUILD_CUDA=OFF) has no executor kernel: a plan then says so when
// it is run.
#include "executor/plan_launch.hpp"
#include "ferry/errors.hpp"

namespace ferry::executor {

void preloadPlanKernels() {}

void launchPlan(const Plan&, const RankProgram&, const DeviceProgram&, const CollectiveCall& call,
                const CollectiveContext&, PlanState*, const char* name) {
  throw Error(ErrorCode::NotSupported, describe(call) + ": " + name + ": this build of ferry has no CUDA kernels");
}

}  // namespace ferry::executor
