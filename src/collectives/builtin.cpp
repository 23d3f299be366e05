#include "collectives/builtin.hpp"

#include "collectives/p2p_collectives.hpp"

namespace ferry {

std::vector<const Algorithm*> builtinAlgorithms() {
  std::vector<const Algorithm*> v;
  const auto direct = directAlgorithms();
  const auto copyEngine = copyEngineAlgorithms();
  const auto p2p = p2pCollectiveAlgorithms();
  for (const auto& group : {allReduceAlgorithms(), allGatherAlgorithms(), reduceScatterAlgorithms(),
                            allToAllAlgorithms(), broadcastAlgorithms(), reduceAlgorithms()}) {
    v.insert(v.end(), group.begin(), group.end());
    if (group.empty()) continue;
    // The zero-copy, copy-engine and send/recv variants follow the family's own, scratch-based ones.
    for (const auto& extra : {direct, copyEngine, p2p})
      for (const Algorithm* a : extra)
        if (a->collective() == group.front()->collective()) v.push_back(a);
  }
  return v;
}

}  // namespace ferry
