#pragma once
// Element types and reduction operators of the collectives. The numbering is NCCL's
// (ncclDataType_t, ncclRedOp_t), so the NCCL-API library passes values through unchanged.
//
//   std::size_t bytes = count * ferry::sizeOf(ferry::DataType::BFloat16);
//   auto t = ferry::parseDataType("bf16");   // also "bfloat16"; nullopt when unknown
#include <cstddef>
#include <optional>
#include <string_view>

#include "ferry/api.hpp"

namespace ferry {

enum class DataType : int {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Float16 = 6,
  Float32 = 7,
  Float64 = 8,
  BFloat16 = 9,
  Fp8E4M3 = 10,
  Fp8E5M2 = 11,
};
inline constexpr int kDataTypeCount = 12;

enum class ReduceOp : int {
  Sum = 0,
  Prod = 1,
  Max = 2,
  Min = 3,
  Avg = 4,  // the sum divided by the number of ranks (integers: truncated toward zero)
};
inline constexpr int kReduceOpCount = 5;

// How a sum or average of 16- and 8-bit floats (half, bfloat16, fp8) adds up the ranks' terms.
// Stepwise (the default): in the call's type, rounded after each rank's term, in rank order, as NCCL
// does. Float32: in float32, in rank order, rounded to the type once at the end (an average divides
// before that rounding), as torch.sum of the ranks' stacked tensors does (up to the order of its
// float adds). It costs nothing more where the algorithm reduces every element in one place, and
// only such algorithms run it. Other types and ops come out alike either way.
enum class Accumulation : int {
  Stepwise = 0,
  Float32 = 1,
};

// NCCL's ncclRedOpCreatePreMulSum as an op of its own: a sum in which each rank's input is first
// multiplied by a factor of that rank, recv[i] = sum over ranks r of (factor_r * send_r[i]), each
// product rounded to the call's type (e.g. a factor of 1/worldSize everywhere gives an average that
// never leaves the input's range). `factor` points to one element of the call's type: in host
// memory it is read when the call is made (a captured graph keeps that value), in device memory
// of the Comm's GPU (onDevice) when the call runs.
struct PreMulSum {
  const void* factor = nullptr;
  bool onDevice = false;
};

// Bytes of one element; 0 for a value outside the enum.
FERRY_API std::size_t sizeOf(DataType type) noexcept;
FERRY_API bool isValid(DataType type) noexcept;
FERRY_API bool isValid(ReduceOp op) noexcept;
FERRY_API bool isFloatingPoint(DataType type) noexcept;

// Short names, as ferry-bench prints them: int8 uint8 int32 uint32 int64 uint64 half float double
// bfloat16 f8e4m3 f8e5m2; sum prod max min avg. "invalid" for a value outside the enum.
FERRY_API std::string_view toString(DataType type) noexcept;
FERRY_API std::string_view toString(ReduceOp op) noexcept;

// Accepts the short names above and common aliases (fp32, f32, float32, fp16, bf16, fp64, e4m3,
// e5m2, ...; "mean" for avg), case-insensitively.
FERRY_API std::optional<DataType> parseDataType(std::string_view name) noexcept;
FERRY_API std::optional<ReduceOp> parseReduceOp(std::string_view name) noexcept;

}  // namespace ferry
