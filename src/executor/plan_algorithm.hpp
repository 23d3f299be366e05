#pragma once
// Plans as algorithms: every plan named NAME (one per world size) becomes the Algorithm
// "plan:NAME" of its collective, listed after the built-in ones, picked by the selector for the
// calls of its world size and size range (selector.hpp) or forced by name like any other.
//
//   FERRY_PLAN_DIR=/plans ferry-bench ...      // /plans/*.json load at first use
//   comm.setAlgorithm(Collective::AllReduce, "plan:allreduce_ring");
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/algorithm.hpp"
#include "kernels/algorithm.hpp"
#include "executor/plan.hpp"
#include "executor/rank_program.hpp"

namespace ferry::executor {

class PlanAlgorithm final : public Algorithm {
 public:
  struct Entry {
    Plan plan;
    std::vector<RankProgram> programs;  // one per rank
  };

  explicit PlanAlgorithm(const std::string& planName, ferry::Collective collective);
  // Adds the plan for its world size, compiled for every rank. Error(InvalidUsage) when a plan of
  // that name and world size is already there, or the plan breaks an executor rule (PlanError).
  void add(Plan plan, const std::string& source);

  const char* name() const override { return name_.c_str(); }
  ferry::Collective collective() const override { return collective_; }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override;
  void launch(const CollectiveCall& call, const CollectiveContext& context, void* state) const override;
  // Its blocks' barrier (plan_launch.hpp, PlanState).
  std::size_t deviceStateBytes() const override;
  // Plans that reach into the peers' input or output: unregistered calls run staged.
  bool needsRegisteredBuffers(const CollectiveCall& call) const override;
  std::string constraints(const CommLimits& limits) const override;
  bool reducesInRankOrder() const override { return false; }  // in the order the program wrote
  void preload() const override;

  // nullptr when there is no plan for this world size.
  const Entry* forWorldSize(int worldSize) const;
  const std::map<int, Entry>& entries() const { return byWorld_; }

 private:
  std::string name_;
  ferry::Collective collective_;
  std::map<int, Entry> byWorld_;
  std::map<int, std::string> sources_;
};

// Loads the plans `spec` names (FERRY_PLAN_DIR's syntax: files or directories of *.json, ':'
// between them), grouped into one algorithm per plan name, in order of first appearance (files of
// a directory in name order). Error(InvalidUsage) naming the file for anything wrong.
std::vector<std::unique_ptr<PlanAlgorithm>> loadPlanAlgorithms(const std::string& spec);

// The plans of FERRY_PLAN_DIR, loaded on first use and kept for the life of the process.
const std::vector<const Algorithm*>& planAlgorithms();

// The compiled algorithm of a public ferry::Plan (plan_object.cpp).
const PlanAlgorithm& algorithmOf(const ferry::Plan& plan);

// The collective's input bytes per rank for a call: what min_bytes and max_bytes bound.
std::uint64_t planInputBytes(const CollectiveCall& call);

}  // namespace ferry::executor
