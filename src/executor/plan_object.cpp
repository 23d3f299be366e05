// ferry::Plan (ferry/algorithm.hpp): a loaded plan, compiled for every rank, shared by the Comms
// it is added to.
#include <string>

#include "executor/plan_algorithm.hpp"
#include "ferry/algorithm.hpp"
#include "ferry/errors.hpp"

namespace ferry {

struct Plan::Impl {
  Impl(executor::Plan plan, const std::string& source)
      : algorithm(plan.name, plan.collective) {
    algorithm.add(std::move(plan), source);  // compiles every rank's program; throws InvalidUsage
  }
  const executor::Plan& plan() const { return algorithm.entries().begin()->second.plan; }

  executor::PlanAlgorithm algorithm;
};

Plan::Plan(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Plan Plan::fromFile(const std::string& path) {
  executor::Plan plan;
  try {
    plan = executor::loadPlanFile(path);
  } catch (const executor::PlanError& e) {
    throw Error(ErrorCode::InvalidUsage, "plan " + path + ": " + e.detail());
  }
  return Plan(std::make_shared<const Impl>(std::move(plan), path));
}

Plan Plan::fromJson(std::string_view json, std::string_view source) {
  executor::Plan plan;
  try {
    plan = executor::loadPlan(json);
  } catch (const executor::PlanError& e) {
    throw Error(ErrorCode::InvalidUsage, "plan from " + std::string(source) + ": " + e.detail());
  }
  return Plan(std::make_shared<const Impl>(std::move(plan), std::string(source)));
}

const std::string& Plan::name() const { return impl_->plan().name; }
std::string Plan::algorithmName() const { return impl_->algorithm.name(); }
Collective Plan::collective() const { return impl_->algorithm.collective(); }
int Plan::worldSize() const { return static_cast<int>(impl_->plan().worldSize); }
bool Plan::inPlace() const { return impl_->plan().inplace; }
std::size_t Plan::minBytes() const { return static_cast<std::size_t>(impl_->plan().minBytes); }
std::size_t Plan::maxBytes() const { return static_cast<std::size_t>(impl_->plan().maxBytes); }

namespace executor {

const PlanAlgorithm& algorithmOf(const ferry::Plan& plan) { return plan.impl()->algorithm; }

}  // namespace executor
}  // namespace ferry
