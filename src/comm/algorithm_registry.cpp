#include "comm/algorithm_registry.hpp"

#include <algorithm>
#include <string>

#include "collectives/builtin.hpp"
#include "executor/plan_algorithm.hpp"
#include "ferry/errors.hpp"

namespace ferry {

const std::vector<const Algorithm*>& allAlgorithms() {
  static const std::vector<const Algorithm*> all = [] {
    std::vector<const Algorithm*> v = builtinAlgorithms();
    for (const Algorithm* a : executor::planAlgorithms()) v.push_back(a);
    return v;
  }();
  return all;
}

const Algorithm* findAlgorithm(std::string_view name) {
  for (const Algorithm* a : allAlgorithms())
    if (name == a->name()) return a;
  return nullptr;
}

std::string_view toString(AlgorithmKind kind) noexcept {
  switch (kind) {
    case AlgorithmKind::Builtin: return "builtin";
    case AlgorithmKind::Plan: return "plan";
    case AlgorithmKind::Native: return "native";
  }
  return "invalid";
}

AlgorithmRegistry::AlgorithmRegistry() {
  const auto& plans = executor::planAlgorithms();
  for (const Algorithm* a : allAlgorithms()) {
    const bool plan = std::find(plans.begin(), plans.end(), a) != plans.end();
    entries_.push_back({a, plan ? AlgorithmKind::Plan : AlgorithmKind::Builtin, nullptr, 0});
  }
}

const Algorithm* AlgorithmRegistry::find(std::string_view name) const {
  for (const Entry& e : entries_)
    if (name == e.algorithm->name()) return e.algorithm;
  return nullptr;
}

void AlgorithmRegistry::add(const Algorithm* algorithm, AlgorithmKind kind, std::shared_ptr<const void> owner) {
  if (find(algorithm->name()) != nullptr)
    throw Error(ErrorCode::InvalidUsage, std::string("an algorithm named '") + algorithm->name() +
                                             "' is already registered; remove it first or choose another name");
  entries_.push_back({algorithm, kind, std::move(owner), ++added_});
  ++version_;
}

AlgorithmRegistry::Entry AlgorithmRegistry::remove(std::string_view name) {
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return name == e.algorithm->name(); });
  if (it == entries_.end())
    throw Error(ErrorCode::InvalidUsage, "no algorithm named '" + std::string(name) + "' is registered");
  Entry e = std::move(*it);
  entries_.erase(it);
  ++version_;
  return e;
}

}  // namespace ferry
