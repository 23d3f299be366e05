#pragma once
// Pinning a host thread next to its GPU: the CPUs of a NUMA node, the NUMA node of a GPU, and
// setting a thread's affinity. Used by the proxy thread; none of it throws.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// Parses a Linux cpulist ("0-3,8-11", "5", "" for none; a trailing newline is fine). nullopt when
// the text is malformed.
std::optional<std::vector<int>> parseCpuList(std::string_view text);
// The CPUs of NUMA node `node` (/sys/devices/system/node/node<N>/cpulist); empty when unknown.
std::vector<int> numaNodeCpus(int node);
// The host NUMA node closest to CUDA device `device` (sysfs numa_node of its PCI address); -1 when
// unknown (no GPU, or a machine with one NUMA node).
int gpuNumaNode(int device);
// "0-3,8" for {0,1,2,3,8}.
std::string formatCpuList(const std::vector<int>& cpus);

// Pins the calling thread to `cpus` that this process may use. Returns the CPUs it pinned to, or an
// error text (nothing allowed, the call failed) in `why`.
std::vector<int> pinCallingThread(const std::vector<int>& cpus, std::string& why);

}  // namespace ferry
