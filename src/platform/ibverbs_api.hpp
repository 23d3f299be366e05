#pragma once
// Lists the InfiniBand / RoCE devices of this machine. libibverbs is loaded with dlopen (rdma-core
// is optional); without it, or when it lists nothing (no provider library for the NIC), the kernel's
// view in /sys/class/infiniband is used instead.
#include <string>
#include <vector>

namespace ferry::ibverbs {

struct DeviceList {
  std::vector<std::string> names;  // e.g. "mlx5_0", sorted
  std::string source;              // "libibverbs", the sysfs folder, or empty when neither answered
  std::string reason;              // why names is empty; empty otherwise
};

// Never throws. sysfsDir is a parameter so that tests can point it at a folder of their own.
DeviceList listDevices(const std::string& sysfsDir = "/sys/class/infiniband");

}  // namespace ferry::ibverbs
