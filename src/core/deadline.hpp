#pragma once
// Timeouts come as seconds in a double (FERRY_*_TIMEOUT, arguments), of any size: a huge one means
// "practically forever" and must stay so through every conversion. Adding it to now() in the
// clock's integer ticks would overflow and put the deadline in the past, so that every wait failed
// at once; these conversions saturate instead.
//
//   const auto deadline = deadlineAfter(env().bootstrapTimeout);   // time_point::max() for 1e300 s
//   handle.wait_.timeoutNs = timeoutNanoseconds(env().deviceTimeout);  // UINT64_MAX, never 0
#include <chrono>
#include <cstdint>
#include <limits>

namespace ferry {

// now + timeout, saturating at the clock's last time point; a timeout <= 0 (or NaN) is now.
inline std::chrono::steady_clock::time_point deadlineAfter(
    std::chrono::duration<double> timeout,
    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
  using Clock = std::chrono::steady_clock;
  const double seconds = timeout.count();
  if (!(seconds > 0)) return now;
  const double room = std::chrono::duration<double>(Clock::time_point::max() - now).count();
  if (seconds >= room) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(timeout);
}

// A timeout in whole nanoseconds for the device's waits, where 0 means "never give up" (a timeout
// of 0 s): saturates at UINT64_MAX, and a positive timeout never rounds down to 0.
inline std::uint64_t timeoutNanoseconds(std::chrono::duration<double> timeout) {
  const double ns = timeout.count() * 1e9;
  if (!(ns > 0)) return 0;
  if (ns >= 0x1p64) return std::numeric_limits<std::uint64_t>::max();
  const auto whole = static_cast<std::uint64_t>(ns);
  return whole == 0 ? 1 : whole;
}

}  // namespace ferry
