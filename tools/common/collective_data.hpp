#pragma once
// Test data and the host reference of every collective, shared by ferry-bench and the GPU tests.
//
// Rank q's send buffer holds value(q, i) at element i: random, seeded, different per rank; floats
// are random in [-2, 2] at full precision. The reference reduces in rank order with the same
// element operations as the kernels (collectives/reduce_ops.hpp), in float for a shape with
// Accumulation::Float32 as the kernels' WordAccumulator does, so a correct result matches it bit
// for bit and any difference counts as wrong.
//
//   std::vector<char> send(bytes);
//   fillSend(type, send.data(), sendCount, rank, seed);
//   ... run the collective, copy recv back ...
//   std::vector<char> want(recvBytes);
//   expectedRecv(shape, want.data());
//   std::size_t wrong = countWrong(type, got.data(), want.data(), recvCount);
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/reduce_ops.hpp"
#include "ferry/comm.hpp"
#include "ferry/datatype.hpp"

namespace ferry::tools {

// What outputs are filled with before a call: NaN in every float type, -1 in every integer.
inline constexpr unsigned char kPoisonByte = 0xFF;

// The collectives that take a reduce op, and those that take a root.
inline bool reduces(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}
inline bool rooted(Collective c) { return c == Collective::Broadcast || c == Collective::Reduce; }

// What a call looks like from one rank, in the API's terms.
struct CallShape {
  Collective collective = Collective::AllReduce;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  std::size_t count = 0;  // the API's count (see comm.hpp)
  int rank = 0;
  int worldSize = 1;
  int root = 0;
  std::uint64_t seed = 1;
  // A PreMulSum call (op is Sum): rank q's input counts times preMulFactor(q).
  bool preMulSum = false;
  // How a sum of 16- and 8-bit floats adds up (Float32: in float, rounded once).
  Accumulation accumulation = Accumulation::Stepwise;

  std::size_t sendCount() const {
    return collective == Collective::ReduceScatter || collective == Collective::AllToAll
               ? count * static_cast<std::size_t>(worldSize)
               : count;
  }
  std::size_t recvCount() const {
    return collective == Collective::AllGather || collective == Collective::AllToAll
               ? count * static_cast<std::size_t>(worldSize)
               : count;
  }
  // This rank reads its send buffer (all but a broadcast's non-root ranks).
  bool hasSend() const { return collective != Collective::Broadcast || rank == root; }
};

namespace detail {

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
T valueOf(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull ^ mix(static_cast<std::uint64_t>(rank) << 40 ^ i));
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(h);
  } else {
    // [-2, 2], 24 random bits: low-precision types round it, which is what they would hold anyway.
    const float f = static_cast<float>(static_cast<std::int64_t>(h >> 40) - (1ll << 23)) / static_cast<float>(1 << 22);
    if constexpr (std::is_same_v<T, double>) return static_cast<double>(h >> 11) / static_cast<double>(1ull << 51) - 2.0;
    return fromFloat<T>(f);
  }
}

// Runs body(begin, end) over [0, n) on a few threads (the checks of large sizes are CPU-bound).
template <class Body>
void parallelFor(std::size_t n, Body body) {
  const unsigned threads = n < (1u << 20) ? 1u : std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u);
  std::vector<std::thread> pool;
  const std::size_t per = (n + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    const std::size_t b = std::min(n, t * per), e = std::min(n, b + per);
    if (t + 1 == threads)
      body(b, e);
    else
      pool.emplace_back(body, b, e);
  }
  for (auto& th : pool) th.join();
}

template <class F>
decltype(auto) withType(DataType type, ReduceOp op, F&& f) {
  return dispatchTypeOp(type, op, std::forward<F>(f));
}

}  // namespace detail

// Rank `rank`'s PreMulSum factor: small, exact in every type, different on every rank (the
// floats' 0.5 * (rank + 1) also scales down).
template <class T>
T preMulFactor(int rank) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(rank + 2);
  else
    return fromFloat<T>(0.5f * static_cast<float>(rank + 1));
}

// The same as bytes (an element of `type` in the first sizeOf(type) of them).
inline std::uint64_t preMulFactorBits(DataType type, int rank) {
  std::uint64_t bits = 0;
  detail::withType(type, ReduceOp::Sum, [&]<class T, ReduceOp>() {
    const T f = preMulFactor<T>(rank);
    std::memcpy(&bits, &f, sizeof f);
  });
  return bits;
}

// Rank `rank`'s send buffer: count elements of value(rank, i).
inline void fillSend(DataType type, void* out, std::size_t count, int rank, std::uint64_t seed) {
  detail::withType(type, ReduceOp::Sum, [&]<class T, ReduceOp>() {
    T* o = static_cast<T*>(out);
    detail::parallelFor(count, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) o[i] = detail::valueOf<T>(seed, rank, i);
    });
  });
}

// What shape.rank's recv buffer must hold afterwards, when it was filled with kPoisonByte before the
// call (and then, in place, with the input). A reduce's non-root ranks must leave it as it was.
inline void expectedRecv(const CallShape& s, void* out, bool inPlace = false) {
  detail::withType(s.type, s.op, [&]<class T, ReduceOp Op>() {
    T* o = static_cast<T*>(out);
    const std::size_t n = s.count;
    const int R = s.worldSize;
    auto term = [&](int q, std::size_t index) {  // what rank q contributes to element `index`
      const T v = detail::valueOf<T>(s.seed, q, index);
      return s.preMulSum ? applyOp<ReduceOp::Prod>(v, preMulFactor<T>(q)) : v;
    };
    auto reduceAt = [&](std::size_t index) {  // op over ranks of element `index` of their send buffers
      if constexpr (kWideSum<T, Op>) {
        if (s.accumulation == Accumulation::Float32) {  // in rank order in float, rounded once
          float sum = toFloat(term(0, index));
          for (int q = 1; q < R; ++q) sum += toFloat(term(q, index));
          return fromFloat<T>(Op == ReduceOp::Avg ? sum / static_cast<float>(R) : sum);
        }
      }
      T acc = term(0, index);
      for (int q = 1; q < R; ++q) acc = applyOp<Op>(acc, term(q, index));
      return finishOp<Op>(acc, R);
    };
    detail::parallelFor(s.recvCount(), [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        switch (s.collective) {
          case Collective::AllReduce: o[i] = reduceAt(i); break;
          case Collective::ReduceScatter: o[i] = reduceAt(static_cast<std::size_t>(s.rank) * n + i); break;
          case Collective::AllGather: o[i] = detail::valueOf<T>(s.seed, static_cast<int>(i / n), i % n); break;
          case Collective::AllToAll:
            o[i] = detail::valueOf<T>(s.seed, static_cast<int>(i / n), static_cast<std::size_t>(s.rank) * n + i % n);
            break;
          case Collective::Broadcast: o[i] = detail::valueOf<T>(s.seed, s.root, i); break;
          case Collective::Reduce:
            if (s.rank == s.root)
              o[i] = reduceAt(i);
            else if (inPlace)
              o[i] = detail::valueOf<T>(s.seed, s.rank, i);
            else
              std::memset(static_cast<void*>(o + i), kPoisonByte, sizeof(T));
            break;
        }
      }
    });
  });
}

// Elements whose bytes differ.
inline std::size_t countWrong(DataType type, const void* got, const void* want, std::size_t count) {
  const std::size_t es = sizeOf(type);
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += std::memcmp(g + i * es, w + i * es, es) != 0;
  return wrong;
}

// Elements of a reduction that differ by more than a reduction in another order may: exact for
// integers and for min and max; for floats, `ranks` times 16 units of the type's precision at the
// magnitude the partial results of [-2, 2] inputs reach (a few units in the last place).
inline std::size_t countWrongReordered(DataType type, ReduceOp op, int ranks, const void* got, const void* want,
                                       std::size_t count) {
  if (op == ReduceOp::Min || op == ReduceOp::Max) return countWrong(type, got, want, count);
  return detail::withType(type, ReduceOp::Sum, [&]<class T, ReduceOp>() -> std::size_t {
    if constexpr (std::is_integral_v<T>) {
      return countWrong(type, got, want, count);
    } else {
      double eps = 0;
      switch (type) {
        case DataType::Float64: eps = 0x1p-52; break;
        case DataType::Float32: eps = 0x1p-23; break;
        case DataType::Float16: eps = 0x1p-10; break;
        case DataType::BFloat16: eps = 0x1p-7; break;
        case DataType::Fp8E4M3: eps = 0x1p-3; break;
        default: eps = 0x1p-2; break;  // e5m2
      }
      const double tolerance = 16.0 * eps * ranks;
      const T* g = static_cast<const T*>(got);
      const T* w = static_cast<const T*>(want);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        double a = 0, b = 0;
        if constexpr (std::is_same_v<T, double>) {
          a = g[i];
          b = w[i];
        } else {
          a = toFloat(g[i]);
          b = toFloat(w[i]);
        }
        const bool same = std::memcmp(g + i, w + i, sizeof(T)) == 0;
        wrong += !same && !(std::abs(a - b) <= tolerance * std::max(1.0, std::abs(b)));
      }
      return wrong;
    }
  });
}

}  // namespace ferry::tools
