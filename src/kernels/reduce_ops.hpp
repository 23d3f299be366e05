#pragma once
// Element-wise reduction, the same code on the GPU (kernels) and on the host (tests use it as the
// reference of the GPU's rounding). Low-precision floats (fp16, bf16, fp8) are combined in float
// and rounded back after each step, as NCCL does; integers wrap (computed unsigned, no UB).
//
//   T r = applyOp<ReduceOp::Sum>(a, b);        // one step
//   r = finishOp<ReduceOp::Avg>(r, nranks);    // after the last step: avg divides, others keep r
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "ferry/datatype.hpp"
#include "ferry/device/macros.hpp"

namespace ferry {

template <class T>
inline constexpr bool kIsLowFloat = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
                                    std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

// The reductions that Accumulation::Float32 changes: sums and averages of 16- and 8-bit floats.
template <class T, ReduceOp Op>
inline constexpr bool kWideSum = kIsLowFloat<T> && (Op == ReduceOp::Sum || Op == ReduceOp::Avg);

template <class T>
FERRY_HOST_DEVICE FERRY_INLINE float toFloat(T v) {
  return static_cast<float>(v);
}
template <class T>
FERRY_HOST_DEVICE FERRY_INLINE T fromFloat(float v) {
  return T(v);
}

template <ReduceOp Op, class T>
FERRY_HOST_DEVICE FERRY_INLINE T applyOp(T a, T b) {
  if constexpr (kIsLowFloat<T>) {
    return fromFloat<T>(applyOp<Op, float>(toFloat(a), toFloat(b)));
  } else if constexpr (Op == ReduceOp::Max) {
    return a > b ? a : b;
  } else if constexpr (Op == ReduceOp::Min) {
    return a < b ? a : b;
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // Promotion of small unsigned types to int could overflow in a product: go through 32 bits.
    using W = std::conditional_t<(sizeof(U) < 4), std::uint32_t, U>;
    const W x = static_cast<W>(static_cast<U>(a)), y = static_cast<W>(static_cast<U>(b));
    return static_cast<T>(static_cast<U>(Op == ReduceOp::Prod ? x * y : x + y));
  } else {
    return Op == ReduceOp::Prod ? a * b : a + b;
  }
}

template <ReduceOp Op, class T>
FERRY_HOST_DEVICE FERRY_INLINE T finishOp(T v, int nranks) {
  if constexpr (Op != ReduceOp::Avg) {
    return v;
  } else if constexpr (kIsLowFloat<T>) {
    return fromFloat<T>(toFloat(v) / static_cast<float>(nranks));
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v / static_cast<std::int64_t>(nranks));
  } else {
    return v / static_cast<T>(nranks);
  }
}

// The C++ type of each DataType.
template <DataType D> struct ElementOf;
template <> struct ElementOf<DataType::Int8> { using type = std::int8_t; };
template <> struct ElementOf<DataType::Uint8> { using type = std::uint8_t; };
template <> struct ElementOf<DataType::Int32> { using type = std::int32_t; };
template <> struct ElementOf<DataType::Uint32> { using type = std::uint32_t; };
template <> struct ElementOf<DataType::Int64> { using type = std::int64_t; };
template <> struct ElementOf<DataType::Uint64> { using type = std::uint64_t; };
template <> struct ElementOf<DataType::Float16> { using type = __half; };
template <> struct ElementOf<DataType::Float32> { using type = float; };
template <> struct ElementOf<DataType::Float64> { using type = double; };
template <> struct ElementOf<DataType::BFloat16> { using type = __nv_bfloat16; };
template <> struct ElementOf<DataType::Fp8E4M3> { using type = __nv_fp8_e4m3; };
template <> struct ElementOf<DataType::Fp8E5M2> { using type = __nv_fp8_e5m2; };

// Calls f.template operator()<T, Op>() for the runtime (type, op). @pre both valid.
template <class F>
decltype(auto) dispatchTypeOp(DataType type, ReduceOp op, F&& f);

namespace detail {
template <class T, class F>
decltype(auto) dispatchOp(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::Sum: return f.template operator()<T, ReduceOp::Sum>();
    case ReduceOp::Prod: return f.template operator()<T, ReduceOp::Prod>();
    case ReduceOp::Max: return f.template operator()<T, ReduceOp::Max>();
    case ReduceOp::Min: return f.template operator()<T, ReduceOp::Min>();
    case ReduceOp::Avg: break;
  }
  return f.template operator()<T, ReduceOp::Avg>();
}
}  // namespace detail

template <class F>
decltype(auto) dispatchTypeOp(DataType type, ReduceOp op, F&& f) {
#define FERRY_DISPATCH_CASE(D) \
  case DataType::D: return detail::dispatchOp<typename ElementOf<DataType::D>::type>(op, f);
  switch (type) {
    FERRY_DISPATCH_CASE(Int8)
    FERRY_DISPATCH_CASE(Uint8)
    FERRY_DISPATCH_CASE(Int32)
    FERRY_DISPATCH_CASE(Uint32)
    FERRY_DISPATCH_CASE(Int64)
    FERRY_DISPATCH_CASE(Uint64)
    FERRY_DISPATCH_CASE(Float16)
    FERRY_DISPATCH_CASE(Float32)
    FERRY_DISPATCH_CASE(Float64)
    FERRY_DISPATCH_CASE(BFloat16)
    FERRY_DISPATCH_CASE(Fp8E4M3)
    case DataType::Fp8E5M2: break;
  }
#undef FERRY_DISPATCH_CASE
  return detail::dispatchOp<__nv_fp8_e5m2>(op, f);
}

}  // namespace ferry
