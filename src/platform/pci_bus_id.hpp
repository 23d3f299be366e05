#pragma once
// One spelling for PCI addresses. CUDA writes "0000:1B:00.0", NVML "00000000:1B:00.0", sysfs
// "0000:1b:00.0"; ferry compares and prints the sysfs form.
#include <cctype>
#include <cstdio>
#include <string>
#include <string_view>

namespace ferry {

// "00000000:1B:00.0" -> "0000:1b:00.0". A string that is not domain:bus:device.function comes back
// lowercased, so that comparisons still work between two sources that agree.
inline std::string normalizePciBusId(std::string_view id) {
  std::string text(id);
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  int used = -1;  // characters parsed; the whole string must be the address
  if (std::sscanf(text.c_str(), "%x:%x:%x.%1x%n", &domain, &bus, &device, &function, &used) == 4 &&
      used == static_cast<int>(text.size())) {
    char out[32];
    std::snprintf(out, sizeof(out), "%04x:%02x:%02x.%x", domain, bus, device, function);
    return out;
  }
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace ferry
