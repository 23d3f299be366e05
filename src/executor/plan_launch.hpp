#pragma once
// The executor's kernel launch (executor.cu; a build without CUDA has a stub that throws).
#include "kernels/collective_call.hpp"
#include "kernels/device_context.hpp"
#include "executor/device_plans.hpp"
#include "executor/plan.hpp"

namespace ferry::executor {

// A plan's own device memory in a Comm: its blocks' barrier (the plan's barrier op, and the end of
// a call). Zero when the Comm is made; the generation only grows.
struct PlanState {
  std::uint32_t barrierArrived;
  std::uint32_t barrierGeneration;
};

// Queues one call of `plan` on call.stream: one block per thread block of this rank's program.
// @pre the plan's whyNot for the call is empty.
// Loads every instantiation of the executor's kernel (launch.hpp, preloadKernel).
void preloadPlanKernels();

void launchPlan(const Plan& plan, const RankProgram& program, const DeviceProgram& device,
                const CollectiveCall& call, const CollectiveContext& context, PlanState* state, const char* name);

}  // namespace ferry::executor
