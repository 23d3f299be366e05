#pragma once
// EXPECT_CONTAINS(text, part): GoogleTest check that `part` occurs in `text`, printing both on
// failure (plain GoogleTest; the tests do not need gmock).
#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace ferry::testing {

inline ::testing::AssertionResult containsPred(const char* textExpr, const char* partExpr,
                                               std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << textExpr << " does not contain " << partExpr << "\n  text: \""
                                       << text << "\"\n  part: \"" << part << "\"";
}

inline ::testing::AssertionResult notContainsPred(const char* textExpr, const char* partExpr,
                                                  std::string_view text, std::string_view part) {
  if (text.find(part) == std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << textExpr << " contains " << partExpr << "\n  text: \"" << text
                                       << "\"\n  part: \"" << part << "\"";
}

}  // namespace ferry::testing

#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::ferry::testing::containsPred, text, part)
#define EXPECT_NOT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::ferry::testing::notContainsPred, text, part)
