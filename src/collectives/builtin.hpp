#pragma once
// The built-in algorithms of every collective, defined beside their kernels, each list in order of
// preference when nothing else decides. The Comm registers them all when it is made
// (comm/algorithm_registry.hpp).
//
// Adding one: implement kernels/algorithm.hpp's interface in a .cu file of this folder, return it
// from its family's list below and, if it should be picked by default, give it rows in
// defaultTuning() (comm/tuning.cpp).
#include <vector>

#include "kernels/algorithm.hpp"

namespace ferry {

std::vector<const Algorithm*> allReduceAlgorithms();
std::vector<const Algorithm*> allGatherAlgorithms();
std::vector<const Algorithm*> reduceScatterAlgorithms();
std::vector<const Algorithm*> allToAllAlgorithms();
std::vector<const Algorithm*> broadcastAlgorithms();
// broadcast_scatter (broadcast_scatter.cu), one of broadcastAlgorithms().
const Algorithm& broadcastScatterAlgorithm();
std::vector<const Algorithm*> reduceAlgorithms();
// reduce_chain, broadcast_chain, reducescatter_ring and allreduce_ring_pipelined (chain.cu), of
// reduceAlgorithms(), broadcastAlgorithms(), reduceScatterAlgorithms() and allReduceAlgorithms().
const Algorithm& reduceChainAlgorithm();
const Algorithm& reduceScatterRingAlgorithm();
const Algorithm& allReduceRingPipelinedAlgorithm();
const Algorithm& broadcastChainAlgorithm();
// The zero-copy algorithms of every collective (direct.cu), on registered buffers only.
std::vector<const Algorithm*> directAlgorithms();
// The copy-engine algorithms (ce_collectives.cu), on registered buffers only.
std::vector<const Algorithm*> copyEngineAlgorithms();

// Every built-in algorithm, grouped by collective, each group in order of preference.
std::vector<const Algorithm*> builtinAlgorithms();

}  // namespace ferry
