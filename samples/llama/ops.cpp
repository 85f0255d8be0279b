#include "ops.h"

#include <cmath>

namespace llama::ops {

float dot(const float* a, const float* b, size_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void matmul(float* out, const float* x, const float* w, size_t n_tokens, size_t in, size_t out_dim) {
  // Weight row outer, tokens inner: each weight row is read once per call and reused across the
  // tokens of a prefill chunk while it is hot in cache.
  for (size_t o = 0; o < out_dim; ++o) {
    const float* row = w + o * in;
    for (size_t t = 0; t < n_tokens; ++t) out[t * out_dim + o] = dot(row, x + t * in, in);
  }
}

void rmsnorm(float* out, const float* x, const float* weight, size_t n) {
  float ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / float(n) + 1e-5f);
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

void rope(float* x, size_t n_heads, size_t head_dim, int position) {
  for (size_t i = 0; i < head_dim / 2; ++i) {
    const float freq = 1.0f / std::pow(10000.0f, float(2 * i) / float(head_dim));
    const float angle = float(position) * freq;
    const float c = std::cos(angle), s = std::sin(angle);
    for (size_t h = 0; h < n_heads; ++h) {
      float* p = x + h * head_dim + 2 * i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

void swiglu(float* h1, const float* h3, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = h1[i];
    h1[i] = g / (1.0f + std::exp(-g)) * h3[i];
  }
}

void softmax(float* x, size_t n) {
  float m = x[0];
  for (size_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  float sum = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  for (size_t i = 0; i < n; ++i) x[i] /= sum;
}

}  // namespace llama::ops
