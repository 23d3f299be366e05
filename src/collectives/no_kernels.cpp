// A build without CUDA (FERRY_BUILD_CUDA=OFF) has no collective kernels: every collective then has
// no algorithm, and a Comm call says so.
#include "collectives/algorithm.hpp"

namespace ferry {

std::vector<const Algorithm*> allReduceAlgorithms() { return {}; }
std::vector<const Algorithm*> allGatherAlgorithms() { return {}; }
std::vector<const Algorithm*> reduceScatterAlgorithms() { return {}; }
std::vector<const Algorithm*> allToAllAlgorithms() { return {}; }
std::vector<const Algorithm*> broadcastAlgorithms() { return {}; }

}  // namespace ferry
