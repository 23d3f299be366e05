#include "platform/fabric.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "platform/nvml_api.hpp"
#include "platform/pci_bus_id.hpp"

namespace ferry {

const char* toString(Fabric fabric) {
  switch (fabric) {
    case Fabric::Pcie: return "pcie";
    case Fabric::NvLink: return "nvlink";
    case Fabric::NvSwitch: return "nvswitch";
    case Fabric::Unknown: break;
  }
  return "unknown";
}

std::optional<Fabric> parseFabric(std::string_view name) {
  for (Fabric f : {Fabric::Unknown, Fabric::Pcie, Fabric::NvLink, Fabric::NvSwitch})
    if (name == toString(f)) return f;
  return std::nullopt;
}

Fabric gpuFabric(std::span<const NvlinkLink> links, bool nvlinksKnown) {
  if (!nvlinksKnown) return Fabric::Unknown;
  if (links.empty()) return Fabric::Pcie;
  const bool allSwitch =
      std::ranges::all_of(links, [](const NvlinkLink& l) { return l.remote == NvlinkRemote::Switch; });
  return allSwitch ? Fabric::NvSwitch : Fabric::NvLink;
}

Fabric commFabric(std::span<const Fabric> ranks) {
  // The enum runs from the weakest to the strongest, Unknown first.
  Fabric out = Fabric::NvSwitch;
  for (Fabric f : ranks) out = std::min(out, f);
  return ranks.empty() ? Fabric::Unknown : out;
}

Fabric localFabric(int device) {
  static std::mutex mutex;
  static std::map<int, Fabric> known;
  std::lock_guard lock(mutex);
  if (auto it = known.find(device); it != known.end()) return it->second;
  char busId[32] = {};
  Fabric fabric = Fabric::Unknown;
  if (cudaDeviceGetPCIBusId(busId, sizeof busId, device) == cudaSuccess) {
    const std::string ids[] = {normalizePciBusId(busId)};
    const nvml::NvlinkReport report = nvml::queryNvlinks(ids);
    fabric = gpuFabric(report.available ? report.links[0] : std::vector<NvlinkLink>{}, report.available);
  } else {
    (void)cudaGetLastError();
  }
  known[device] = fabric;
  return fabric;
}

}  // namespace ferry
