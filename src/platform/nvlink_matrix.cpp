#include "platform/nvlink_matrix.hpp"

#include <algorithm>

namespace ferry {

std::vector<std::vector<NvlinkPair>> nvlinkMatrix(std::span<const GpuInfo> gpus) {
  const std::size_t n = gpus.size();
  std::vector<int> switchLinks(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    switchLinks[i] =
        static_cast<int>(std::ranges::count(gpus[i].nvlinks, NvlinkRemote::Switch, &NvlinkLink::remote));

  std::vector<std::vector<NvlinkPair>> matrix(n, std::vector<NvlinkPair>(n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      const int direct = static_cast<int>(std::ranges::count_if(gpus[i].nvlinks, [&](const NvlinkLink& l) {
        return l.remote == NvlinkRemote::Gpu && l.remotePciBusId == gpus[j].pciBusId;
      }));
      const int viaSwitch = std::min(switchLinks[i], switchLinks[j]);
      matrix[i][j] = NvlinkPair{direct + viaSwitch, viaSwitch > 0};
    }
  }
  return matrix;
}

}  // namespace ferry
