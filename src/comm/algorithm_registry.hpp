#pragma once
// The algorithms of one Comm (ferry/algorithm.hpp): what it starts with, the built-in ones
// (collectives/builtin.hpp) and the plans of FERRY_PLAN_DIR (executor/plan_algorithm.hpp), then
// what the program adds and removes at run time. Grouped by collective only in the listing: the
// selector goes by kind and order (selector.hpp).
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ferry/algorithm.hpp"
#include "kernels/algorithm.hpp"

namespace ferry {

// The algorithms every Comm starts with, in order: the built-in ones grouped by collective, then
// FERRY_PLAN_DIR's plans (loaded once per process).
const std::vector<const Algorithm*>& allAlgorithms();
// One of allAlgorithms() by name; nullptr when there is none.
const Algorithm* findAlgorithm(std::string_view name);

class AlgorithmRegistry {
 public:
  struct Entry {
    const Algorithm* algorithm = nullptr;
    AlgorithmKind kind = AlgorithmKind::Builtin;
    std::shared_ptr<const void> owner;  // keeps an added algorithm alive; null for the starting ones
    std::uint64_t added = 0;            // 0 for the starting ones, then 1, 2, ... in order of adding
  };

  // allAlgorithms(), the plans among them as AlgorithmKind::Plan.
  AlgorithmRegistry();

  // In order: the starting algorithms, then the added ones in order of adding.
  const std::vector<Entry>& entries() const { return entries_; }
  // nullptr when there is none of that name.
  const Algorithm* find(std::string_view name) const;
  // Error(InvalidUsage) when the name is taken.
  void add(const Algorithm* algorithm, AlgorithmKind kind, std::shared_ptr<const void> owner);
  // Error(InvalidUsage) when no algorithm has that name. Returns the entry, whose owner the caller
  // keeps while queued work may still run the algorithm.
  Entry remove(std::string_view name);
  // Changes with every add and remove: what the selector's caches compare.
  std::uint64_t version() const { return version_; }

 private:
  std::vector<Entry> entries_;
  std::uint64_t added_ = 0;
  std::uint64_t version_ = 0;
};

}  // namespace ferry
