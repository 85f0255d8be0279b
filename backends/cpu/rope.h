// Rotary position embeddings (RoPE, Su et al. 2021) applied to and removed from single key rows.
// The cache receives keys already rotated by the host; representations that compare keys across
// tokens (SpindleKV's codebook works on pre-RoPE keys, SpindleKV (docs/papers.md) §3.4) remove the
// rotation first and re-apply it when a row is reconstructed for attention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsdk.h"

namespace kvsdk::cpu {

// Pair i of a row is turned by position * theta^(-2i/head_dim). Pairs are (x[2i], x[2i+1]) for
// KVSDK_ROPE_INTERLEAVED and (x[i], x[i+head_dim/2]) for KVSDK_ROPE_HALF; KVSDK_ROPE_NONE leaves
// rows unchanged. head_dim must be even for the rotating styles (the geometry validates this).
// The frequencies are computed once per object, so reconstructing many rows stays cheap.
class Rope {
 public:
  Rope(size_t head_dim, float theta, kvsdk_rope_style style);

  void apply(float* x, int32_t position) const { rotate(x, position, 1.0); }
  // Inverse rotation: inverse(apply(x)) == x up to float rounding.
  void inverse(float* x, int32_t position) const { rotate(x, position, -1.0); }
  // apply() on `n` rows [n][head_dim] at positions[i]. Runs of consecutive positions advance the
  // angles by one step per row (angle addition) instead of evaluating sin/cos per pair and row,
  // re-anchored exactly every kAnchor rows; the result matches apply() to ~1e-6.
  void apply_rows(float* x, const int32_t* positions, size_t n) const;
  // apply_rows for the optimized attention: the angles advance in double as above, anchored
  // only where a run of consecutive positions starts (each step adds about 2^-53 to an angle's
  // error, far below f32's 2^-24 even after thousands of rows; sin/cos were most of the cost),
  // and the rotation itself runs in f32 (twice the SIMD width, no conversions). Within ~2 ulp of
  // apply_rows; the same bits on every target.
  void apply_rows_f32(float* x, const int32_t* positions, size_t n) const;

 private:
  static constexpr size_t kAnchor = 32;
  void rotate(float* x, int32_t position, double sign) const;
  size_t dim_;
  kvsdk_rope_style style_;
  std::vector<double> freq_;  // [head_dim / 2]
};

// One-off helpers for single rows.
void rope_apply(float* x, size_t head_dim, int32_t position, float theta, kvsdk_rope_style style);
void rope_inverse(float* x, size_t head_dim, int32_t position, float theta,
                  kvsdk_rope_style style);

}  // namespace kvsdk::cpu
