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

  // --- block rotation, for kernels that score many rows (SpindleKV's codebook keys) ------------
  // q . R(p) k = R(-p0) q . R(p - p0) k: a kernel rotates the queries once per block of rows by
  // the block's first position p0 (rotate_back) and each row only by its small offset p - p0,
  // whose rotation is a fixed table row (offset_table) instead of sin/cos per pair and row.
  //
  // A table row (2 * head_dim floats) is laid out like a key row: cos[c] then sin[c] per channel
  // c, with the sign folded in, so that R(j) x = x[c] * cos[c] + x[partner(c)] * sin[c] for
  // every channel (partner(c) is the other channel of c's pair: c ^ 1 for
  // KVSDK_ROPE_INTERLEAVED, c +- head_dim / 2 for KVSDK_ROPE_HALF). KVSDK_ROPE_NONE: cos 1,
  // sin 0.
  //
  // Rows for offsets 0..n-1 into table [n][2][head_dim]. The angles advance in double by angle
  // addition from offset 0 (about 2^-53 per step, then rounded to f32); c and s [head_dim / 2]
  // are working memory and end as the cos and sin of the angles of offset n (the step from one
  // block's anchor to the next).
  void offset_table(size_t n, float* table, double* c, double* s) const;
  // One row for any offset, from its angles directly (c, s: working memory as above).
  void offset_row(int64_t offset, float* row, double* c, double* s) const;
  // cos and sin of position * freq for each pair (rotate()'s angles) into c, s [head_dim / 2].
  void angles(int64_t position, double* c, double* s) const;
  // out = R(-p) x for the angles (c, s) of position p, in double, rounded to f32 (the query side
  // of the block rotation above). head_dim floats each; out may not alias x.
  void rotate_back(const float* x, const double* c, const double* s, float* out) const;

  size_t head_dim() const { return dim_; }
  kvsdk_rope_style style() const { return style_; }

 private:
  static constexpr size_t kAnchor = 32;
  void rotate(float* x, int32_t position, double sign) const;
  // Lays out one table row (offset_table) from the angles of its offset.
  void table_row(const double* c, const double* s, float* row) const;
  size_t dim_;
  kvsdk_rope_style style_;
  std::vector<double> freq_;  // [head_dim / 2]
  std::vector<double> step_c_, step_s_;  // cos and sin of freq_: one position of angle addition
};

// One-off helpers for single rows.
void rope_apply(float* x, size_t head_dim, int32_t position, float theta, kvsdk_rope_style style);
void rope_inverse(float* x, size_t head_dim, int32_t position, float theta,
                  kvsdk_rope_style style);

}  // namespace kvsdk::cpu
