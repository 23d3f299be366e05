#pragma once
// How the GPUs of a Comm are joined, as far as choosing an algorithm goes: through NVSwitch (every
// pair at full NVLink bandwidth), by direct NVLink links (some pairs may have fewer, or none), or
// over PCIe only. A tuning row may name one ("topology"), so a table measured on one kind of
// machine is not applied on another; rows without it (the built-in ones) apply everywhere.
#include <optional>
#include <span>
#include <string_view>

#include "ferry/topology.hpp"

namespace ferry {

enum class Fabric { Unknown, Pcie, NvLink, NvSwitch };

// "unknown", "pcie", "nvlink", "nvswitch": the spellings tuning files use.
const char* toString(Fabric fabric);
std::optional<Fabric> parseFabric(std::string_view name);

// One GPU's, from its active NVLink links (nvlinksKnown: NVML answered): every link to a switch
// is NvSwitch, any other link NvLink, no link Pcie.
Fabric gpuFabric(std::span<const NvlinkLink> links, bool nvlinksKnown);

// A Comm's, from its ranks' GPUs: the slowest of them, and Unknown if any is.
Fabric commFabric(std::span<const Fabric> ranks);

// The fabric of CUDA device `device` of this process (asks NVML once per device and process).
Fabric localFabric(int device);

}  // namespace ferry
