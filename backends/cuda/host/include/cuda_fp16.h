// Host execution shim: __half and __half2 with the conversions kvsdk's kernels use, bit-exact
// with the device's (round to nearest even), through kvsdk's own f16 code (src/util/half.h), so
// the kernels and the CPU backend convert identically by construction.
#pragma once

#include <cstdint>
#include <cstring>

#include "util/half.h"

struct __half {
  uint16_t bits;
};
struct __half2 {
  __half x, y;
};

inline __half __float2half_rn(float f) { return __half{kvsdk::f32_to_f16(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return kvsdk::f16_to_f32(h.bits); }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
