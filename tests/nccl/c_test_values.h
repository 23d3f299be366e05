/* The data of the C tests of the NCCL API: each datatype's size and name, every rank's input (small
 * integers, so that over up to 4 ranks every sum, product, max, min and power-of-two average is
 * exact in every type), a value written as a datatype, the reduction over ranks as the type
 * computes it, and an element-by-element comparison of an output with what it must hold. Link
 * with -lm. */
#ifndef FERRY_TESTS_NCCL_C_TEST_VALUES_H
#define FERRY_TESTS_NCCL_C_TEST_VALUES_H

#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline size_t typeBytes(int t) {
  static const size_t bytes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return bytes[t];
}

static inline const char* typeName(int t) {
  static const char* const names[ncclNumTypes] = {"int8",    "uint8",    "int32",   "uint32",
                                                  "int64",   "uint64",   "float16", "float32",
                                                  "float64", "bfloat16", "e4m3",    "e5m2"};
  return names[t];
}

static inline const char* opName(int op) {
  static const char* const names[ncclNumOps] = {"sum", "prod", "max", "min", "avg"};
  return names[op];
}

static inline int isFloat(int t) { return t >= ncclFloat16; }
static inline int isUnsigned(int t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }

/* Rank r's element i: a small integer, never negative for unsigned types. */
static inline double value(int t, int r, size_t i) {
  const int v = (int)((r * 7 + i * 3) % 5);
  return isUnsigned(t) ? v : v - 2;
}

/* A float with few mantissa bits, from an exact value: expBits, mantBits, bias. */
static inline uint32_t minifloat(double v, int expBits, int mantBits, int bias) {
  const uint32_t sign = signbit(v) ? 1u : 0u;
  if (v == 0) return sign << (expBits + mantBits);
  int e = 0;
  const double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
  const uint32_t exponent = (uint32_t)(e - 1 + bias);
  const uint32_t mantissa = (uint32_t)((m * 2 - 1) * (double)(1u << mantBits));
  return sign << (expBits + mantBits) | exponent << mantBits | mantissa;
}

/* The value of minifloat bits (for messages). `finite`: the all-ones exponent holds numbers too
 * (e4m3, whose only NaN is all ones); else it is inf or NaN. */
static inline double fromMinifloat(uint32_t bits, int expBits, int mantBits, int bias, int finite) {
  const uint32_t mantissa = bits & ((1u << mantBits) - 1);
  const uint32_t exponent = (bits >> mantBits) & ((1u << expBits) - 1);
  const double sign = (bits >> (expBits + mantBits)) & 1u ? -1 : 1;
  const uint32_t top = (1u << expBits) - 1;
  if (exponent == top && (!finite || mantissa == (1u << mantBits) - 1))
    return mantissa == 0 && !finite ? sign * INFINITY : NAN;
  const double fraction = (double)mantissa / (double)(1u << mantBits);
  if (exponent == 0) return sign * ldexp(fraction, 1 - bias);
  return sign * ldexp(1 + fraction, (int)exponent - bias);
}

/* Writes v as type t: the type's bits are worked out in a 64-bit word and its low typeBytes(t)
 * bytes (x86 and Arm are little-endian) stored with one memcpy, in a function kept out of line.
 * GCC 13.3 at -O3 dropped the int8 stores of two earlier versions (a pointer cast per case, then a
 * typed local and memcpy per case) once they were inlined into a fill loop, leaving the input
 * buffer unwritten (seen twice on the lent GPU machine; GCC 12 and clang were fine). */
__attribute__((noinline)) static void encode(int t, double v, void* out) {
  uint64_t bits = 0;
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclInt32:
    case ncclUint32:
    case ncclInt64:
    case ncclUint64: bits = (uint64_t)(int64_t)v; break; /* two's complement: the low bytes */
    case ncclFloat16: bits = minifloat(v, 5, 10, 15); break;
    case ncclFloat32: {
      const float x = (float)v;
      uint32_t u;
      memcpy(&u, &x, 4);
      bits = u;
      break;
    }
    case ncclFloat64: memcpy(&bits, &v, 8); break;
    case ncclBfloat16: bits = minifloat(v, 8, 7, 127); break;
    case ncclFloat8e4m3: bits = minifloat(v, 4, 3, 7); break;
    case ncclFloat8e5m2: bits = minifloat(v, 5, 2, 15); break;
  }
  memcpy(out, &bits, typeBytes(t));
}

/* The value of one element of type t (for messages). */
static inline double decode(int t, const void* in) {
  union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t u16;
    float f32;
    double f64;
  } x;
  memcpy(&x, in, typeBytes(t));
  switch (t) {
    case ncclInt8: return x.i8;
    case ncclUint8: return x.u8;
    case ncclInt32: return x.i32;
    case ncclUint32: return x.u32;
    case ncclInt64: return (double)x.i64;
    case ncclUint64: return (double)x.u64;
    case ncclFloat16: return fromMinifloat(x.u16, 5, 10, 15, 0);
    case ncclFloat32: return x.f32;
    case ncclFloat64: return x.f64;
    case ncclBfloat16: return fromMinifloat(x.u16, 8, 7, 127, 0);
    case ncclFloat8e4m3: return fromMinifloat(x.u8, 4, 3, 7, 1);
    case ncclFloat8e5m2: return fromMinifloat(x.u8, 5, 2, 15, 0);
  }
  return NAN;
}

/* op over ranks of their element i, as the type computes it (integers wrap like the type). */
static inline double reduceAt(int t, int op, int nranks, size_t i) {
  double acc = value(t, 0, i);
  for (int q = 1; q < nranks; ++q) {
    const double v = value(t, q, i);
    switch (op) {
      case ncclSum:
      case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
    }
  }
  if (op == ncclAvg) acc = isFloat(t) ? acc / nranks : (double)((int64_t)acc / nranks);
  return acc;
}

/* out[0, n): rank src's input elements [from, from + n) as type t. */
static inline void fillInputs(char* out, int t, int src, size_t from, size_t n) {
  for (size_t i = 0; i < n; ++i) encode(t, value(t, src, from + i), out + i * typeBytes(t));
}

/* out[0, n): op over the nranks ranks of their elements [from, from + n), as type t. */
static inline void fillReduced(char* out, int t, int op, int nranks, size_t from, size_t n) {
  for (size_t i = 0; i < n; ++i) encode(t, reduceAt(t, op, nranks, from + i), out + i * typeBytes(t));
}

/* Compares `count` elements of type t, byte for byte; returns how many differ, after printing (to
 * stderr, in one line after `who`) how many, and the first of them with its value and bytes and
 * what it should hold. */
static inline size_t compareElements(const char* who, int t, const void* got, const void* want,
                                     size_t count) {
  const size_t es = typeBytes(t);
  const unsigned char* g = (const unsigned char*)got;
  const unsigned char* w = (const unsigned char*)want;
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < count; ++i)
    if (memcmp(g + i * es, w + i * es, es) != 0 && wrong++ == 0) first = i;
  if (wrong == 0) return 0;
  char gotBytes[2 * 8 + 1], wantBytes[2 * 8 + 1]; /* an element is at most 8 bytes */
  for (size_t k = 0; k < es; ++k) {
    snprintf(gotBytes + 2 * k, 3, "%02x", g[first * es + k]);
    snprintf(wantBytes + 2 * k, 3, "%02x", w[first * es + k]);
  }
  /* One write: the ranks' processes share stderr. */
  fprintf(stderr,
          "%s: %zu of %zu %s elements wrong; the first, element %zu, is %g (bytes %s), want %g (%s)\n", who,
          wrong, count, typeName(t), first, decode(t, g + first * es), gotBytes, decode(t, w + first * es),
          wantBytes);
  return wrong;
}

#endif
