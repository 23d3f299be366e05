#include "collectives/selector.hpp"

#include "executor/plan_algorithm.hpp"

#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

std::string trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

const Algorithm& checkedAlgorithm(std::string_view name, std::optional<Collective> expected,
                                  std::string_view context) {
  const Algorithm* a = findAlgorithm(name);
  std::string known;
  if (!a) {
    for (const Algorithm* x : allAlgorithms())
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

}  // namespace

std::array<std::string, kCollectiveCount> parseForcedAlgorithms(std::string_view spec) {
  std::array<std::string, kCollectiveCount> out;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
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
  return collective == call.collective && (worldSize == 0 || worldSize == call.worldSize) &&
         (!type || *type == call.type) && (!registered || *registered == call.registered()) &&
         (!fabric || *fabric == commFabric);
}

Selector::Selector(std::vector<TuningRow> rows, std::vector<const Algorithm*> plans)
    : rows_(std::move(rows)), plans_(std::move(plans)) {}

Selector Selector::fromEnvironment() {
  std::vector<TuningRow> rows;
  if (!env().tuningFile.empty()) rows = loadTuningFile(env().tuningFile);
  for (auto& r : defaultTuning()) rows.push_back(std::move(r));
  Selector s(std::move(rows), executor::planAlgorithms());
  s.forced_ = parseForcedAlgorithms(env().algo);
  return s;
}

void Selector::force(Collective c, std::string_view name) {
  forced_[static_cast<int>(c)] = name.empty() ? std::string{} : std::string(checkedAlgorithm(name, c, "setAlgorithm").name());
}

const Algorithm& Selector::select(const CollectiveCall& call, const CommLimits& limits) const {
  const std::string& forcedName = forced_[static_cast<int>(call.collective)];
  if (!forcedName.empty()) {
    const Algorithm& a = *findAlgorithm(forcedName);
    if (auto why = a.whyNot(call, limits); !why.empty())
      throw Error(ErrorCode::InvalidUsage, describe(call) + ": the forced algorithm " + forcedName +
                                               " cannot run this call: " + why +
                                               " (force another one, or none, with setAlgorithm / FERRY_ALGO)");
    return a;
  }
  for (const Algorithm* a : plans_)
    if (a->collective() == call.collective && a->whyNot(call, limits).empty()) return *a;
  const std::uint64_t bytes = call.bytes();
  for (const TuningRow& row : rows_) {
    if (!row.matches(call, limits.fabric) || bytes > row.maxBytes) continue;
    const Algorithm* a = findAlgorithm(row.algorithm);
    if (a && a->whyNot(call, limits).empty()) return *a;
  }
  std::string reasons;
  for (const Algorithm* a : allAlgorithms()) {
    if (a->collective() != call.collective) continue;
    auto why = a->whyNot(call, limits);
    if (why.empty()) return *a;
    reasons += std::string("; ") + a->name() + ": " + why;
  }
  throw Error(ErrorCode::InvalidUsage, describe(call) + ": no algorithm can run this call" + reasons);
}

}  // namespace ferry
