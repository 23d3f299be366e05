#pragma once
// What this machine offers for communication: the CUDA driver and runtime, each visible GPU, which
// GPU pairs can map each other's memory, how many NVLink links join each pair, and the InfiniBand
// devices. ferry-info prints it; algorithm selection will read it.
//
// queryTopology() never throws for a missing piece: with no GPU, no driver, no NVML or no
// libibverbs the matching part is empty and its *Status string says why. It never creates an NVLink
// multicast object (architecture.md rule 1).
//
//   ferry::Topology topo = ferry::queryTopology();
//   if (topo.gpus.empty()) std::cout << "No CUDA GPU visible: " << topo.gpuStatus << "\n";
//   else if (topo.nvlink.empty()) std::cout << "NVLink unknown: " << topo.nvlinkStatus << "\n";
//   else std::cout << topo.nvlink[0][1].links << " links between GPU 0 and 1\n";
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/api.hpp"

namespace ferry {

// What the far end of one NVLink link is.
enum class NvlinkRemote {
  Gpu,      // another GPU, directly
  Switch,   // an NVSwitch (HGX H100/H200: every link); all GPUs on the switches reach each other
  Other,    // a CPU or bridge (e.g. IBM NPU)
  Unknown,  // NVML did not say and the PCI address is not a GPU it knows
};
FERRY_API const char* toString(NvlinkRemote remote);

// One active NVLink link of a GPU.
struct NvlinkLink {
  int link = 0;  // link index on this GPU (0 .. 17)
  NvlinkRemote remote = NvlinkRemote::Unknown;
  std::string remotePciBusId;  // normalized like GpuInfo::pciBusId; empty when unknown
};

struct GpuInfo {
  int index = 0;     // CUDA device ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;  // e.g. "NVIDIA H200"
  int computeMajor = 0;
  int computeMinor = 0;
  std::uint64_t totalMemoryBytes = 0;
  int smCount = 0;
  std::string pciBusId;             // "0000:18:00.0": lowercase, as in /sys/bus/pci/devices
  int numaNode = -1;                // -1: unknown, or a machine with one NUMA node
  std::vector<NvlinkLink> nvlinks;  // active links only; empty without NVML or NVLink
};

// The NVLink connection between two GPUs.
struct NvlinkPair {
  int links = 0;           // 0: no NVLink between them
  bool viaSwitch = false;  // links go through NVSwitch: links = min(active switch links of the two)
};

struct Topology {
  int driverVersion = 0;   // cudaDriverGetVersion, e.g. 13000; 0 when no driver is installed
  int runtimeVersion = 0;  // cudaRuntimeGetVersion of the runtime libferry.so uses

  std::vector<GpuInfo> gpus;
  std::string gpuStatus;  // empty when GPUs were listed; otherwise why there are none

  // peerAccess[i][j]: GPU i can map GPU j's memory (cudaDeviceCanAccessPeer); true on the diagonal.
  std::vector<std::vector<bool>> peerAccess;

  // nvlink[i][j] for every GPU pair (diagonal: 0 links); empty when NVML could not tell.
  std::vector<std::vector<NvlinkPair>> nvlink;
  std::string nvlinkStatus;  // empty when NVML answered; otherwise why nvlink is empty

  std::vector<std::string> ibDevices;  // e.g. "mlx5_0"
  std::string ibSource;                // "libibverbs" or "/sys/class/infiniband"; empty if neither
  std::string ibStatus;                // empty when a source answered; otherwise why none did
};

// Queries the local machine. Takes well under a second; call it once and keep the result.
FERRY_API Topology queryTopology();

}  // namespace ferry
