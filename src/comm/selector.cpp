#include "comm/selector.hpp"

#include "comm/across_hosts_algorithms.hpp"

#include <algorithm>

#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "core/text.hpp"

namespace ferry {
namespace {


// `name` among `candidates` (every algorithm a Comm starts with, or one Comm's).
const Algorithm& checkedAlgorithm(const std::vector<const Algorithm*>& candidates, std::string_view name,
                                  std::optional<Collective> expected, std::string_view context) {
  const Algorithm* a = nullptr;
  for (const Algorithm* x : candidates)
    if (name == x->name()) a = x;
  std::string known;
  if (!a) {
    for (const Algorithm* x : candidates)
      if (!expected || x->collective() == *expected) known += std::string(known.empty() ? "" : ", ") + x->name();
    throw Error(ErrorCode::InvalidUsage, std::string(context) + ": no algorithm is named '" + std::string(name) +
                                             "'; known: " + known);
  }
  if (expected && a->collective() != *expected)
    throw Error(ErrorCode::InvalidUsage, std::string(context) + ": '" + std::string(name) + "' is an algorithm of " +
                                             std::string(toString(a->collective())) + ", not of " +
                                             std::string(toString(*expected)));
  return *a;
}

const Algorithm& checkedAlgorithm(std::string_view name, std::optional<Collective> expected, std::string_view context) {
  return checkedAlgorithm(allAlgorithms(), name, expected, context);
}

const Algorithm& checkedAlgorithm(const AlgorithmRegistry& registry, std::string_view name, Collective expected,
                                  std::string_view context) {
  std::vector<const Algorithm*> candidates;
  for (const auto& e : registry.entries()) candidates.push_back(e.algorithm);
  return checkedAlgorithm(candidates, name, expected, context);
}

}  // namespace

namespace {

// Item `name` (of collective `coll` where the item names one) of FERRY_ALGO, an algorithm across
// hosts, into `out`.
void forceAcrossHosts(const std::string& name, std::optional<Collective> coll,
                      std::array<std::string, kCollectiveCount>& out) {
  if (!coll)
    throw Error(ErrorCode::InvalidUsage, "FERRY_ALGO: '" + name +
                                             "' runs several collectives across hosts: name the collective "
                                             "(e.g. allreduce=" + name + ")");
  const Collective c = *coll;
  std::string& slot = out[static_cast<int>(c)];
  if (!slot.empty() && slot != name)
    throw Error(ErrorCode::InvalidUsage, "FERRY_ALGO names two algorithms across hosts of " +
                                             std::string(toString(c)) + ": " + slot + " and " + name + "; keep one");
  slot = name;
}

}  // namespace

std::array<std::string, kCollectiveCount> parseForcedAlgorithms(
    std::string_view spec, std::array<std::string, kCollectiveCount>* acrossHosts) {
  std::array<std::string, kCollectiveCount> out;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (acrossHosts) {
      const std::string name = eq == std::string::npos ? item : trim(std::string_view(item).substr(eq + 1));
      if (parseAcrossHostsAlgorithm(name)) {
        std::optional<Collective> coll;
        if (eq != std::string::npos) coll = parseCollective(trim(std::string_view(item).substr(0, eq)));
        if (eq != std::string::npos && !coll)
          throw Error(ErrorCode::InvalidUsage, "FERRY_ALGO: unknown collective '" +
                                                   trim(std::string_view(item).substr(0, eq)) + "'");
        forceAcrossHosts(name, coll, *acrossHosts);
        continue;
      }
    }
    const Algorithm* a = nullptr;
    if (eq == std::string::npos) {
      a = &checkedAlgorithm(item, std::nullopt, "FERRY_ALGO");
    } else {
      const std::string coll = trim(std::string_view(item).substr(0, eq));
      auto c = parseCollective(coll);
      if (!c)
        throw Error(ErrorCode::InvalidUsage, "FERRY_ALGO: unknown collective '" + coll +
                                                 "' (allreduce, allgather, reducescatter, alltoall, broadcast)");
      a = &checkedAlgorithm(trim(std::string_view(item).substr(eq + 1)), *c, "FERRY_ALGO");
    }
    std::string& slot = out[static_cast<int>(a->collective())];
    if (!slot.empty() && slot != a->name())
      throw Error(ErrorCode::InvalidUsage, "FERRY_ALGO names two algorithms of " + std::string(toString(a->collective())) +
                                               ": " + slot + " and " + a->name() + "; keep one");
    slot = a->name();
  }
  return out;
}

bool TuningRow::matches(const CollectiveCall& call, Fabric commFabric) const {
  return !hosts && collective == call.collective && (worldSize == 0 || worldSize == call.worldSize) &&
         (!type || *type == call.type) && (!registered || *registered == call.registered()) &&
         (!fabric || *fabric == commFabric);
}

bool TuningRow::matchesAcrossHosts(const CollectiveCall& call, int hostCount, int perHost) const {
  return hosts && (*hosts == 0 || *hosts == hostCount) && (ranksPerHost == 0 || ranksPerHost == perHost) &&
         collective == call.collective && (worldSize == 0 || worldSize == call.worldSize) &&
         (!type || *type == call.type);  // (registration is the host phases' to match: tuning.cpp refuses it here)
}

Selector::Selector(std::vector<TuningRow> rows) : rows_(std::move(rows)) { refresh(); }

Selector Selector::fromEnvironment() {
  std::vector<TuningRow> rows;
  if (!env().tuningFile.empty()) rows = loadTuningFile(env().tuningFile);
  for (auto& r : defaultTuning()) rows.push_back(std::move(r));
  Selector s(std::move(rows));
  std::array<std::string, kCollectiveCount> acrossHosts;
  const auto names = parseForcedAlgorithms(env().algo, &acrossHosts);
  for (int c = 0; c < kCollectiveCount; ++c) {
    if (!names[c].empty()) s.force(static_cast<Collective>(c), names[c]);
    if (!acrossHosts[c].empty()) s.force(static_cast<Collective>(c), acrossHosts[c]);
  }
  return s;
}

void Selector::refresh() {
  rowAlgorithms_.clear();
  for (const TuningRow& row : rows_) rowAlgorithms_.push_back(registry_.find(row.algorithm));
  // Added ones newest first, then the starting plans in load order (a stable sort keeps that order
  // among equal `added`).
  std::vector<AlgorithmRegistry::Entry> preferred;
  for (const auto& e : registry_.entries())
    if (e.kind != AlgorithmKind::Builtin) preferred.push_back(e);
  std::stable_sort(preferred.begin(), preferred.end(), [](const auto& a, const auto& b) { return a.added > b.added; });
  preferred_.clear();
  for (const auto& e : preferred) preferred_.push_back(e.algorithm);
  ++version_;
}

void Selector::add(const Algorithm* algorithm, AlgorithmKind kind, std::shared_ptr<const void> owner) {
  registry_.add(algorithm, kind, std::move(owner));
  refresh();
}

AlgorithmRegistry::Entry Selector::remove(std::string_view name) {
  AlgorithmRegistry::Entry e = registry_.remove(name);
  const int c = static_cast<int>(e.algorithm->collective());
  if (forced_[c] == e.algorithm) {
    forced_[c] = nullptr;
    forcedNames_[c].clear();
  }
  refresh();
  return e;
}

void Selector::force(Collective c, std::string_view name) {
  const int i = static_cast<int>(c);
  if (name.empty()) {
    forced_[i] = nullptr;
    forcedNames_[i].clear();
    forcedAcrossHosts_[i].clear();
  } else if (parseAcrossHostsAlgorithm(name)) {
    forcedAcrossHosts_[i] = name;
  } else {
    const Algorithm& a = checkedAlgorithm(registry_, name, c, "setAlgorithm");
    forced_[i] = &a;
    forcedNames_[i] = a.name();
  }
  ++version_;
}

const Algorithm& Selector::select(const CollectiveCall& call, const CommLimits& limits) const {
  if (const Algorithm* forced = forced_[static_cast<int>(call.collective)]) {
    if (auto why = whyNotRun(*forced, call, limits); !why.empty())
      throw Error(ErrorCode::InvalidUsage, describe(call) + ": the forced algorithm " + forced->name() +
                                               " cannot run this call: " + why +
                                               " (force another one, or none, with setAlgorithm / FERRY_ALGO)");
    return *forced;
  }
  for (const Algorithm* a : preferred_)
    if (a->collective() == call.collective && whyNotRun(*a, call, limits).empty()) return *a;
  const std::uint64_t bytes = call.bytes();
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const TuningRow& row = rows_[i];
    if (!row.matches(call, limits.fabric) || bytes > row.maxBytes) continue;
    const Algorithm* a = rowAlgorithms_[i];
    if (a && whyNotRun(*a, call, limits).empty()) return *a;
  }
  std::string reasons;
  for (const auto& e : registry_.entries()) {
    const Algorithm* a = e.algorithm;
    if (a->collective() != call.collective) continue;
    auto why = whyNotRun(*a, call, limits);
    if (why.empty()) return *a;
    reasons += std::string("; ") + a->name() + ": " + why;
  }
  throw Error(ErrorCode::InvalidUsage, describe(call) + ": no algorithm can run this call" + reasons);
}

SelectionCache::Choice SelectionCache::select(const Selector& selector, const AlgorithmStates& states,
                                              const CollectiveCall& call, const CommLimits& limits) {
  if (version_ != selector.version()) {
    slots_.fill({});
    version_ = selector.version();
  }
  Key key;
  key.count = call.count;
  key.root = call.rooted() ? call.root : 0;
  key.collective = static_cast<std::uint8_t>(call.collective);
  key.type = static_cast<std::uint8_t>(call.type);
  key.op = call.reduces() ? static_cast<std::uint8_t>(call.op) : 0;
  key.flags = static_cast<std::uint8_t>((call.registered() ? 1 : 0) | (call.inPlace() ? 2 : 0) |
                                        (call.sumsInFloat32() ? 4 : 0));
  std::uint64_t h = key.count * 0x9E3779B97F4A7C15ull;
  h ^= (static_cast<std::uint64_t>(key.collective) << 40 | static_cast<std::uint64_t>(key.type) << 32 |
        static_cast<std::uint64_t>(key.op) << 24 | static_cast<std::uint64_t>(key.flags) << 16) +
       static_cast<std::uint32_t>(key.root);
  h ^= h >> 29;
  Slot& slot = slots_[(h * 0xBF58476D1CE4E5B9ull >> 57) % kSlots];
  if (slot.choice.algorithm != nullptr && slot.key == key) return slot.choice;
  const Algorithm& a = selector.select(call, limits);  // throws without caching: errors stay errors
  slot = {key, {&a, states.of(a)}};
  return slot.choice;
}

}  // namespace ferry
