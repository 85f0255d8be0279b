#include "rope.h"

#include <cmath>

namespace kvsdk::cpu {

Rope::Rope(size_t head_dim, float theta, kvsdk_rope_style style)
    : dim_(head_dim), style_(style), freq_(head_dim / 2) {
  for (size_t i = 0; i < freq_.size(); ++i) {
    freq_[i] = std::pow(double(theta), -2.0 * double(i) / double(head_dim));
  }
}

// Angles and the rotation itself are computed in double: positions reach 1e5+ and an f32 angle
// would lose the low bits that make apply and inverse agree.
void Rope::rotate(float* x, int32_t position, double sign) const {
  if (style_ == KVSDK_ROPE_NONE) return;
  const size_t half = dim_ / 2;
  for (size_t i = 0; i < half; ++i) {
    const double angle = sign * double(position) * freq_[i];
    const double c = std::cos(angle), s = std::sin(angle);
    const size_t a = style_ == KVSDK_ROPE_INTERLEAVED ? 2 * i : i;
    const size_t b = style_ == KVSDK_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
    const double xa = x[a], xb = x[b];
    x[a] = float(xa * c - xb * s);
    x[b] = float(xa * s + xb * c);
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
