#pragma once
// invalidUsageOf(f): runs f, expects it to throw ferry::Error with ErrorCode::InvalidUsage, and
// returns the message (for EXPECT_CONTAINS); a GoogleTest failure when nothing or something else is
// thrown.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ferry/errors.hpp"

namespace ferry::testing {

inline std::string invalidUsageOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error was thrown";
  return {};
}

}  // namespace ferry::testing
