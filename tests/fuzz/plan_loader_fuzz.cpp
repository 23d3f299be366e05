// libFuzzer target for the plan loader: arbitrary bytes must give a Plan or throw ferry::Error
// (PlanError); any other exception, a crash, ASan/UBSan report or oversized allocation is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "executor/plan.hpp"
#include "ferry/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    ferry::executor::loadPlan(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const ferry::Error&) {
  }
  return 0;
}
