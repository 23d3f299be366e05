// core/deadline.hpp: timeouts of any size convert without overflow; "practically forever" stays
// forever, and a small positive timeout never becomes "never" on the device.
#include "core/deadline.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ferry {
namespace {

using Seconds = std::chrono::duration<double>;
using Clock = std::chrono::steady_clock;

TEST(DeadlineAfter, SaturatesAtTheClocksEnd) {
  const Clock::time_point now = Clock::now();
  for (double s : {1e10, 1e13, 1e300, std::numeric_limits<double>::infinity()})
    EXPECT_EQ(deadlineAfter(Seconds(s), now), Clock::time_point::max()) << s << " s";
  EXPECT_EQ(deadlineAfter(Seconds(0), now), now);
  EXPECT_EQ(deadlineAfter(Seconds(-5), now), now);
  EXPECT_EQ(deadlineAfter(Seconds(std::nan("")), now), now);
  EXPECT_EQ(deadlineAfter(Seconds(2.5), now) - now, std::chrono::milliseconds(2500));
  EXPECT_GT(deadlineAfter(Seconds(1e8), now), now + std::chrono::hours(24 * 365));  // fits: exact
}

TEST(TimeoutNanoseconds, SaturatesAndNeverRoundsToNever) {
  EXPECT_EQ(timeoutNanoseconds(Seconds(0)), 0u);  // 0: never give up, as documented
  EXPECT_EQ(timeoutNanoseconds(Seconds(-1)), 0u);
  EXPECT_EQ(timeoutNanoseconds(Seconds(1e-12)), 1u);
  EXPECT_EQ(timeoutNanoseconds(Seconds(1.5)), 1'500'000'000u);
  EXPECT_EQ(timeoutNanoseconds(Seconds(1e10)), 10'000'000'000'000'000'000u);
  for (double s : {1e11, 1e300, std::numeric_limits<double>::infinity()})
    EXPECT_EQ(timeoutNanoseconds(Seconds(s)), std::numeric_limits<std::uint64_t>::max()) << s << " s";
}

}  // namespace
}  // namespace ferry
