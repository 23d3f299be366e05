#pragma once
// How many NVLink links join each GPU pair, from each GPU's active links.
//
// Direct NVLink (DGX-1, PCIe cards with bridges): the links of GPU i whose far end is GPU j.
// NVSwitch (HGX H100/H200): every link goes to a switch and any GPU reaches any other through the
// switches, so a pair gets min(switch links of i, switch links of j), marked viaSwitch.
//
//   GPU 0: 18 links -> Switch, GPU 1: 18 links -> Switch      => nvlink[0][1] = {18, viaSwitch}
//   GPU 0: links 0,1 -> GPU 1 (0000:1b:00.0), link 2 -> GPU 2 => nvlink[0][1] = {2, direct}
#include <span>
#include <vector>

#include "ferry/topology.hpp"

namespace ferry {

// Pure: reads gpus[k].pciBusId and gpus[k].nvlinks (bus ids normalized) and nothing else.
// @post result is gpus.size() x gpus.size(), with {0, false} on the diagonal.
std::vector<std::vector<NvlinkPair>> nvlinkMatrix(std::span<const GpuInfo> gpus);

}  // namespace ferry
