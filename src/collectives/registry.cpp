#include "collectives/algorithm.hpp"

namespace ferry {

const std::vector<const Algorithm*>& allAlgorithms() {
  static const std::vector<const Algorithm*> all = [] {
    std::vector<const Algorithm*> v;
    for (auto group : {allReduceAlgorithms(), allGatherAlgorithms(), reduceScatterAlgorithms(),
                       allToAllAlgorithms(), broadcastAlgorithms()})
      v.insert(v.end(), group.begin(), group.end());
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
