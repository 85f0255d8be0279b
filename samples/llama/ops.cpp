#include "ops.h"

#include <cmath>
#include <cstring>

// No fused multiply-add anywhere in this file: the AVX-512 clone below would otherwise contract
// a * b + c, and matmul must give dot()'s bits on every target.
#pragma GCC optimize("fp-contract=off")

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

#if defined(__GNUC__)

namespace {

// Eight float lanes (GCC/Clang vector extension): lane j holds dot()'s partial sum s[j], so a
// tile computes every output with dot()'s exact operations in dot()'s order (elementwise IEEE
// multiply then add, the same tail and reduction tree): matmul gives dot()'s bits on every
// target. The build does not enable FMA for these clones, so nothing is contracted.
typedef float V8 __attribute__((vector_size(32)));

// (Vectors pass by reference: the baseline clone has no 32-byte vector registers.)
__attribute__((always_inline)) inline void load8(V8& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}

// dot()'s tail and reduction for one finished accumulator.
__attribute__((always_inline)) inline float finish(const V8& acc, const float* a, const float* b, size_t i, size_t n) {
  float s[8];
  std::memcpy(s, &acc, sizeof s);
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// out[t][o] for R weight rows o0.. and T tokens t0.. at once: each 8-float slice of a weight row
// is loaded once for the T tokens (the tokens of a pass share the weight reads: SpeCache's output
// and speculative tokens, a prefill chunk), and R x T independent accumulators keep the adders
// busy. Inlined into each clone of matmul.
template <size_t R, size_t T>
__attribute__((always_inline)) inline void tile(float* out, size_t out_dim, const float* x,
                                                const float* w, size_t in, size_t o0, size_t t0) {
  V8 acc[R][T];
  for (size_t r = 0; r < R; ++r) {
    for (size_t t = 0; t < T; ++t) acc[r][t] = V8{};
  }
  size_t i = 0;
  for (; i + 8 <= in; i += 8) {
    // The next tile's R rows (contiguous) are brought in while this one computes: R * 8 floats
    // (R / 2 cache lines) per step, the rate this tile consumes its own.
    for (size_t l = 0; l < R * 8; l += 16) __builtin_prefetch(w + (o0 + R) * in + i * R + l);
    V8 xv[T];
    for (size_t t = 0; t < T; ++t) load8(xv[t], x + (t0 + t) * in + i);
    for (size_t r = 0; r < R; ++r) {
      V8 wv;
      load8(wv, w + (o0 + r) * in + i);
      for (size_t t = 0; t < T; ++t) acc[r][t] += wv * xv[t];
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t t = 0; t < T; ++t) {
      out[(t0 + t) * out_dim + o0 + r] =
          finish(acc[r][t], w + (o0 + r) * in, x + (t0 + t) * in, i, in);
    }
  }
}

// All tokens against rows o0 .. o0 + R - 1, in token tiles of 4, then 2, then 1.
template <size_t R>
__attribute__((always_inline)) inline void rows(float* out, size_t out_dim, const float* x,
                                                const float* w, size_t n_tokens, size_t in,
                                                size_t o0) {
  size_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) tile<R, 4>(out, out_dim, x, w, in, o0, t);
  for (; t + 2 <= n_tokens; t += 2) tile<R, 2>(out, out_dim, x, w, in, o0, t);
  for (; t < n_tokens; ++t) tile<R, 1>(out, out_dim, x, w, in, o0, t);
}

}  // namespace

// Compiled for AVX-512 (32 vector registers: the 4 x 4 tile stays in registers), AVX2 and the
// baseline; the loader picks the best this CPU runs. Every clone gives the same bits.
#if defined(__x86_64__) && !defined(__clang__) && defined(__ELF__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void matmul(float* out, const float* x, const float* w, size_t n_tokens, size_t in,
            size_t out_dim) {
  // Weight rows outer (4 at a time), tokens inner: each weight row is read from memory once per
  // call, whatever the number of tokens.
  size_t o = 0;
  for (; o + 4 <= out_dim; o += 4) rows<4>(out, out_dim, x, w, n_tokens, in, o);
  for (; o < out_dim; ++o) rows<1>(out, out_dim, x, w, n_tokens, in, o);
}

#else

void matmul(float* out, const float* x, const float* w, size_t n_tokens, size_t in,
            size_t out_dim) {
  // Weight row outer, tokens inner: each weight row is read once per call and reused across the
  // tokens while it is hot in cache.
  for (size_t o = 0; o < out_dim; ++o) {
    const float* row = w + o * in;
    for (size_t t = 0; t < n_tokens; ++t) out[t * out_dim + o] = dot(row, x + t * in, in);
  }
}

#endif
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
