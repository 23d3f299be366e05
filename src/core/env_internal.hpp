#pragma once
// What the logger needs from the environment table, beyond env(): the startup log of variables
// that are set, and a warning for FERRY_* names that are not in the table (usually a typo).
#include <string>
#include <utility>
#include <vector>

namespace ferry {
struct Env;
}

namespace ferry::detail {
// env() without its announcement of the startup lines: what the logger itself reads.
const Env& parsedEnv();
std::vector<std::pair<std::string, std::string>> envSetVariables();
std::vector<std::string> envUnknownFerryVariables();
}  // namespace ferry::detail
