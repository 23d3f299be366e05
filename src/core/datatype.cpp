#include "ferry/datatype.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "ferry/collective.hpp"

namespace ferry {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

struct TypeInfo {
  std::string_view name;
  std::size_t size;
  bool floating;
};
constexpr std::array<TypeInfo, kDataTypeCount> kTypes{{{"int8", 1, false},
                                                       {"uint8", 1, false},
                                                       {"int32", 4, false},
                                                       {"uint32", 4, false},
                                                       {"int64", 8, false},
                                                       {"uint64", 8, false},
                                                       {"half", 2, true},
                                                       {"float", 4, true},
                                                       {"double", 8, true},
                                                       {"bfloat16", 2, true},
                                                       {"f8e4m3", 1, true},
                                                       {"f8e5m2", 1, true}}};
constexpr std::array<std::string_view, kReduceOpCount> kOps{"sum", "prod", "max", "min", "avg"};
constexpr std::array<std::string_view, kCollectiveCount> kCollectives{
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce"};

}  // namespace

bool isValid(DataType t) noexcept { return static_cast<int>(t) >= 0 && static_cast<int>(t) < kDataTypeCount; }
bool isValid(ReduceOp op) noexcept { return static_cast<int>(op) >= 0 && static_cast<int>(op) < kReduceOpCount; }
std::size_t sizeOf(DataType t) noexcept { return isValid(t) ? kTypes[static_cast<int>(t)].size : 0; }
bool isFloatingPoint(DataType t) noexcept { return isValid(t) && kTypes[static_cast<int>(t)].floating; }
std::string_view toString(DataType t) noexcept { return isValid(t) ? kTypes[static_cast<int>(t)].name : "invalid"; }
std::string_view toString(ReduceOp op) noexcept { return isValid(op) ? kOps[static_cast<int>(op)] : "invalid"; }

std::optional<DataType> parseDataType(std::string_view name) noexcept {
  const std::string n = lower(name);
  for (int i = 0; i < kDataTypeCount; ++i)
    if (n == kTypes[i].name) return static_cast<DataType>(i);
  static constexpr std::pair<std::string_view, DataType> kAliases[] = {
      {"char", DataType::Int8},        {"i8", DataType::Int8},         {"u8", DataType::Uint8},
      {"int", DataType::Int32},        {"i32", DataType::Int32},       {"u32", DataType::Uint32},
      {"i64", DataType::Int64},        {"u64", DataType::Uint64},      {"fp16", DataType::Float16},
      {"f16", DataType::Float16},      {"float16", DataType::Float16}, {"fp32", DataType::Float32},
      {"f32", DataType::Float32},      {"float32", DataType::Float32}, {"fp64", DataType::Float64},
      {"f64", DataType::Float64},      {"float64", DataType::Float64}, {"bf16", DataType::BFloat16},
      {"e4m3", DataType::Fp8E4M3},     {"fp8e4m3", DataType::Fp8E4M3}, {"fp8_e4m3", DataType::Fp8E4M3},
      {"e5m2", DataType::Fp8E5M2},     {"fp8e5m2", DataType::Fp8E5M2}, {"fp8_e5m2", DataType::Fp8E5M2},
  };
  for (const auto& [alias, type] : kAliases)
    if (n == alias) return type;
  return std::nullopt;
}

std::optional<ReduceOp> parseReduceOp(std::string_view name) noexcept {
  const std::string n = lower(name);
  for (int i = 0; i < kReduceOpCount; ++i)
    if (n == kOps[i]) return static_cast<ReduceOp>(i);
  if (n == "mean") return ReduceOp::Avg;
  return std::nullopt;
}

std::string_view toString(Collective c) noexcept {
  const int i = static_cast<int>(c);
  return i >= 0 && i < kCollectiveCount ? kCollectives[i] : "invalid";
}

std::optional<Collective> parseCollective(std::string_view name) noexcept {
  std::string n = lower(name);
  std::erase(n, '_');
  for (int i = 0; i < kCollectiveCount; ++i)
    if (n == kCollectives[i]) return static_cast<Collective>(i);
  return std::nullopt;
}

}  // namespace ferry
