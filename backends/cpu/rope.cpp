#include "rope.h"

#include <algorithm>
#include <cmath>

#include "portable_math.h"
#include "target_clones.h"

namespace kvsdk::cpu {

Rope::Rope(size_t head_dim, float theta, kvsdk_rope_style style)
    : dim_(head_dim), style_(style), freq_(head_dim / 2), step_c_(freq_.size()),
      step_s_(freq_.size()) {
  for (size_t i = 0; i < freq_.size(); ++i) {
    freq_[i] = pmath::pow_positive(double(theta), -2.0 * double(i) / double(head_dim));
    pmath::sincos(freq_[i], &step_s_[i], &step_c_[i]);
  }
}

// Angles and the rotation itself are computed in double: positions reach 1e5+ and an f32 angle
// would lose the low bits that make apply and inverse agree. pow/sin/cos come from
// portable_math.h, not libm: SpindleKV stores de-rotated keys, so their bits must not depend on
// the platform (snapshots continue bit-identically on another architecture).
void Rope::rotate(float* x, int32_t position, double sign) const {
  if (style_ == KVSDK_ROPE_NONE) return;
  const size_t half = dim_ / 2;
  for (size_t i = 0; i < half; ++i) {
    const double angle = sign * double(position) * freq_[i];
    double c = 0.0, s = 0.0;
    pmath::sincos(angle, &s, &c);
    const size_t a = style_ == KVSDK_ROPE_INTERLEAVED ? 2 * i : i;
    const size_t b = style_ == KVSDK_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
    const double xa = x[a], xb = x[b];
    x[a] = float(xa * c - xb * s);
    x[b] = float(xa * s + xb * c);
  }
}

// Cloned per x86-64 SIMD level (target_clones.h): the elementwise double loops run 4-8 wide,
// with the same bits.
KVSDK_TARGET_CLONES
void Rope::apply_rows(float* x, const int32_t* positions, size_t n) const {
  if (style_ == KVSDK_ROPE_NONE || n == 0) return;
  const size_t half = dim_ / 2;
  // On the stack for head dims up to 2 * kStackHalf (every model we know), so that attention
  // over SpindleKV rows allocates nothing; larger heads fall back to the heap.
  constexpr size_t kStackHalf = 256;
  double stack[2 * kStackHalf];
  std::vector<double> heap(half > kStackHalf ? 2 * half : 0);
  double* base = half > kStackHalf ? heap.data() : stack;
  // Disjoint ranges (restrict lets the compiler vectorize the elementwise loops below; each
  // element is computed exactly as before).
  double* __restrict c = base;
  double* __restrict s = base + half;
  const double* __restrict step_c = step_c_.data();
  const double* __restrict step_s = step_s_.data();
  size_t since_anchor = kAnchor;
  for (size_t t = 0; t < n; ++t) {
    // In 64 bits: positions[t - 1] + 1 overflows int32 at INT32_MAX (beyond the API's
    // KVSDK_MAX_POSITION, but a kernel does not rely on its callers' checks).
    const bool consecutive = t > 0 && int64_t(positions[t]) == int64_t(positions[t - 1]) + 1;
    if (!consecutive || since_anchor >= kAnchor) {
      for (size_t i = 0; i < half; ++i) {
        const double angle = double(positions[t]) * freq_[i];
        pmath::sincos(angle, &s[i], &c[i]);
      }
      since_anchor = 0;
    } else {
      for (size_t i = 0; i < half; ++i) {  // (c + i s) * (step_c + i step_s)
        const double nc = c[i] * step_c[i] - s[i] * step_s[i];
        s[i] = s[i] * step_c[i] + c[i] * step_s[i];
        c[i] = nc;
      }
    }
    ++since_anchor;
    float* __restrict row = x + t * dim_;
    if (style_ == KVSDK_ROPE_INTERLEAVED) {  // pairs (2i, 2i + 1)
      for (size_t i = 0; i < half; ++i) {
        const double xa = row[2 * i], xb = row[2 * i + 1];
        row[2 * i] = float(xa * c[i] - xb * s[i]);
        row[2 * i + 1] = float(xa * s[i] + xb * c[i]);
      }
    } else {  // halves (i, i + half): contiguous
      float* __restrict lo = row;
      float* __restrict hi = row + half;
      for (size_t i = 0; i < half; ++i) {
        const double xa = lo[i], xb = hi[i];
        lo[i] = float(xa * c[i] - xb * s[i]);
        hi[i] = float(xa * s[i] + xb * c[i]);
      }
    }
  }
}

void Rope::angles(int64_t position, double* c, double* s) const {
  for (size_t i = 0; i < freq_.size(); ++i) pmath::sincos(double(position) * freq_[i], &s[i], &c[i]);
}

void Rope::table_row(const double* c, const double* s, float* row) const {
  const size_t half = dim_ / 2;
  float* rc = row;
  float* rs = row + dim_;
  if (style_ == KVSDK_ROPE_NONE) {
    std::fill_n(rc, dim_, 1.0f);
    std::fill_n(rs, dim_, 0.0f);
    return;
  }
  for (size_t i = 0; i < half; ++i) {
    // R x: x[a] = xa cos - xb sin, x[b] = xb cos + xa sin (pair (a, b)).
    const size_t a = style_ == KVSDK_ROPE_INTERLEAVED ? 2 * i : i;
    const size_t b = style_ == KVSDK_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
    rc[a] = rc[b] = float(c[i]);
    rs[a] = -float(s[i]);
    rs[b] = float(s[i]);
  }
}

void Rope::offset_table(size_t n, float* table, double* c, double* s) const {
  const size_t half = dim_ / 2;
  std::fill_n(c, half, 1.0);
  std::fill_n(s, half, 0.0);
  for (size_t j = 0; j < n; ++j) {
    table_row(c, s, table + j * 2 * dim_);
    for (size_t i = 0; i < half; ++i) {  // (c + i s) * (step_c + i step_s), as apply_rows
      const double nc = c[i] * step_c_[i] - s[i] * step_s_[i];
      s[i] = s[i] * step_c_[i] + c[i] * step_s_[i];
      c[i] = nc;
    }
  }
}

void Rope::offset_row(int64_t offset, float* row, double* c, double* s) const {
  angles(offset, c, s);
  table_row(c, s, row);
}

// Cloned like apply_rows (elementwise: the same bits), one loop per style so each vectorizes.
KVSDK_TARGET_CLONES
void Rope::rotate_back(const float* __restrict x, const double* __restrict c,
                       const double* __restrict s, float* __restrict out) const {
  const size_t half = dim_ / 2;
  // rotate() with sign -1, i.e. by (c, -s): x[a] = xa c + xb s, x[b] = xb c - xa s.
  if (style_ == KVSDK_ROPE_INTERLEAVED) {
    for (size_t i = 0; i < half; ++i) {
      const double xa = x[2 * i], xb = x[2 * i + 1];
      out[2 * i] = float(xa * c[i] + xb * s[i]);
      out[2 * i + 1] = float(xb * c[i] - xa * s[i]);
    }
  } else if (style_ == KVSDK_ROPE_HALF) {
    for (size_t i = 0; i < half; ++i) {
      const double xa = x[i], xb = x[i + half];
      out[i] = float(xa * c[i] + xb * s[i]);
      out[i + half] = float(xb * c[i] - xa * s[i]);
    }
  } else {
    std::copy_n(x, dim_, out);
  }
}

void rope_apply(float* x, size_t head_dim, int32_t position, float theta,
                kvsdk_rope_style style) {
  Rope(head_dim, theta, style).apply(x, position);
}

void rope_inverse(float* x, size_t head_dim, int32_t position, float theta,
                  kvsdk_rope_style style) {
  Rope(head_dim, theta, style).inverse(x, position);
}

}  // namespace kvsdk::cpu
