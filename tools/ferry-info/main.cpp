// ferry-info: what this machine offers ferry (CUDA, GPUs, peer access, NVLink, InfiniBand, the
// NVLink multicast gate), as text or JSON. Uses only the public API, like any user program.
//
//   ferry-info                  human-readable report; exit 0 also without a GPU
//   ferry-info --json           the same facts as one JSON object
//   ferry-info --env-markdown   the environment variable table as Markdown (docs/env.md)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/env.hpp"
#include "ferry/topology.hpp"
#include "ferry/version.hpp"

namespace {

using ferry::Topology;

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// 12080 -> "12.8"; 0 -> "none".
std::string cudaVersionText(int version) {
  if (version == 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10) + " (" +
         std::to_string(version) + ")";
}

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

struct NvlsVerdict {
  bool allowed;
  std::string why;
};

// Mirrors the rule nvlsAllowed() enforces (architecture.md rule 1), naming every reason that applies.
NvlsVerdict nvlsVerdict() {
  const ferry::Env& e = ferry::env();
  if (ferry::nvlsAllowed(e))
    return {true,
            "FERRY_ENABLE_NVLS=1, and neither NCCL_NVLS_ENABLE=0 nor TORCH_SYMM_MEM_DISABLE_MULTICAST=1"};
  std::vector<std::string> why;
  if (!e.enableNvls) why.push_back("FERRY_ENABLE_NVLS is not 1");
  if (trimmed(e.ncclNvlsEnable) == "0") why.push_back("NCCL_NVLS_ENABLE=0");
  if (e.torchSymmMemDisableMulticast) why.push_back("TORCH_SYMM_MEM_DISABLE_MULTICAST=1");
  if (why.empty()) why.push_back("ferry::nvlsAllowed() refuses");
  return {false, join(why, "; ")};
}

// "18 (18 to NVSwitch)", "4 (2 to GPU, 2 to other)".
std::string nvlinkSummary(const ferry::GpuInfo& gpu) {
  if (gpu.nvlinks.empty()) return "none active";
  std::map<std::string, int> byRemote;
  for (const ferry::NvlinkLink& link : gpu.nvlinks) ++byRemote[ferry::toString(link.remote)];
  std::vector<std::string> parts;
  for (const auto& [remote, count] : byRemote) parts.push_back(std::to_string(count) + " to " + remote);
  return std::to_string(gpu.nvlinks.size()) + " active (" + join(parts, ", ") + ")";
}

void printMatrix(std::size_t n, const std::function<std::string(std::size_t, std::size_t)>& cell) {
  std::printf("%8s", "");
  for (std::size_t j = 0; j < n; ++j) std::printf(" %6s", ("GPU" + std::to_string(j)).c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < n; ++i) {
    std::printf("  %-6s", ("GPU" + std::to_string(i)).c_str());
    for (std::size_t j = 0; j < n; ++j) std::printf(" %6s", i == j ? "-" : cell(i, j).c_str());
    std::printf("\n");
  }
}

void printText(const Topology& topo, const NvlsVerdict& nvls) {
  std::printf("ferry %s\n", FERRY_VERSION_STRING);
  std::printf("CUDA driver %s, runtime %s\n", cudaVersionText(topo.driverVersion).c_str(),
              cudaVersionText(topo.runtimeVersion).c_str());

  if (topo.gpus.empty()) {
    std::printf("No CUDA GPU visible: %s\n", topo.gpuStatus.c_str());
  } else {
    std::printf("GPUs: %zu\n", topo.gpus.size());
    for (const ferry::GpuInfo& gpu : topo.gpus) {
      std::printf("  GPU %d: %s, cc %d.%d, %s, %d SMs, PCI %s, NUMA node %s", gpu.index, gpu.name.c_str(),
                  gpu.computeMajor, gpu.computeMinor, gib(gpu.totalMemoryBytes).c_str(), gpu.smCount,
                  gpu.pciBusId.c_str(), gpu.numaNode < 0 ? "unknown" : std::to_string(gpu.numaNode).c_str());
      if (!topo.nvlink.empty()) std::printf(", NVLink %s", nvlinkSummary(gpu).c_str());
      std::printf("\n");
    }
    if (!topo.gpuStatus.empty()) std::printf("  (incomplete: %s)\n", topo.gpuStatus.c_str());
    std::printf("Peer access (row GPU can map column GPU's memory):\n");
    printMatrix(topo.gpus.size(),
                [&](std::size_t i, std::size_t j) { return topo.peerAccess[i][j] ? "yes" : "no"; });
    if (topo.nvlink.empty()) {
      std::printf("NVLink: unknown (%s)\n", topo.nvlinkStatus.c_str());
    } else {
      std::printf("NVLink links per GPU pair (S: through NVSwitch):\n");
      printMatrix(topo.gpus.size(), [&](std::size_t i, std::size_t j) {
        const ferry::NvlinkPair& pair = topo.nvlink[i][j];
        return std::to_string(pair.links) + (pair.viaSwitch ? "S" : "");
      });
    }
  }

  if (topo.ibDevices.empty())
    std::printf("InfiniBand devices: none (%s)\n", topo.ibStatus.c_str());
  else
    std::printf("InfiniBand devices: %s (from %s)\n", join(topo.ibDevices, ", ").c_str(),
                topo.ibSource.c_str());
  std::printf("NVLink multicast (NVLS): %s (%s)\n", nvls.allowed ? "allowed" : "off", nvls.why.c_str());
}

nlohmann::json toJson(const Topology& topo, const NvlsVerdict& nvls) {
  using nlohmann::json;
  json gpus = json::array();
  for (const ferry::GpuInfo& gpu : topo.gpus) {
    json links = json::array();
    for (const ferry::NvlinkLink& link : gpu.nvlinks)
      links.push_back({{"link", link.link},
                       {"remote", ferry::toString(link.remote)},
                       {"remote_pci_bus_id", link.remotePciBusId}});
    gpus.push_back(
        {{"index", gpu.index},
         {"name", gpu.name},
         {"compute_capability", std::to_string(gpu.computeMajor) + "." + std::to_string(gpu.computeMinor)},
         {"total_memory_bytes", gpu.totalMemoryBytes},
         {"sm_count", gpu.smCount},
         {"pci_bus_id", gpu.pciBusId},
         {"numa_node", gpu.numaNode},
         {"nvlinks", links}});
  }
  json pairs = json::array();
  for (const auto& row : topo.nvlink) {
    json out = json::array();
    for (const ferry::NvlinkPair& pair : row)
      out.push_back({{"links", pair.links}, {"via_switch", pair.viaSwitch}});
    pairs.push_back(out);
  }
  return {{"ferry_version", FERRY_VERSION_STRING},
          {"cuda", {{"driver_version", topo.driverVersion}, {"runtime_version", topo.runtimeVersion}}},
          {"gpu_count", topo.gpus.size()},
          {"gpu_status", topo.gpuStatus},
          {"gpus", gpus},
          {"peer_access", topo.peerAccess},
          {"nvlink", {{"known", !topo.nvlink.empty()}, {"status", topo.nvlinkStatus}, {"pairs", pairs}}},
          {"infiniband", {{"devices", topo.ibDevices}, {"source", topo.ibSource}, {"status", topo.ibStatus}}},
          {"nvls", {{"allowed", nvls.allowed}, {"reason", nvls.why}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ferry-info: what this machine offers ferry (GPUs, peer access, NVLink, InfiniBand, settings)"};
  bool json = false;
  bool envMarkdown = false;
  auto* jsonOption = app.add_flag("--json", json, "Print the same facts as one JSON object");
  app.add_flag("--env-markdown", envMarkdown,
               "Print the environment variable table as Markdown (docs/env.md)")
      ->excludes(jsonOption);
  app.set_version_flag("--version", FERRY_VERSION_STRING);
  CLI11_PARSE(app, argc, argv);

  try {
    if (envMarkdown) {
      std::cout << ferry::envMarkdown();
      return 0;
    }
    const Topology topo = ferry::queryTopology();
    const NvlsVerdict nvls = nvlsVerdict();
    if (json)
      std::cout << toJson(topo, nvls).dump(2) << "\n";
    else
      printText(topo, nvls);
    return 0;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::fprintf(stderr, "ferry-info: %s\n", e.what());
    return 1;
  }
}
