// Device-side KIVI arithmetic shared by the quantization and attention kernels. Every operation
// mirrors backends/cpu/kivi_quant.cpp step for step with explicitly rounded intrinsics (__fadd_rn,
// __fmul_rn, __fdiv_rn), so nvcc cannot contract them into FMAs and the codes, scales and zero
// points are bit-identical to the CPU backend's.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace kvsdk::cuda::detail {

__device__ __forceinline__ uint16_t f32_to_f16_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
// Widens as the CPU reference's f16_to_f32 does, NaN payloads included: the hardware conversion
// (cvt.f32.f16) returns the canonical NaN for every NaN input, which the first GPU run showed.
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0u) {
    return __uint_as_float((uint32_t(h & 0x8000u) << 16) | 0x7f800000u |
                           (uint32_t(h & 0x3ffu) << 13));
  }
  return __half2float(__ushort_as_half(h));
}

// Largest f16 not above x / smallest f16 not below x (as kivi_quant.cpp).
__device__ __forceinline__ uint16_t f16_round_down(float x) {
  const uint16_t h = f32_to_f16_bits(x);
  if (f16_bits_to_f32(h) <= x) return h;
  if (h == 0x0000u) return 0x8001u;
  return (h & 0x8000u) ? uint16_t(h + 1) : uint16_t(h - 1);
}
__device__ __forceinline__ uint16_t f16_round_up(float x) {
  const uint16_t h = f32_to_f16_bits(x);
  if (f16_bits_to_f32(h) >= x) return h;
  if (h == 0x8000u) return 0x0001u;
  return (h & 0x8000u) ? uint16_t(h - 1) : uint16_t(h + 1);
}

__device__ __forceinline__ uint32_t kivi_levels(uint32_t bits) {
  return bits == 1 ? 1u : (1u << bits) - 1u;
}

// Stored (f16) scale and zero point of a group spanning [mn, mx] (KIVI §3; 1 bit: SpeCache §3.4).
__device__ __forceinline__ void kivi_params(float mn, float mx, uint32_t bits, uint16_t* scale,
                                            uint16_t* zero) {
  if (bits == 1) {
    *scale = f32_to_f16_bits(__fmul_rn(__fsub_rn(mx, mn), 0.5f));
    *zero = f32_to_f16_bits(__fmul_rn(__fadd_rn(__fmul_rn(3.0f, mn), mx), 0.25f));
    return;
  }
  const uint16_t z = f16_round_down(mn);
  const float span = __fsub_rn(mx, f16_bits_to_f32(z));
  *zero = z;
  *scale = span > 0.0f ? f16_round_up(__fdiv_rn(span, float(kivi_levels(bits)))) : uint16_t(0);
}

// clamp(floor((x - z) / s + 0.5), 0, levels); 0 for a constant group (s = 0).
__device__ __forceinline__ uint32_t kivi_code(float x, float scale, float zero, uint32_t bits) {
  if (!(scale > 0.0f)) return 0;
  const float u = floorf(__fadd_rn(__fdiv_rn(__fsub_rn(x, zero), scale), 0.5f));
  return uint32_t(fminf(fmaxf(u, 0.0f), float(kivi_levels(bits))));
}

// Code of channel c in a packed row (LSB-first, 8 / bits codes per byte).
__device__ __forceinline__ uint32_t kivi_unpack_code(const uint8_t* row, uint32_t c,
                                                     uint32_t bits) {
  const uint32_t bit = c * bits;
  return (uint32_t(row[bit >> 3]) >> (bit & 7u)) & ((1u << bits) - 1u);
}

// zero + code * scale, rounded as the CPU's kivi_dequant (one multiply, one add).
__device__ __forceinline__ float kivi_dequant(uint32_t code, float scale, float zero) {
  return __fadd_rn(zero, __fmul_rn(float(code), scale));
}

}  // namespace kvsdk::cuda::detail
