#pragma once
// A clock for bounded waits: the GPU's global timer (nanoseconds, the same on every SM), or the
// host's steady clock when the code runs on the host.
#include <cstdint>

#include "ferry/device/macros.hpp"
#if !FERRY_DEVICE_CODE
#include <chrono>
#endif

namespace ferry {

FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t nowNs() {
#if FERRY_DEVICE_CODE
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#endif
}

}  // namespace ferry
