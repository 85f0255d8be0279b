// KIVI asymmetric min/max quantization ("KIVI: a tuning-free asymmetric 2bit quantization for KV
// cache", docs/papers.md): X' = clamp(round((X - z) / s), 0, 2^b - 1), z = min X,
// s = (max X - min X) / (2^b - 1); keys grouped per channel over G tokens, values per token over
// G channels; and the 1-bit variant of SpeCache (docs/papers.md, §3.4: z = (3 min + max) / 4,
// s = (max - min) / 2, codes clamped to {0, 1}, i.e. the two levels sit at the quarter points of
// the range instead of at its ends).
//
// Scales and zero points are stored as IEEE f16 (2 bytes each). For 2/4/8 bits the zero point is
// rounded down and the scale up, so the stored grid still covers [min, max] and every element is
// within half a step of its dequantized value. Codes are packed LSB-first, `8 / bits` per byte,
// each row of `dim` codes padded to whole bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsdk::cpu {

// True for the supported widths 1, 2, 4, 8.
bool kivi_bits_supported(uint32_t bits);

// Stored (f16) scale and zero point of one group whose elements span [mn, mx].
struct KiviGroupParams {
  uint16_t scale_f16;
  uint16_t zero_f16;
};
KiviGroupParams kivi_group_params(float mn, float mx, uint32_t bits);

// Quantizes one element with the stored parameters (decoded to f32): clamp(round((x-z)/s), 0, L).
uint8_t kivi_code(float x, float scale, float zero, uint32_t bits);
inline float kivi_dequant(uint32_t code, float scale, float zero) {
  return zero + float(code) * scale;
}

// Bytes of one packed row of `n_codes` codes.
inline size_t kivi_packed_bytes(size_t n_codes, uint32_t bits) {
  return (n_codes * bits + 7) / 8;
}
void kivi_pack(const uint8_t* codes, size_t n_codes, uint32_t bits, uint8_t* packed);
void kivi_unpack(const uint8_t* packed, size_t n_codes, uint32_t bits, uint8_t* codes);

// Keys: one block of `n_tokens` rows [n_tokens][dim] quantized per channel (the block is one
// KIVI key group). Writes packed codes [n_tokens][kivi_packed_bytes(dim)] and scale/zero [dim].
void kivi_quantize_keys(const float* k, size_t n_tokens, size_t dim, uint32_t bits,
                        uint8_t* codes, uint16_t* scale, uint16_t* zero);
// Dequantizes rows [first, first + count) of such a block into out [count][dim].
void kivi_dequantize_keys(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                          size_t first, size_t count, size_t dim, uint32_t bits, float* out);

// Values: rows [n_tokens][dim], each row quantized in groups of `group` channels (the last group
// may be shorter). Writes packed codes [n_tokens][kivi_packed_bytes(dim)] and scale/zero
// [n_tokens][kivi_value_groups(dim, group)].
inline size_t kivi_value_groups(size_t dim, size_t group) { return (dim + group - 1) / group; }
void kivi_quantize_values(const float* v, size_t n_tokens, size_t dim, size_t group,
                          uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero);
void kivi_dequantize_values(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                            size_t n_tokens, size_t dim, size_t group, uint32_t bits, float* out);

}  // namespace kvsdk::cpu
