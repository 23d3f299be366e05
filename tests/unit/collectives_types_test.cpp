// Element types, reduce ops and collective names (datatype.cpp), and the element-wise reduction of
// reduce_ops.hpp compiled for the host: the kernels use the same code, so its arithmetic (wrapping
// integers, truncating integer avg, rounding low-precision floats after each step) is checked here
// against a double-precision reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/device_context.hpp"
#include "kernels/reduce_ops.hpp"
#include "ferry/comm.hpp"
#include "ferry/datatype.hpp"

namespace ferry {
namespace {

// --- Names and sizes ----------------------------------------------------------------------------

struct TypeInfo {
  DataType type;
  std::size_t size;
  const char* name;
  bool floating;
};

const TypeInfo kTypes[] = {
    {DataType::Int8, 1, "int8", false},     {DataType::Uint8, 1, "uint8", false},
    {DataType::Int32, 4, "int32", false},   {DataType::Uint32, 4, "uint32", false},
    {DataType::Int64, 8, "int64", false},   {DataType::Uint64, 8, "uint64", false},
    {DataType::Float16, 2, "half", true},   {DataType::Float32, 4, "float", true},
    {DataType::Float64, 8, "double", true}, {DataType::BFloat16, 2, "bfloat16", true},
    {DataType::Fp8E4M3, 1, "f8e4m3", true}, {DataType::Fp8E5M2, 1, "f8e5m2", true},
};
static_assert(std::size(kTypes) == std::size_t{kDataTypeCount});

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

TEST(DataTypeNames, SizeNameAndKindOfEach) {
  for (const TypeInfo& t : kTypes) {
    EXPECT_TRUE(isValid(t.type)) << t.name;
    EXPECT_EQ(sizeOf(t.type), t.size) << t.name;
    EXPECT_EQ(toString(t.type), t.name);
    EXPECT_EQ(isFloatingPoint(t.type), t.floating) << t.name;
    EXPECT_EQ(parseDataType(t.name), t.type) << t.name;
    EXPECT_EQ(parseDataType(upper(t.name)), t.type) << t.name;
  }
}

TEST(DataTypeNames, AliasesInAnyCase) {
  const std::pair<const char*, DataType> aliases[] = {
      {"i8", DataType::Int8},       {"char", DataType::Int8},       {"U8", DataType::Uint8},
      {"int", DataType::Int32},     {"i32", DataType::Int32},       {"u32", DataType::Uint32},
      {"i64", DataType::Int64},     {"u64", DataType::Uint64},      {"fp16", DataType::Float16},
      {"FP16", DataType::Float16},  {"float16", DataType::Float16}, {"f16", DataType::Float16},
      {"fp32", DataType::Float32},  {"f32", DataType::Float32},     {"Float32", DataType::Float32},
      {"fp64", DataType::Float64},  {"float64", DataType::Float64}, {"bf16", DataType::BFloat16},
      {"BF16", DataType::BFloat16}, {"e4m3", DataType::Fp8E4M3},    {"fp8_e4m3", DataType::Fp8E4M3},
      {"E5M2", DataType::Fp8E5M2},  {"fp8e5m2", DataType::Fp8E5M2},
  };
  for (const auto& [alias, type] : aliases) EXPECT_EQ(parseDataType(alias), type) << alias;
}

TEST(DataTypeNames, UnknownNamesAreRejected) {
  for (const char* name : {"", "int16", "float8", "fp8", "bf", "halff", " float", "float ", "e4m3fn"})
    EXPECT_FALSE(parseDataType(name).has_value()) << "'" << name << "'";
}

TEST(DataTypeNames, ValuesOutsideTheEnum) {
  for (int value : {-1, kDataTypeCount, 99}) {
    const auto t = static_cast<DataType>(value);
    EXPECT_FALSE(isValid(t)) << value;
    EXPECT_EQ(sizeOf(t), 0u) << value;
    EXPECT_FALSE(isFloatingPoint(t)) << value;
    EXPECT_EQ(toString(t), "invalid") << value;
  }
}

TEST(ReduceOpNames, RoundTripInAnyCase) {
  const std::pair<ReduceOp, const char*> ops[] = {{ReduceOp::Sum, "sum"},
                                                  {ReduceOp::Prod, "prod"},
                                                  {ReduceOp::Max, "max"},
                                                  {ReduceOp::Min, "min"},
                                                  {ReduceOp::Avg, "avg"}};
  static_assert(std::size(ops) == std::size_t{kReduceOpCount});
  for (const auto& [op, name] : ops) {
    EXPECT_TRUE(isValid(op)) << name;
    EXPECT_EQ(toString(op), name);
    EXPECT_EQ(parseReduceOp(name), op) << name;
    EXPECT_EQ(parseReduceOp(upper(name)), op) << name;
  }
}

TEST(ReduceOpNames, UnknownNamesAndValuesAreRejected) {
  for (const char* name : {"", "add", "average", "sum ", "maximum"})
    EXPECT_FALSE(parseReduceOp(name).has_value()) << "'" << name << "'";
  for (int value : {-1, kReduceOpCount, 99}) {
    EXPECT_FALSE(isValid(static_cast<ReduceOp>(value))) << value;
    EXPECT_EQ(toString(static_cast<ReduceOp>(value)), "invalid") << value;
  }
}

TEST(CollectiveNames, RoundTripWithUnderscoresInAnyCase) {
  const std::tuple<Collective, const char*, const char*> collectives[] = {
      {Collective::AllReduce, "allreduce", "all_reduce"},
      {Collective::AllGather, "allgather", "All_Gather"},
      {Collective::ReduceScatter, "reducescatter", "REDUCE_SCATTER"},
      {Collective::AllToAll, "alltoall", "all_to_all"},
      {Collective::Broadcast, "broadcast", "Broadcast"},
      {Collective::Reduce, "reduce", "REDUCE"}};
  static_assert(std::size(collectives) == std::size_t{kCollectiveCount});
  for (const auto& [c, name, spelling] : collectives) {
    EXPECT_EQ(toString(c), name);
    EXPECT_EQ(parseCollective(name), c) << name;
    EXPECT_EQ(parseCollective(spelling), c) << spelling;
  }
}

TEST(CollectiveNames, UnknownNamesAndValuesAreRejected) {
  for (const char* name : {"", "_", "reduces", "all-reduce", "allreduces", "gather"})
    EXPECT_FALSE(parseCollective(name).has_value()) << "'" << name << "'";
  EXPECT_EQ(toString(static_cast<Collective>(kCollectiveCount)), "invalid");
  EXPECT_EQ(toString(static_cast<Collective>(-1)), "invalid");
}

// --- Reduction on the host ----------------------------------------------------------------------

template <class T>
double asDouble(T v) {
  if constexpr (kIsLowFloat<T>)
    return toFloat(v);
  else
    return static_cast<double>(v);
}

// Inputs are small integers, bounded so that every partial result is exact in the element type
// (integers excepted: there the reference wraps too). Signed and floating types draw from
// [-bound, bound], unsigned ones from [0, bound].
struct InputBounds {
  int sum;  // sum and avg
  int prod;
  int maxMin;
};

InputBounds boundsFor(DataType type) {
  switch (type) {
    case DataType::Float16: return {50, 2, 1000};  // integers exact up to 2^11
    case DataType::Float32: return {50, 8, 1000};  // 8^8 = 2^24
    case DataType::BFloat16: return {16, 2, 256};  // integers exact up to 2^8
    case DataType::Fp8E4M3: return {2, 2, 16};     // integers exact up to 2^4
    case DataType::Fp8E5M2: return {1, 2, 8};      // integers exact up to 2^3
    default: return {50, 50, 100};                 // 50^8 < 2^53; 100 fits int8
  }
}

// The reduction of `values` over values.size() ranks, as a kernel computes it for one element.
template <class T, ReduceOp Op>
T reduce(const std::vector<int>& values) {
  T r = T(static_cast<double>(values[0]));
  for (std::size_t i = 1; i < values.size(); ++i) r = applyOp<Op>(r, T(static_cast<double>(values[i])));
  return finishOp<Op>(r, static_cast<int>(values.size()));
}

// The exact result in double, then brought to T: integers wrap modulo 2^bits and avg truncates the
// wrapped sum toward zero; floats round once, to nearest.
template <class T, ReduceOp Op>
T reference(const std::vector<int>& values) {
  double exact = values[0];
  for (std::size_t i = 1; i < values.size(); ++i) {
    const double v = values[i];
    switch (Op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: exact += v; break;
      case ReduceOp::Prod: exact *= v; break;
      case ReduceOp::Max: exact = std::max(exact, v); break;
      case ReduceOp::Min: exact = std::min(exact, v); break;
    }
  }
  const double n = static_cast<double>(values.size());
  if constexpr (std::is_integral_v<T>) {
    const auto wrapped =
        static_cast<T>(static_cast<std::make_unsigned_t<T>>(static_cast<std::int64_t>(exact)));
    if (Op == ReduceOp::Avg) return static_cast<T>(std::trunc(static_cast<double>(wrapped) / n));
    return wrapped;
  } else {
    return T(Op == ReduceOp::Avg ? exact / n : exact);
  }
}

std::string join(const std::vector<int>& values) {
  std::ostringstream out;
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  return out.str();
}

class ReduceOps : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  DataType type() const { return static_cast<DataType>(std::get<0>(GetParam())); }
  ReduceOp op() const { return static_cast<ReduceOp>(std::get<1>(GetParam())); }
};

TEST_P(ReduceOps, DispatchesToTheMatchingElementType) {
  dispatchTypeOp(type(), op(), [&]<class T, ReduceOp Op>() {
    EXPECT_EQ(Op, op());
    EXPECT_EQ(sizeof(T), sizeOf(type()));
    EXPECT_EQ(!std::is_integral_v<T>, isFloatingPoint(type()));
    if constexpr (std::is_integral_v<T>) {
      EXPECT_EQ(std::is_signed_v<T>, toString(type())[0] == 'i');
    }
  });
}

TEST_P(ReduceOps, MatchesDoubleReferenceOnSmallIntegers) {
  constexpr int kTrials = 300;
  dispatchTypeOp(type(), op(), [&]<class T, ReduceOp Op>() {
    const InputBounds bounds = boundsFor(type());
    const int bound = Op == ReduceOp::Prod                         ? bounds.prod
                      : Op == ReduceOp::Max || Op == ReduceOp::Min ? bounds.maxMin
                                                                   : bounds.sum;
    const int lowest = std::is_unsigned_v<T> ? 0 : -bound;
    std::mt19937 rng(static_cast<unsigned>(std::get<0>(GetParam()) * 16 + std::get<1>(GetParam())));
    std::uniform_int_distribution<int> value(lowest, bound), nranks(1, kMaxRanks);
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<int> values(nranks(rng));
      for (int& v : values) v = value(rng);
      const T got = reduce<T, Op>(values);
      const T want = reference<T, Op>(values);
      ASSERT_EQ(asDouble(got), asDouble(want)) << toString(Op) << " over {" << join(values) << "}";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceOps,
                         ::testing::Combine(::testing::Range(0, kDataTypeCount),
                                            ::testing::Range(0, kReduceOpCount)),
                         [](const auto& info) {
                           return std::string(toString(static_cast<DataType>(std::get<0>(info.param)))) +
                                  "_" + std::string(toString(static_cast<ReduceOp>(std::get<1>(info.param))));
                         });

TEST(ReduceOpsIntegers, WrapLikeUnsignedArithmetic) {
  EXPECT_EQ(applyOp<ReduceOp::Sum>(std::int8_t{100}, std::int8_t{100}), std::int8_t{-56});
  EXPECT_EQ(applyOp<ReduceOp::Sum>(std::int8_t{-128}, std::int8_t{-1}), std::int8_t{127});
  EXPECT_EQ(applyOp<ReduceOp::Prod>(std::int8_t{16}, std::int8_t{8}), std::int8_t{-128});
  EXPECT_EQ(applyOp<ReduceOp::Sum>(std::uint8_t{200}, std::uint8_t{100}), std::uint8_t{44});
  EXPECT_EQ(applyOp<ReduceOp::Prod>(std::uint8_t{16}, std::uint8_t{16}), std::uint8_t{0});
  constexpr auto i32max = std::numeric_limits<std::int32_t>::max();
  EXPECT_EQ(applyOp<ReduceOp::Sum>(i32max, std::int32_t{1}), std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(applyOp<ReduceOp::Prod>(std::int32_t{65536}, std::int32_t{65536}), 0);
  EXPECT_EQ(applyOp<ReduceOp::Prod>(0xFFFFFFFFu, 0xFFFFFFFFu), 1u);  // (2^32 - 1)^2 mod 2^32
  constexpr auto i64max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(applyOp<ReduceOp::Sum>(i64max, std::int64_t{1}), std::numeric_limits<std::int64_t>::min());
  constexpr auto u64max = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(applyOp<ReduceOp::Prod>(u64max, u64max), 1u);
}

TEST(ReduceOpsIntegers, AvgTruncatesTowardZero) {
  EXPECT_EQ(finishOp<ReduceOp::Avg>(std::int32_t{7}, 2), 3);
  EXPECT_EQ(finishOp<ReduceOp::Avg>(std::int32_t{-7}, 2), -3);
  EXPECT_EQ(finishOp<ReduceOp::Avg>(std::int8_t{-128}, 3), std::int8_t{-42});
  EXPECT_EQ(finishOp<ReduceOp::Avg>(std::int64_t{-9}, 4), -2);
  EXPECT_EQ(finishOp<ReduceOp::Avg>(std::uint8_t{255}, 8), std::uint8_t{31});
  // Only avg changes the value at the end.
  EXPECT_EQ(finishOp<ReduceOp::Sum>(std::int32_t{-7}, 2), -7);
}

// Combined in float but rounded back after every step, as on the GPU: 256 + 1 rounds to 256 in
// bf16 (a tie, to even) each time, where a float accumulator would reach 258.
TEST(ReduceOpsLowFloat, RoundsAfterEachStep) {
  const __nv_bfloat16 one(1.0f);
  __nv_bfloat16 r(256.0f);
  r = applyOp<ReduceOp::Sum>(r, one);
  r = applyOp<ReduceOp::Sum>(r, one);
  EXPECT_EQ(asDouble(r), 256.0);
}

}  // namespace
}  // namespace ferry
