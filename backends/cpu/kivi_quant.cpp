#include "kivi_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dequant16.h"
#include "target_clones.h"
#include "util/half.h"

namespace kvsdk::cpu {

namespace {

// Largest f16 not above x / smallest f16 not below x (finite inputs in f16 range).
uint16_t f16_round_down(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) <= x) return h;
  if (h == 0x0000u) return 0x8001u;          // +0 -> smallest negative subnormal
  return (h & 0x8000u) ? uint16_t(h + 1) : uint16_t(h - 1);
}
uint16_t f16_round_up(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) >= x) return h;
  if (h == 0x8000u) return 0x0001u;          // -0 -> smallest positive subnormal
  return (h & 0x8000u) ? uint16_t(h - 1) : uint16_t(h + 1);
}

uint32_t levels(uint32_t bits) { return bits == 1 ? 1u : (1u << bits) - 1u; }


// The codes of every possible packed byte as floats, lowest bits first (float(code) is exact);
// for 1 and 2 bits (8 or 4 codes per byte).
template <uint32_t B>
struct CodeTable {
  static constexpr uint32_t per_byte = 8 / B, mask = (1u << B) - 1u;
  float codes[256][per_byte] = {};
  constexpr CodeTable() {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      for (uint32_t j = 0; j < per_byte; ++j) codes[byte][j] = float((byte >> (j * B)) & mask);
    }
  }
};
template <uint32_t B>
constexpr CodeTable<B> kCodeTable{};

// out[c] = z[c] + code_c * s[c] for one packed row; the width is a template parameter so the
// inner loop has a constant trip count (this runs in attention's inner loop). At 1 and 2 bits
// each whole byte looks its codes up as floats (one table row) instead of shifting and masking
// them out one by one, so the loop over a byte's channels is straight vector code; every element
// is kivi_dequant(code, s, z) either way.
template <uint32_t B>
KVSDK_CLONE_INLINE void dequant_row(const uint8_t* __restrict packed, size_t dim,
                                    const float* __restrict s, const float* __restrict z,
                                    float* __restrict out) {
  constexpr uint32_t per_byte = 8 / B, mask = (1u << B) - 1u;
  size_t whole_from = 0;
#if KVSDK_DEQUANT16
  if constexpr (B <= 2) {
    const size_t vecs = dim / 16;
    for (size_t i = 0; i < vecs; ++i) {
      Floats16 sv, zv;
      std::memcpy(&sv, s + 16 * i, sizeof sv);
      std::memcpy(&zv, z + 16 * i, sizeof zv);
      dequant16<B>(packed + i * 2 * B, sv, zv, out + 16 * i);
    }
    whole_from = vecs * 16 / per_byte;
  }
#endif
  const size_t whole = dim / per_byte;
  for (size_t byte = whole_from; byte < whole; ++byte) {
    const size_t ch = byte * per_byte;
    if constexpr (B <= 2) {
      const float* codes = kCodeTable<B>.codes[packed[byte]];
      for (uint32_t j = 0; j < per_byte; ++j) out[ch + j] = z[ch + j] + codes[j] * s[ch + j];
    } else {  // 1 or 2 codes per byte: shifting them out vectorizes better than a lookup
      const uint32_t bits = packed[byte];
      for (uint32_t j = 0; j < per_byte; ++j) {
        out[ch + j] = kivi_dequant((bits >> (j * B)) & mask, s[ch + j], z[ch + j]);
      }
    }
  }
  size_t c = whole * per_byte;
  for (size_t byte = whole; c < dim; ++byte) {
    const uint32_t bits = packed[byte];
    for (uint32_t j = 0; j < per_byte && c < dim; ++j, ++c) {
      out[c] = kivi_dequant((bits >> (j * B)) & mask, s[c], z[c]);
    }
  }
}

// One row of values at 1 or 2 bits whose groups start on byte boundaries (group a multiple of
// 8 channels): each group's scale and zero point are scalars for all its channels, so nothing is
// spread per channel; every element is kivi_dequant(code, s_g, z_g) as in the general path.
template <uint32_t B>
KVSDK_CLONE_INLINE void dequant_value_row(const uint8_t* __restrict packed, size_t dim,
                                          size_t group, const uint16_t* scale,
                                          const uint16_t* zero, float* __restrict out) {
  constexpr uint32_t per_byte = 8 / B, mask = (1u << B) - 1u;
  for (size_t lo = 0, g = 0; lo < dim; lo += group, ++g) {
    const size_t hi = std::min(dim, lo + group);
    const float sg = f16_to_f32(scale[g]), zg = f16_to_f32(zero[g]);
    const uint8_t* p = packed + lo / per_byte;
    const size_t whole = (hi - lo) / per_byte;
    size_t b = 0;
#if KVSDK_DEQUANT16
    const Floats16 sv = Floats16{} + sg, zv = Floats16{} + zg;
    for (; (b + 16 / per_byte) <= whole; b += 16 / per_byte) {
      dequant16<B>(p + b, sv, zv, out + lo + b * per_byte);
    }
#endif
    for (; b < whole; ++b) {
      const float* codes = kCodeTable<B>.codes[p[b]];
      float* o = out + lo + b * per_byte;
      for (uint32_t j = 0; j < per_byte; ++j) o[j] = zg + codes[j] * sg;
    }
    for (size_t c = lo + whole * per_byte; c < hi; ++c) {
      out[c] = kivi_dequant((packed[c / per_byte] >> ((c % per_byte) * B)) & mask, sg, zg);
    }
  }
}

// Channels per tile of the dequantizers' stack parameters (a multiple of 8).
constexpr size_t kTile = 256;

KVSDK_CLONE_INLINE void dequant_row(uint32_t bits, const uint8_t* packed, size_t dim, const float* s, const float* z,
                 float* out) {
  switch (bits) {
    case 1: return dequant_row<1>(packed, dim, s, z, out);
    case 2: return dequant_row<2>(packed, dim, s, z, out);
    case 4: return dequant_row<4>(packed, dim, s, z, out);
    default: return dequant_row<8>(packed, dim, s, z, out);
  }
}

}  // namespace

bool kivi_bits_supported(uint32_t bits) { return bits == 1 || bits == 2 || bits == 4 || bits == 8; }

KiviGroupParams kivi_group_params(float mn, float mx, uint32_t bits) {
  if (bits == 1) {
    // SpeCache 1-bit: the levels z and z + s are the quarter points of [mn, mx].
    return {f32_to_f16((mx - mn) * 0.5f), f32_to_f16((3.0f * mn + mx) * 0.25f)};
  }
  const uint16_t z = f16_round_down(mn);
  const float span = mx - f16_to_f32(z);
  const uint16_t s = span > 0.0f ? f16_round_up(span / float(levels(bits))) : uint16_t(0);
  return {s, z};
}

uint8_t kivi_code(float x, float scale, float zero, uint32_t bits) {
  if (!(scale > 0.0f)) return 0;  // constant group: every element is the zero point
  const float u = std::floor((x - zero) / scale + 0.5f);
  const float top = float(levels(bits));
  if (!(u > 0.0f)) return 0;  // also NaN: converting it to an integer would be undefined
  return uint8_t(u < top ? u : top);
}

void kivi_pack(const uint8_t* codes, size_t n_codes, uint32_t bits, uint8_t* packed) {
  std::fill(packed, packed + kivi_packed_bytes(n_codes, bits), uint8_t(0));
  const uint32_t mask = (1u << bits) - 1u;
  for (size_t i = 0; i < n_codes; ++i) {
    const size_t bit = i * bits;
    packed[bit / 8] = uint8_t(packed[bit / 8] | ((codes[i] & mask) << (bit % 8)));
  }
}

void kivi_unpack(const uint8_t* packed, size_t n_codes, uint32_t bits, uint8_t* codes) {
  const uint32_t mask = (1u << bits) - 1u;
  for (size_t i = 0; i < n_codes; ++i) {
    const size_t bit = i * bits;
    codes[i] = uint8_t((packed[bit / 8] >> (bit % 8)) & mask);
  }
}

void kivi_quantize_keys(const float* k, size_t n_tokens, size_t dim, uint32_t bits,
                        uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  for (size_t c = 0; c < dim; ++c) {
    float mn = k[c], mx = k[c];
    for (size_t t = 1; t < n_tokens; ++t) {
      mn = std::min(mn, k[t * dim + c]);
      mx = std::max(mx, k[t * dim + c]);
    }
    const KiviGroupParams p = kivi_group_params(mn, mx, bits);
    scale[c] = p.scale_f16;
    zero[c] = p.zero_f16;
  }
  const size_t row_bytes = kivi_packed_bytes(dim, bits);
  uint8_t row[kTile];  // a tile of codes, packed on a byte boundary (no heap on a flush)
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t c0 = 0; c0 < dim; c0 += kTile) {
      const size_t n = std::min(kTile, dim - c0);
      for (size_t c = 0; c < n; ++c) {
        row[c] = kivi_code(k[t * dim + c0 + c], f16_to_f32(scale[c0 + c]),
                           f16_to_f32(zero[c0 + c]), bits);
      }
      kivi_pack(row, n, bits, codes + t * row_bytes + c0 * bits / 8);
    }
  }
}

KVSDK_TARGET_CLONES  // elementwise: the same bits in every clone (target_clones.h)
void kivi_dequantize_keys(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                          size_t first, size_t count, size_t dim, uint32_t bits, float* out) {
  // Channels in tiles of kTile with their f32 parameters on the stack (attention calls this on
  // every step: no heap). A tile starts at a multiple of 8 channels, so on a byte boundary of
  // the packed codes for every bit width; each element's value does not depend on the tiling.
  const size_t row_bytes = kivi_packed_bytes(dim, bits);
  float s[kTile], z[kTile];
  for (size_t c0 = 0; c0 < dim; c0 += kTile) {
    const size_t n = std::min(kTile, dim - c0);
    for (size_t c = 0; c < n; ++c) {
      s[c] = f16_to_f32(scale[c0 + c]);
      z[c] = f16_to_f32(zero[c0 + c]);
    }
    const size_t byte0 = c0 * bits / 8;
    for (size_t i = 0; i < count; ++i) {
      dequant_row(bits, codes + (first + i) * row_bytes + byte0, n, s, z, out + i * dim + c0);
    }
  }
}

void kivi_quantize_values(const float* v, size_t n_tokens, size_t dim, size_t group,
                          uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  const size_t n_groups = kivi_value_groups(dim, group);
  const size_t row_bytes = kivi_packed_bytes(dim, bits);
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* x = v + t * dim;
    for (size_t g = 0; g < n_groups; ++g) {
      const size_t lo = g * group, hi = std::min(dim, lo + group);
      float mn = x[lo], mx = x[lo];
      for (size_t c = lo + 1; c < hi; ++c) {
        mn = std::min(mn, x[c]);
        mx = std::max(mx, x[c]);
      }
      const KiviGroupParams p = kivi_group_params(mn, mx, bits);
      scale[t * n_groups + g] = p.scale_f16;
      zero[t * n_groups + g] = p.zero_f16;
    }
    uint8_t row[kTile];  // a tile of codes, packed on a byte boundary (no heap on a flush)
    for (size_t c0 = 0; c0 < dim; c0 += kTile) {
      const size_t n = std::min(kTile, dim - c0);
      for (size_t c = 0; c < n; ++c) {
        const size_t g = (c0 + c) / group;
        row[c] = kivi_code(x[c0 + c], f16_to_f32(scale[t * n_groups + g]),
                           f16_to_f32(zero[t * n_groups + g]), bits);
      }
      kivi_pack(row, n, bits, codes + t * row_bytes + c0 * bits / 8);
    }
  }
}

KVSDK_TARGET_CLONES
void kivi_dequantize_values(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                            size_t n_tokens, size_t dim, size_t group, uint32_t bits, float* out) {
  const size_t n_groups = kivi_value_groups(dim, group);
  const size_t row_bytes = kivi_packed_bytes(dim, bits);
  if (bits <= 2 && group % 8 == 0) {  // SpeCache's and KIVI-2's rows: groups on byte boundaries
    for (size_t t = 0; t < n_tokens; ++t) {
      const uint8_t* row = codes + t * row_bytes;
      const uint16_t* sg = scale + t * n_groups;
      const uint16_t* zg = zero + t * n_groups;
      if (bits == 1) dequant_value_row<1>(row, dim, group, sg, zg, out + t * dim);
      else dequant_value_row<2>(row, dim, group, sg, zg, out + t * dim);
    }
    return;
  }
  // The row's group parameters spread over its channels, a tile of kTile channels at a time on
  // the stack (as for keys: no heap on the attention path, same values).
  float s[kTile], z[kTile];
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t c0 = 0; c0 < dim; c0 += kTile) {
      const size_t n = std::min(kTile, dim - c0);
      // Each group's parameters converted once, then spread over its channels.
      for (size_t c = 0; c < n;) {
        const size_t g = (c0 + c) / group;
        const size_t end = std::min(n, (g + 1) * group - c0);
        const float sg = f16_to_f32(scale[t * n_groups + g]);
        const float zg = f16_to_f32(zero[t * n_groups + g]);
        for (; c < end; ++c) {
          s[c] = sg;
          z[c] = zg;
        }
      }
      dequant_row(bits, codes + t * row_bytes + c0 * bits / 8, n, s, z, out + t * dim + c0);
    }
  }
}

}  // namespace kvsdk::cpu
