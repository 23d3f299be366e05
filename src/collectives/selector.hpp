#pragma once
// Which algorithm runs a call. In order:
//   1. an algorithm forced for the collective (Comm::setAlgorithm, or FERRY_ALGO): always that one,
//      and a call it cannot run is Error(InvalidUsage) saying why;
//   2. the first loaded plan (FERRY_PLAN_DIR) of the collective that can run the call: a plan is
//      for one world size and a range of message sizes, and the user who loads it wants it there;
//   3. the first row of the tuning table (FERRY_TUNING_FILE, then the built-in defaults) whose
//      collective and world size match (and data type, registration and topology, where the row
//      names them), whose maxBytes is at least the call's bytes, and whose algorithm can run the call;
//   4. the first algorithm of the collective (registry order) that can run it.
//
// Tuning file (what `ferry-bench --tune` writes):
//   {"version": 1, "rows": [
//     {"collective": "allreduce", "world_size": 4, "max_bytes": 65536, "algorithm": "allreduce_ll"},
//     ...]}
// world_size 0 (or left out) matches any size. Optional keys narrow a row: "datatype" (e.g. "bf16")
// to calls of that type, "registered" (true or false) to calls whose buffers are (or are not) all
// registered with Comm::registerBuffer; "topology" ("nvswitch", "nvlink", "pcie": fabric.hpp) to
// Comms whose GPUs are joined so (ferry-bench --tune writes the one it measured on).
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/algorithm.hpp"

namespace ferry {

struct TuningRow {
  Collective collective = Collective::AllReduce;
  int worldSize = 0;  // 0: any
  std::uint64_t maxBytes = 0;
  std::string algorithm;
  std::optional<DataType> type;     // unset: any
  std::optional<bool> registered;   // unset: either
  std::optional<Fabric> fabric;     // unset: any
  bool operator==(const TuningRow&) const = default;
  // The row applies to the call on a Comm of that fabric (everything but whether its algorithm
  // can run the call).
  bool matches(const CollectiveCall& call, Fabric commFabric) const;
};

// The built-in table: rows for two ranks measured on 2x H200, the general rows on 4x H200 (both
// NVSwitch); see docs/collectives.md.
std::vector<TuningRow> defaultTuning();

// Parses a tuning file's text; Error(InvalidUsage) naming `source`, the row and the field for
// anything malformed, including an algorithm that does not exist or belongs to another collective.
std::vector<TuningRow> parseTuning(std::string_view json, std::string_view source);
std::vector<TuningRow> loadTuningFile(const std::string& path);
std::string tuningToJson(const std::vector<TuningRow>& rows);

// FERRY_ALGO: "name[,name...]" (the collective follows from each name) or "collective=name,...".
// Error(InvalidUsage) for an unknown name or collective.
std::array<std::string, kCollectiveCount> parseForcedAlgorithms(std::string_view spec);

class Selector {
 public:
  // rows: consulted in order (put user rows before the defaults).
  // plans: algorithms tried before the rows (the loaded plans), in order.
  explicit Selector(std::vector<TuningRow> rows, std::vector<const Algorithm*> plans = {});
  // Selector from the environment: FERRY_TUNING_FILE's rows, then defaultTuning(); FERRY_ALGO.
  static Selector fromEnvironment();

  // Empty name: back to the table. Error(InvalidUsage) for an unknown name or a name of another
  // collective.
  void force(Collective c, std::string_view name);
  const std::string& forced(Collective c) const { return forced_[static_cast<int>(c)]; }

  const Algorithm& select(const CollectiveCall& call, const CommLimits& limits) const;

 private:
  std::vector<TuningRow> rows_;
  std::vector<const Algorithm*> plans_;
  std::array<std::string, kCollectiveCount> forced_;
};

}  // namespace ferry
