#include "platform/nvml_api.hpp"

#include <cstddef>

#include "core/dynamic_library.hpp"
#include "core/logger.hpp"
#include "platform/pci_bus_id.hpp"

namespace ferry::nvml {

// nvmlPciInfo_t: 16 chars, five unsigned ints, 32 chars; no padding anywhere.
static_assert(sizeof(PciInfo) == 68, "nvmlPciInfo_t layout");
static_assert(offsetof(PciInfo, domain) == 16 && offsetof(PciInfo, pciSubSystemId) == 32 &&
                  offsetof(PciInfo, busId) == 36,
              "nvmlPciInfo_t layout");

namespace {

// Signatures as in nvml.h; enum arguments (nvmlEnableState_t, nvmlIntNvLinkDeviceType_t) are int.
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using HandleByPciBusIdFn = Return (*)(const char* pciBusId, Device* device);
using NvLinkStateFn = Return (*)(Device device, unsigned link, int* isActive);
using NvLinkRemotePciInfoFn = Return (*)(Device device, unsigned link, PciInfo* pci);
using NvLinkRemoteDeviceTypeFn = Return (*)(Device device, unsigned link, int* type);

// NVML loaded and initialized for as long as the object lives.
class Session {
 public:
  Session() : lib_(DynamicLibrary::open({"libnvidia-ml.so.1", "libnvidia-ml.so"})) {
    if (!lib_) {
      reason_ = "NVML not found (" + lib_.error() + ")";
      return;
    }
    init_ = lib_.symbol<InitFn>("nvmlInit_v2");
    shutdown_ = lib_.symbol<ShutdownFn>("nvmlShutdown");
    errorString_ = lib_.symbol<ErrorStringFn>("nvmlErrorString");
    handleByPciBusId = lib_.symbol<HandleByPciBusIdFn>("nvmlDeviceGetHandleByPciBusId_v2");
    linkState = lib_.symbol<NvLinkStateFn>("nvmlDeviceGetNvLinkState");
    remotePciInfo = lib_.symbol<NvLinkRemotePciInfoFn>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    // Older drivers lack it; remoteKind() then tells GPUs from the rest by their PCI address.
    remoteDeviceType = lib_.symbol<NvLinkRemoteDeviceTypeFn>("nvmlDeviceGetNvLinkRemoteDeviceType");
    if (!init_ || !shutdown_ || !handleByPciBusId || !linkState || !remotePciInfo) {
      reason_ = lib_.name() + " lacks the NVLink queries ferry needs (driver too old?)";
      return;
    }
    if (Return r = init_(); r != kSuccess) {
      reason_ = "nvmlInit_v2 failed: " + describe(r);
      return;
    }
    initialized_ = true;
  }
  ~Session() {
    if (initialized_) shutdown_();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool ok() const { return initialized_; }
  const std::string& reason() const { return reason_; }

  std::string describe(Return r) const {
    std::string text = errorString_ ? errorString_(r) : "NVML error";
    return text + " (" + std::to_string(r) + ")";
  }

  NvlinkRemote remoteKind(Device device, unsigned link, const std::string& remoteBusId) const {
    int type = kLinkDeviceUnknown;
    if (remoteDeviceType && remoteDeviceType(device, link, &type) == kSuccess) {
      switch (type) {
        case kLinkDeviceGpu: return NvlinkRemote::Gpu;
        case kLinkDeviceSwitch: return NvlinkRemote::Switch;
        case kLinkDeviceIbmNpu: return NvlinkRemote::Other;
        default: break;
      }
    }
    Device other = nullptr;
    if (!remoteBusId.empty() && handleByPciBusId(remoteBusId.c_str(), &other) == kSuccess)
      return NvlinkRemote::Gpu;
    return NvlinkRemote::Unknown;
  }

  HandleByPciBusIdFn handleByPciBusId = nullptr;
  NvLinkStateFn linkState = nullptr;
  NvLinkRemotePciInfoFn remotePciInfo = nullptr;
  NvLinkRemoteDeviceTypeFn remoteDeviceType = nullptr;

 private:
  DynamicLibrary lib_;
  InitFn init_ = nullptr;
  ShutdownFn shutdown_ = nullptr;
  ErrorStringFn errorString_ = nullptr;
  bool initialized_ = false;
  std::string reason_;
};

std::vector<NvlinkLink> activeLinks(const Session& nvml, const std::string& busId) {
  std::vector<NvlinkLink> links;
  Device device = nullptr;
  if (Return r = nvml.handleByPciBusId(busId.c_str(), &device); r != kSuccess) {
    FERRY_LOG(Warn, Transport) << "nvmlDeviceGetHandleByPciBusId_v2(" << busId
                               << ") failed: " << nvml.describe(r) << "; its NVLink links are not listed";
    return links;
  }
  for (unsigned link = 0; link < kMaxLinks; ++link) {
    // Links past the GPU's count answer INVALID_ARGUMENT, and GPUs without NVLink NOT_SUPPORTED:
    // both simply mean "no link here".
    int active = 0;
    if (nvml.linkState(device, link, &active) != kSuccess || active != kFeatureEnabled) continue;
    NvlinkLink entry;
    entry.link = static_cast<int>(link);
    PciInfo pci{};
    // Inside a VM NVML answers all ones ("FFFFFFFF:FF:FF.0") for switches the guest cannot see.
    if (nvml.remotePciInfo(device, link, &pci) == kSuccess && pci.domain != 0xFFFFFFFFu) {
      pci.busId[sizeof(pci.busId) - 1] = '\0';
      entry.remotePciBusId = normalizePciBusId(pci.busId);
    }
    entry.remote = nvml.remoteKind(device, link, entry.remotePciBusId);
    links.push_back(std::move(entry));
  }
  return links;
}

}  // namespace

NvlinkReport queryNvlinks(std::span<const std::string> pciBusIds) {
  NvlinkReport report;
  Session nvml;
  if (!nvml.ok()) {
    report.reason = nvml.reason();
    return report;
  }
  report.available = true;
  for (const std::string& busId : pciBusIds) report.links.push_back(activeLinks(nvml, busId));
  return report;
}

}  // namespace ferry::nvml
