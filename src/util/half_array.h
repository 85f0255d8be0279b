// Bulk f16 -> f32 conversion, the inner loop of attention over the exact (f16) tier. The
// portable reference converts element by element with f16_to_f32 (half.h); on AArch64 a NEON
// path (half_array_neon.cpp) converts 8 halves per instruction pair, selected at compile time
// (NEON is part of every AArch64 CPU); on x86-64 an F16C path (half_array.cpp), selected at run
// time. Every path produces the same bits for every input.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__aarch64__) && defined(__ARM_NEON)
#define KVSDK_HALF_ARRAY_NEON 1
#else
#define KVSDK_HALF_ARRAY_NEON 0
#endif
// x86-64 (GCC/Clang): an F16C path chosen at run time (half_array.cpp).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSDK_HALF_ARRAY_F16C 1
#else
#define KVSDK_HALF_ARRAY_F16C 0
#endif

namespace kvsdk {

// dst[i] = f16_to_f32(src[i]) for i < n, one element at a time (the reference).
void f16_to_f32_array_scalar(const uint16_t* src, float* dst, size_t n);

// Same result, bit for bit, with the fastest path this build has.
void f16_to_f32_array(const uint16_t* src, float* dst, size_t n);

}  // namespace kvsdk
