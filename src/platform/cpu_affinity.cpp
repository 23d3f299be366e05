#include "platform/cpu_affinity.hpp"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "platform/pci_bus_id.hpp"

namespace ferry {
namespace {

constexpr int kMaxCpu = CPU_SETSIZE;

std::optional<int> parseCpu(std::string_view text) {
  int value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0 || value >= kMaxCpu)
    return std::nullopt;
  return value;
}

}  // namespace

std::optional<std::vector<int>> parseCpuList(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::vector<int> cpus;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return std::nullopt;  // "0," is malformed
    const std::size_t dash = item.find('-');
    const auto first = parseCpu(item.substr(0, dash));
    const auto last = dash == std::string_view::npos ? first : parseCpu(item.substr(dash + 1));
    if (!first || !last || *last < *first) return std::nullopt;
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<int> numaNodeCpus(int node) {
  if (node < 0) return {};
  std::ifstream file("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::stringstream text;
  if (!(text << file.rdbuf())) return {};
  return parseCpuList(text.str()).value_or(std::vector<int>{});
}

int gpuNumaNode(int device) {
  char busId[32] = {};
  if (cudaDeviceGetPCIBusId(busId, sizeof(busId), device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  std::ifstream file("/sys/bus/pci/devices/" + normalizePciBusId(busId) + "/numa_node");
  int node = -1;
  if (!(file >> node)) return -1;
  return node;
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> pinCallingThread(const std::vector<int>& cpus, std::string& why) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    why = std::string("sched_getaffinity failed: ") + std::strerror(errno);
    return {};
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> pinned;
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < kMaxCpu && CPU_ISSET(cpu, &allowed)) {
      CPU_SET(cpu, &set);
      pinned.push_back(cpu);
    }
  }
  if (pinned.empty()) {
    why = "none of CPUs " + formatCpuList(cpus) + " is allowed to this process";
    return {};
  }
  if (int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); err != 0) {
    why = std::string("pthread_setaffinity_np failed: ") + std::strerror(err);
    return {};
  }
  return pinned;
}

}  // namespace ferry
