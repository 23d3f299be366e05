#include "ferry/topology.hpp"

#include <cuda_runtime_api.h>

#include <fstream>

#include "platform/cuda_check.hpp"
#include "core/logger.hpp"
#include "platform/ibverbs_api.hpp"
#include "platform/nvlink_matrix.hpp"
#include "platform/nvml_api.hpp"
#include "platform/pci_bus_id.hpp"

namespace ferry {

const char* toString(NvlinkRemote remote) {
  switch (remote) {
    case NvlinkRemote::Gpu: return "GPU";
    case NvlinkRemote::Switch: return "NVSwitch";
    case NvlinkRemote::Other: return "other";
    case NvlinkRemote::Unknown: return "unknown";
  }
  return "unknown";
}

namespace {

std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

// -1 when the kernel does not know (it writes -1 itself on machines with one NUMA node).
int numaNodeOf(const std::string& pciBusId) {
  std::ifstream file("/sys/bus/pci/devices/" + pciBusId + "/numa_node");
  int node = -1;
  if (!(file >> node)) return -1;
  return node;
}

GpuInfo describeGpu(int index) {
  GpuInfo gpu;
  gpu.index = index;
  cudaDeviceProp prop{};
  FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  gpu.name = prop.name;
  gpu.computeMajor = prop.major;
  gpu.computeMinor = prop.minor;
  gpu.totalMemoryBytes = prop.totalGlobalMem;
  gpu.smCount = prop.multiProcessorCount;
  char busId[32] = {};
  FERRY_CUDA_CHECK(cudaDeviceGetPCIBusId(busId, sizeof(busId), index));
  gpu.pciBusId = normalizePciBusId(busId);
  gpu.numaNode = numaNodeOf(gpu.pciBusId);
  return gpu;
}

// Fills gpus, or gpuStatus with why there are none (no driver, no device, a failed query).
void listGpus(Topology& topo) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the failure sticky for the caller's next CUDA call
    topo.gpuStatus = "cudaGetDeviceCount failed: " + describe(err);
    if (topo.driverVersion == 0) topo.gpuStatus += "; no NVIDIA driver is installed (libcuda.so.1 not found)";
    return;
  }
  if (count == 0) {
    topo.gpuStatus = "cudaGetDeviceCount found no device";
    return;
  }
  try {
    for (int i = 0; i < count; ++i) topo.gpus.push_back(describeGpu(i));
  } catch (const CudaError& e) {
    // Keep the GPUs already described; say where the list stops.
    topo.gpuStatus = "GPU " + std::to_string(topo.gpus.size()) + " of " + std::to_string(count) +
                     " could not be described: " + e.detail();
    FERRY_LOG(Warn, Transport) << topo.gpuStatus;
  }
}

void checkPeerAccess(Topology& topo) {
  const int n = static_cast<int>(topo.gpus.size());
  topo.peerAccess.assign(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) {
        topo.peerAccess[i][j] = true;
        continue;
      }
      int can = 0;
      if (cudaError_t err = cudaDeviceCanAccessPeer(&can, i, j); err != cudaSuccess) {
        (void)cudaGetLastError();
        FERRY_LOG(Warn, Transport) << "cudaDeviceCanAccessPeer(" << i << ", " << j
                                   << ") failed: " << describe(err) << "; reporting no peer access";
      }
      topo.peerAccess[i][j] = can != 0;
    }
  }
}

void findNvlinks(Topology& topo) {
  if (topo.gpus.empty()) {
    topo.nvlinkStatus = "no GPU";
    return;
  }
  std::vector<std::string> busIds;
  for (const GpuInfo& gpu : topo.gpus) busIds.push_back(gpu.pciBusId);
  nvml::NvlinkReport report = nvml::queryNvlinks(busIds);
  if (!report.available) {
    topo.nvlinkStatus = report.reason;
    FERRY_LOG(Info, Transport) << "NVLink topology unknown: " << report.reason;
    return;
  }
  for (std::size_t i = 0; i < topo.gpus.size(); ++i) topo.gpus[i].nvlinks = std::move(report.links[i]);
  topo.nvlink = nvlinkMatrix(topo.gpus);
}

}  // namespace

Topology queryTopology() {
  Topology topo;
  // Both report through their argument and succeed even without a driver (driverVersion stays 0).
  (void)cudaDriverGetVersion(&topo.driverVersion);
  (void)cudaRuntimeGetVersion(&topo.runtimeVersion);
  listGpus(topo);
  checkPeerAccess(topo);
  findNvlinks(topo);
  ibverbs::DeviceList ib = ibverbs::listDevices();
  topo.ibDevices = std::move(ib.names);
  topo.ibSource = std::move(ib.source);
  topo.ibStatus = std::move(ib.reason);
  return topo;
}

}  // namespace ferry
