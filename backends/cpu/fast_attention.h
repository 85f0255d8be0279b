// Optimized CPU decode attention (issue 15): all query rows of one GQA group against their KV
// head in ONE pass over the head's rows, online softmax, SIMD through Google Highway with runtime
// dispatch (AVX-512, AVX2, SSE4, NEON, and a scalar fallback). KIVI codes are dequantized inside
// the dot products (no dense f32 copy of the cache): a key block contributes
//   q.k = q.z + sum_c (q_c s_c) code_c          (per-channel scale s / zero z of the block)
// and a value row p * (z_g + s_g code_c) is accumulated as (p s_g) code_c plus p z_g per group.
//
// Same bits on every target (snapshots resume bit-identically on x86-64 and aarch64):
//  - dot products accumulate in 16 fixed "virtual lanes" (lane l sums channels c = l mod 16 in
//    channel order; one AVX-512 vector = 2 AVX2 = 4 SSE4/NEON = 16 scalar vectors) and reduce
//    them by one fixed tree (l + l+8, then l + l+4, l + l+2, l + l+1); channels past the last
//    multiple of 16 are added afterwards in order;
//  - value accumulation is per channel, token by token, so it has no cross-lane order at all;
//  - no fused multiply-add (the build passes -ffp-contract=off; no MulAdd is called);
//  - softmax uses fast_exp below, made of +, -, *, floor and exponent-bit assembly only.
// The results are NOT bit-identical to the scalar reference (cpu::OnlineAttention, the oracle):
// the sums are ordered differently; tests/backends/cpu/fast_attention_test.cpp bounds the gap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kivi_store.h"

namespace kvsdk::cpu::fast {

// The query side of one call: n_rows rows (one query of one query head each; all rows of a GQA
// group share the KV head) q [n_rows][dim] f32, each with its position for causal masking
// (a row sees tokens whose position <= its own; INT32_MAX sees everything).
struct Queries {
  const float* q = nullptr;
  const int32_t* positions = nullptr;
  size_t n_rows = 0;
  size_t dim = 0;
  float scale = 1.0f;
};

// Caller-owned working memory, reused across calls. A call resizes it only when it is too small
// for (n_rows, dim, value groups); reserve() with the largest shape up front makes every later
// call with that shape or smaller free of heap allocation (the decode path). Not shared between
// threads.
class Scratch {
 public:
  void reserve(size_t n_rows, size_t dim, size_t value_groups = 1);
  size_t capacity_floats() const { return buf_.capacity(); }
  float* data(size_t floats);  // grows (allocates) only if floats > capacity
 private:
  std::vector<float> buf_;
};

// Dense f16 rows (the exact tier): k/v [n_tokens][dim] IEEE binary16, positions [n_tokens].
// Writes out [n_rows][dim]; rows that see no token get zeros.
void attend_f16(const Queries& qs, const uint16_t* k, const uint16_t* v, const int32_t* positions,
                size_t n_tokens, Scratch& scratch, float* out);

// Every token of a KIVI head (quantized blocks of any bits 1/2/4/8, ragged or not, and the f16
// residual window). store.head_dim() must equal qs.dim.
void attend_kivi(const Queries& qs, const KiviHeadStore& store, Scratch& scratch, float* out);

// exp(x) for the softmax, elementwise over n floats (x <= 0 expected; below about -87 gives 0,
// +-inf gives inf / 0). Same bits on every target; within ~2 ulp of exp.
void exp_f32(const float* x, size_t n, float* out);

// --- testing and benchmarking hooks (not for production code) ---------------------------------
// Highway targets compiled into this build that this CPU can run, best first.
struct Target {
  int64_t bits;
  const char* name;
};
std::vector<Target> available_targets();
// Restricts dispatch to one target (0 = every supported one again). Process-wide and not
// thread-safe: only for tests and benchmarks that compare targets.
void force_target(int64_t target_bits);

}  // namespace kvsdk::cpu::fast
