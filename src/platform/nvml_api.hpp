#pragma once
// The few NVML calls ferry makes, loaded with dlopen (libnvidia-ml.so.1 ships with the driver, not
// with the CUDA toolkit, so there is no nvml.h to build against). The declarations below copy NVML's
// ABI exactly; the static_asserts in nvml_api.cpp pin the struct layout.
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "ferry/topology.hpp"

namespace ferry::nvml {

using Return = int;  // nvmlReturn_t (an enum); 0 is NVML_SUCCESS
inline constexpr Return kSuccess = 0;

struct DeviceOpaque;
using Device = DeviceOpaque*;  // nvmlDevice_t

inline constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
inline constexpr int kFeatureEnabled = 1;  // nvmlEnableState_t NVML_FEATURE_ENABLED

// nvmlIntNvLinkDeviceType_t
inline constexpr int kLinkDeviceGpu = 0x00;
inline constexpr int kLinkDeviceIbmNpu = 0x01;
inline constexpr int kLinkDeviceSwitch = 0x02;
inline constexpr int kLinkDeviceUnknown = 0xFF;

// nvmlPciInfo_t, field for field.
struct PciInfo {
  char busIdLegacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE, "00000000:18:00.0"
};

// The active NVLink links of each GPU, or why they are unknown.
struct NvlinkReport {
  bool available = false;
  std::string reason;                          // set when !available
  std::vector<std::vector<NvlinkLink>> links;  // links[i] for pciBusIds[i]
};

// Loads NVML, asks it for the active links of each GPU (PCI bus ids as GpuInfo::pciBusId) and
// shuts it down again. Never throws; a GPU NVML does not know gets no links and a log line.
NvlinkReport queryNvlinks(std::span<const std::string> pciBusIds);

}  // namespace ferry::nvml
