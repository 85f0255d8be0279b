// The dense operations of the Llama forward pass (CPU, f32). Plain loops with several partial
// sums so that the compiler vectorises them at -O2 without -ffast-math.
#pragma once

#include <cstddef>

namespace llama::ops {

float dot(const float* a, const float* b, size_t n);

// out[t][o] = sum_i w[o][i] * x[t][i] for n_tokens rows of x; w is row-major [out][in].
void matmul(float* out, const float* x, const float* w, size_t n_tokens, size_t in, size_t out_dim);

// out = x / rms(x) * weight, eps 1e-5 (Llama RMSNorm).
void rmsnorm(float* out, const float* x, const float* weight, size_t n);

// Rotates interleaved pairs (x[2i], x[2i+1]) of each head by position * 10000^(-2i/head_dim).
void rope(float* x, size_t n_heads, size_t head_dim, int position);

// h1 = silu(h1) * h3 (the SwiGLU gate), elementwise.
void swiglu(float* h1, const float* h3, size_t n);

// In-place softmax.
void softmax(float* x, size_t n);

}  // namespace llama::ops
