#include "collectives/algorithm.hpp"
#include "executor/plan_algorithm.hpp"

namespace ferry {

const std::vector<const Algorithm*>& allAlgorithms() {
  static const std::vector<const Algorithm*> all = [] {
    std::vector<const Algorithm*> v;
    const auto direct = directAlgorithms();
    const auto copyEngine = copyEngineAlgorithms();
    for (auto group : {allReduceAlgorithms(), allGatherAlgorithms(), reduceScatterAlgorithms(),
                       allToAllAlgorithms(), broadcastAlgorithms(), reduceAlgorithms()}) {
      v.insert(v.end(), group.begin(), group.end());
      if (group.empty()) continue;
      for (const auto& extra : {direct, copyEngine})
        for (const Algorithm* a : extra)
          if (a->collective() == group.front()->collective()) v.push_back(a);
    }
    // Plans last: loaded from FERRY_PLAN_DIR, picked by the selector ahead of the table (selector.hpp).
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

}  // namespace ferry
