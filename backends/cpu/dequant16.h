// Sixteen KIVI codes at a time for the KVSDK_TARGET_CLONES kernels (kivi_quant.cpp's row
// dequantizers, specache_attention.cpp's bulk reads): GCC/Clang 16-lane vector extensions, which
// each clone compiles for its own target, and the inlining that lets them.
#pragma once

#include <cstdint>
#include <cstring>

#include "target_clones.h"

// Helpers forced inline into each clone of their KVSDK_TARGET_CLONES callers, so that they
// vectorize for that clone's target (a call would run the baseline's SSE2 code).
#if defined(__GNUC__)
#define KVSDK_CLONE_INLINE __attribute__((always_inline)) inline
#else
#define KVSDK_CLONE_INLINE inline
#endif

#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVSDK_DEQUANT16 1

namespace kvsdk::cpu {

typedef int32_t Ints16 __attribute__((vector_size(64)));
typedef float Floats16 __attribute__((vector_size(64)));

// 16 channels at 1 or 2 bits from 2B bytes read as one little-endian word (codes are packed
// LSB-first, so code j sits at bits B * j): broadcast, shift each lane by its own constant,
// mask, convert, then z + code * s lane by lane: kivi_dequant's operations on every element.
template <uint32_t B>
KVSDK_CLONE_INLINE void dequant16(const uint8_t* p, const Floats16& s, const Floats16& z,
                                  float* out) {
  static_assert(B == 1 || B == 2, "16 codes fit one 32-bit word at 1 or 2 bits");
  constexpr Ints16 kShift = {0 * B,  1 * B,  2 * B,  3 * B,  4 * B,  5 * B,  6 * B,  7 * B,
                             8 * B,  9 * B,  10 * B, 11 * B, 12 * B, 13 * B, 14 * B, 15 * B};
  uint32_t word = 0;
  std::memcpy(&word, p, 2 * B);
  const Ints16 codes = ((Ints16{} + int32_t(word)) >> kShift) & int32_t((1u << B) - 1u);
  const Floats16 o = z + __builtin_convertvector(codes, Floats16) * s;
  std::memcpy(out, &o, sizeof o);
}

// Through a reference, not a return value: a 64-byte vector returned by value changes the ABI
// between the clones (GCC's -Wpsabi).
KVSDK_CLONE_INLINE void load16(const float* p, Floats16& x) { std::memcpy(&x, p, sizeof x); }

}  // namespace kvsdk::cpu
#else
#define KVSDK_DEQUANT16 0
#endif
