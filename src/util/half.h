// IEEE binary16 and bfloat16 conversions (round to nearest even), portable scalar code: the
// exact tier stores f16, and hosts may pass bf16. Header-only so kernels inline them.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvsdk {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // Subnormal: value = man * 2^-24, exact in f32.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf or NaN (keep NaN quiet and non-zero)
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (ax < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Adding 0.5 shifts the value so that the hardware's round-to-nearest-even on the f32
    // addition performs the half-precision subnormal rounding.
    const float r = bits_float(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(r) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  const uint32_t rounded = ax + 0xc8000fffu + odd;  // rebias exponent (-112<<23) and round
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

inline float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace kvsdk
