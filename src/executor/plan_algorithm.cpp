#include "executor/plan_algorithm.hpp"

#include <algorithm>
#include <filesystem>

#include "core/logger.hpp"
#include "executor/device_plans.hpp"
#include "executor/plan_launch.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry::executor {
namespace {

std::string rangeText(const Plan& p) {
  return "[" + std::to_string(p.minBytes) + ", " + std::to_string(p.maxBytes) + "]";
}

}  // namespace

PlanAlgorithm::PlanAlgorithm(const std::string& planName, ferry::Collective collective)
    : name_("plan:" + planName), collective_(collective) {}

void PlanAlgorithm::add(Plan plan, const std::string& source) {
  const int w = static_cast<int>(plan.worldSize);
  if (auto it = sources_.find(w); it != sources_.end())
    throw Error(ErrorCode::InvalidUsage, "plan " + source + ": " + name_ + " for " + std::to_string(w) +
                                             " ranks is already loaded from " + it->second +
                                             "; give one of them another name");
  Entry e;
  for (int r = 0; r < w; ++r) {
    try {
      e.programs.push_back(compileRankProgram(plan, r));
    } catch (const PlanError& err) {
      throw Error(ErrorCode::InvalidUsage, "plan " + source + ": " + err.detail());
    }
  }
  // Direct mode is the whole plan's: every rank publishes its buffers when any rank uses a peer's.
  bool direct = false;
  for (const RankProgram& p : e.programs) direct = direct || p.touchesPeerBuffers;
  const bool finalExchange = direct && !peersWaitOutAccesses(e.programs);
  for (RankProgram& p : e.programs) {
    p.touchesPeerBuffers = direct;
    p.finalExchange = finalExchange;
    if (env().planFuse) fuseRankProgram(p);  // runs of data ops as one op each (rank_program.hpp)
  }
  e.plan = std::move(plan);
  byWorld_.emplace(w, std::move(e));
  sources_.emplace(w, source);
}

const PlanAlgorithm::Entry* PlanAlgorithm::forWorldSize(int worldSize) const {
  auto it = byWorld_.find(worldSize);
  return it == byWorld_.end() ? nullptr : &it->second;
}

std::uint64_t planInputBytes(const CollectiveCall& call) {
  const bool blocks = call.collective == ferry::Collective::ReduceScatter || call.collective == ferry::Collective::AllToAll;
  return call.count * call.elementBytes() * (blocks ? static_cast<std::uint64_t>(call.worldSize) : 1);
}

std::string PlanAlgorithm::whyNot(const CollectiveCall& call, const CommLimits& limits) const {
  const Entry* e = forWorldSize(limits.worldSize);
  if (e == nullptr) {
    std::string have;
    for (const auto& [w, _] : byWorld_) have += (have.empty() ? "" : ", ") + std::to_string(w);
    return "it has plans for " + have + " ranks, not " + std::to_string(limits.worldSize);
  }
  const Plan& p = e->plan;
  const std::uint64_t in = planInputBytes(call);
  if (in < static_cast<std::uint64_t>(p.minBytes) || in > static_cast<std::uint64_t>(p.maxBytes))
    return std::to_string(in) + " input bytes per rank lie outside the plan's range " + rangeText(p);
  // A broadcast's send buffer counts only on the root, so whether a call is in place is not what
  // every rank sees alike, and the ranks must decide alike. A broadcast plan takes both: on an
  // in-place root its copy of the input to the output moves each element onto itself.
  if (p.collective != Collective::Broadcast && call.inPlace() != p.inplace)
    return p.inplace ? "the plan is for in-place calls only" : "the plan is for out-of-place calls only";
  if (p.collective == Collective::Broadcast && p.root != call.root)
    return "the plan broadcasts from rank " + std::to_string(p.root) + ", not " + std::to_string(call.root);
  const int blocks = e->programs.front().widestRank;  // the most of any rank: every rank must decide alike
  if (blocks > limits.maxBlocks)
    return "it runs " + std::to_string(blocks) + " thread blocks; the Comm allows " +
           std::to_string(limits.maxBlocks) + " (CommOptions::maxBlocks, maxCTAs)";
  const bool ll = p.protocol == Protocol::LL;
  const std::uint64_t room = ll ? 2 * limits.llSlotDataBytes * static_cast<std::uint64_t>(limits.worldSize)
                                : limits.scratchHalfBytes;
  if (planRounds(p, call.count, call.elementBytes(), room).count == 0)
    return "its " + std::to_string(p.chunks.scratch) + " scratch chunks do not fit the " +
           std::to_string(room) + " bytes of " +
           (ll ? "a packet half (FERRY_LL_BYTES)" : "a scratch half (FERRY_SCRATCH_BYTES)") +
           " even 16 bytes each";
  return {};
}

std::size_t PlanAlgorithm::deviceStateBytes() const { return sizeof(PlanState); }

void PlanAlgorithm::launch(const CollectiveCall& call, const CollectiveContext& context, void* state) const {
  const Entry& e = *forWorldSize(call.worldSize);
  const RankProgram& prog = e.programs[static_cast<std::size_t>(call.rank)];
  const DeviceProgram* dev = context.plans ? context.plans->find(&prog) : nullptr;
  if (dev == nullptr)
    throw Error(ErrorCode::InternalError, describe(call) + ": " + name_ + " was not uploaded to this Comm's GPU");
  launchPlan(e.plan, prog, *dev, call, context, static_cast<PlanState*>(state), name_.c_str());
}

std::string PlanAlgorithm::constraints(const CommLimits& limits) const {
  const Entry* e = forWorldSize(limits.worldSize);
  if (e == nullptr) return "no plan for " + std::to_string(limits.worldSize) + " ranks";
  const Plan& p = e->plan;
  std::string text = std::to_string(p.worldSize) + " ranks; input bytes per rank in " + rangeText(p) + "; " +
                     (p.inplace ? "in place" : "out of place");
  if (p.collective == Collective::Broadcast) text += "; root " + std::to_string(p.root);
  return text;
}

bool PlanAlgorithm::needsRegisteredBuffers(const CollectiveCall& call) const {
  const Entry* e = forWorldSize(call.worldSize);
  return e != nullptr && e->programs[static_cast<std::size_t>(call.rank)].touchesPeerBuffers;
}

void PlanAlgorithm::preload() const { preloadPlanKernels(); }

std::vector<std::unique_ptr<PlanAlgorithm>> loadPlanAlgorithms(const std::string& spec) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t colon = std::min(spec.find(':', start), spec.size());
    const std::string item = spec.substr(start, colon - start);
    start = colon + 1;
    if (item.empty()) continue;
    std::error_code ec;
    if (fs::is_directory(item, ec)) {
      std::vector<std::string> inDir;
      for (const auto& f : fs::directory_iterator(item, ec))
        if (f.path().extension() == ".json") inDir.push_back(f.path().string());
      std::sort(inDir.begin(), inDir.end());
      files.insert(files.end(), inDir.begin(), inDir.end());
    } else if (fs::exists(item, ec)) {
      files.push_back(item);
    } else {
      throw Error(ErrorCode::InvalidUsage,
                  "FERRY_PLAN_DIR: '" + item + "' is neither a plan file nor a directory of plans");
    }
  }
  std::vector<std::unique_ptr<PlanAlgorithm>> out;
  for (const std::string& f : files) {
    Plan plan;
    try {
      plan = loadPlanFile(f);
    } catch (const PlanError& e) {
      throw Error(ErrorCode::InvalidUsage, "plan " + f + ": " + e.detail());
    }
    const Collective coll = plan.collective;
    const std::string name = "plan:" + plan.name;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& a) { return name == a->name(); });
    if (it != out.end() && (*it)->collective() != coll)
      throw Error(ErrorCode::InvalidUsage, "plan " + f + ": " + name + " is already a plan of " +
                                               std::string(toString((*it)->collective())) + "; give it another name");
    if (it == out.end()) {
      out.push_back(std::make_unique<PlanAlgorithm>(plan.name, coll));
      it = out.end() - 1;
    }
    (*it)->add(std::move(plan), f);
    FERRY_LOG(Info, Executor) << "loaded plan " << f << " as " << name;
  }
  return out;
}

const std::vector<const Algorithm*>& planAlgorithms() {
  static const std::vector<std::unique_ptr<PlanAlgorithm>> owned = loadPlanAlgorithms(env().planDir);
  static const std::vector<const Algorithm*> all = [] {
    std::vector<const Algorithm*> v;
    for (const auto& a : owned) v.push_back(a.get());
    return v;
  }();
  return all;
}

}  // namespace ferry::executor
