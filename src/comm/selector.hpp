#pragma once
// Which algorithm runs a call. In order:
//   1. an algorithm forced for the collective (Comm::setAlgorithm, or FERRY_ALGO): always that one,
//      and a call it cannot run is Error(InvalidUsage) saying why;
//   2. the first plan or native algorithm of the collective that can run the call, the ones added
//      at run time (Comm::addPlan, addAlgorithm) newest first, then FERRY_PLAN_DIR's in load order:
//      a plan is for one world size and a range of message sizes, and whoever added it wants it there;
//   3. the first row of the tuning table (FERRY_TUNING_FILE, then the built-in defaults) whose
//      collective and world size match (and data type, registration and topology, where the row
//      names them), whose maxBytes is at least the call's bytes, and whose algorithm can run the call;
//   4. the first algorithm of the collective (registry order) that can run it.
//
// Tuning file (what `ferry-bench --tune` writes):
//   {"version": 1, "rows": [
//     {"collective": "allreduce", "world_size": 4, "max_bytes": 65536, "algorithm": "allreduce_ll"},
//     ...]}
// world_size 0 (or left out) matches any size. Rows with "hosts" are for calls of a Comm across
// hosts (across_hosts_algorithms.hpp; "hosts": 0 any number, "ranks_per_host": 0 or left out any)
// and name one of its algorithms: {"collective": "allreduce", "hosts": 2, "ranks_per_host": 8,
// "max_bytes": 1048576, "algorithm": "across_hosts"}. Optional keys narrow a row: "datatype" (e.g. "bf16")
// to calls of that type, "registered" (true or false) to calls whose buffers are (or are not) all
// registered with Comm::registerBuffer; "topology" ("nvswitch", "nvlink", "pcie": fabric.hpp) to
// Comms whose GPUs are joined so (ferry-bench --tune writes the one it measured on).
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/algorithm_registry.hpp"
#include "comm/algorithm_states.hpp"
#include "platform/fabric.hpp"

namespace ferry {

struct TuningRow {
  Collective collective = Collective::AllReduce;
  int worldSize = 0;  // 0: any
  std::uint64_t maxBytes = 0;
  std::string algorithm;
  std::optional<DataType> type;     // unset: any
  std::optional<bool> registered;   // unset: either
  std::optional<Fabric> fabric;     // unset: any
  // Set: a row of calls across hosts (across_hosts_algorithms.hpp), of that many hosts (0: any)
  // with ranksPerHost ranks each (0: any), without fabric or registration (the host phases' to
  // match); unset: a row of a Comm of one host (a host's phases of a call across hosts included).
  std::optional<int> hosts;
  int ranksPerHost = 0;
  bool operator==(const TuningRow&) const = default;
  // The row applies to the call on a Comm of one host of that fabric (everything but whether its
  // algorithm can run the call).
  bool matches(const CollectiveCall& call, Fabric commFabric) const;
  // The row applies to the world's call of a Comm across `hosts` hosts of `ranksPerHost` ranks
  // (the most of any host).
  bool matchesAcrossHosts(const CollectiveCall& call, int hostCount, int perHost) const;
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
// Error(InvalidUsage) for an unknown name or collective. Names of algorithms across hosts
// (across_hosts_algorithms.hpp; "allreduce=across_hosts_pipelined", always with the collective) go to
// *acrossHosts where it is given, and are unknown names where it is not.
std::array<std::string, kCollectiveCount> parseForcedAlgorithms(
    std::string_view spec, std::array<std::string, kCollectiveCount>* acrossHosts = nullptr);

class Selector {
 public:
  // rows: consulted in order (put user rows before the defaults); the algorithms: the starting ones
  // (AlgorithmRegistry()).
  explicit Selector(std::vector<TuningRow> rows);
  // Selector from the environment: FERRY_TUNING_FILE's rows, then defaultTuning(); FERRY_ALGO.
  static Selector fromEnvironment();

  const AlgorithmRegistry& registry() const { return registry_; }
  // The tuning table, in order (rows across hosts included: across_hosts_algorithms.hpp reads them).
  const std::vector<TuningRow>& rows() const { return rows_; }
  // As AlgorithmRegistry::add and remove. Removing a forced algorithm hands its collective back to
  // the table.
  void add(const Algorithm* algorithm, AlgorithmKind kind, std::shared_ptr<const void> owner);
  AlgorithmRegistry::Entry remove(std::string_view name);

  // Empty name: back to the table. Error(InvalidUsage) for a name this registry does not hold or a
  // name of another collective. The name of an algorithm across hosts of c forces that one for
  // calls across hosts (forcedAcrossHosts; the host's phases keep theirs); empty clears both.
  void force(Collective c, std::string_view name);
  const std::string& forced(Collective c) const { return forcedNames_[static_cast<int>(c)]; }
  const std::string& forcedAcrossHosts(Collective c) const { return forcedAcrossHosts_[static_cast<int>(c)]; }

  const Algorithm& select(const CollectiveCall& call, const CommLimits& limits) const;
  // Changes whenever select() may answer differently for the same call (an add, a remove, a force).
  std::uint64_t version() const { return version_; }

 private:
  void refresh();

  AlgorithmRegistry registry_;
  std::vector<TuningRow> rows_;
  std::vector<const Algorithm*> rowAlgorithms_;  // rows_[i]'s algorithm here; null where there is none
  std::vector<const Algorithm*> preferred_;      // plans and native algorithms, ahead of the rows
  std::array<const Algorithm*, kCollectiveCount> forced_{};
  std::array<std::string, kCollectiveCount> forcedNames_;
  std::array<std::string, kCollectiveCount> forcedAcrossHosts_;
  std::uint64_t version_ = 0;
};

// Remembers the selector's answer for each call shape a Comm has seen, so a call pays for a hash
// and a compare, not for building reasons and walking the table: selection depends only on the
// call's shape (collective, count, type, op, root, registered, in place), the Comm's limits (fixed)
// and the selector's version. Direct-mapped: a slot's old shape is simply replaced. One per Comm;
// not thread-safe, as a Comm's calls are not.
class SelectionCache {
 public:
  struct Choice {
    const Algorithm* algorithm;
    void* state;  // the algorithm's own device memory in this Comm (states.of)
  };
  Choice select(const Selector& selector, const AlgorithmStates& states, const CollectiveCall& call,
                const CommLimits& limits);

 private:
  struct Key {
    std::uint64_t count = 0;
    std::int32_t root = 0;
    std::uint8_t collective = 0, type = 0, op = 0, flags = 0;  // flags: registered, in place, float32 sums
    bool operator==(const Key&) const = default;
  };
  struct Slot {
    Key key;
    Choice choice{nullptr, nullptr};
  };
  static constexpr std::size_t kSlots = 128;
  std::array<Slot, kSlots> slots_{};
  std::uint64_t version_ = ~0ull;
};

}  // namespace ferry
