// Scalar conversions between the storage dtypes and float/double (host code).
// Rounding to f16/bf16 is round-to-nearest-even, NaN stays NaN, overflow goes to inf.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalize
    uint32_t e = 113;
    while (!(mant & 0x400u)) { mant <<= 1; --e; }
    u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);          // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);          // rounds to inf
  if (abs < 0x38800000u) {                                          // f16 subnormal or zero
    if (abs < 0x33000000u) return uint16_t(sign);                   // < half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;                                 // 14 + (112 - e)
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

// Read element i of a buffer of the given dtype as float / write a float with rounding.
inline float load_as_float(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}
inline void store_from_float(void* base, int64_t i, DType t, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = x; break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = float_to_f16(x); break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); break;
  }
}
// The value x takes after a round trip through dtype t.
inline float round_to(float x, DType t) {
  switch (t) {
    case DType::f32: return x;
    case DType::f16: return f16_to_float(float_to_f16(x));
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
  }
  return x;
}

}  // namespace flashattn::detail
