// Optimized CPU decode attention (issue 15): all query rows of one GQA group against their KV
// head in ONE pass over the head's rows, online softmax, SIMD through Google Highway with runtime
// dispatch (AVX-512 with VNNI/VBMI, AVX-512, AVX2, SSE4, NEON, and a scalar fallback).
//
// f16 rows are exact-tier: f32 products and sums. KIVI codes are never dequantized to floats: a
// key block contributes q.k = q.z + sum_c (q_c s_c) code_c (per-channel scale s / zero z of the
// block), and a value row p * (z_g + s_g code_c) is accumulated as (p s_g) code_c plus p z_g per
// group, where both sums over codes run on INTEGERS:
//  - per key block and row, q_c s_c is rounded to Q_c = round(q_c s_c / dq) with
//    dq = max_c |q_c s_c| / 16383 (15-bit signed codes), and sum_c Q_c code_c is exact in int32;
//  - per segment (64 tokens), row and value group, the weights w = p s_g are rounded to
//    W = round(w / dv) with dv = max w / Wmax (w >= 0), and sum_t W_t code_tc is exact. Wmax is
//    16383 (14-bit) or 127 (7-bit) by the store's KiviConfig::weight_bits
//    (kvsdk_policy.kivi_weight_bits: 7 by default for 1- and 2-bit codes, 14 above).
//  On AVX3_DL these are vpdpbusd (4 byte products per int32 lane; Q = 128 hi + lo split into
//  bytes, and a 14-bit W too, so two instructions per product; a 7-bit W is one byte, one
//  instruction: KIVI-2 decode at 32k tokens 6.0-6.4 ms against 7.2-7.5 ms); elsewhere 16-bit
//  multiply-adds.
//  Extra error vs float dot products: each key term is off by at most 2^-15 of the largest term
//  of its sum, each value term by 2^-15 (14-bit) or 2^-8 (7-bit) of the largest weight of its
//  segment's row and group; tests/backends/cpu/fast_attention_test.cpp bounds the output gap
//  (kKiviAbsTol: 2e-3 of max |v|; kKiviByteAbsTol: 5e-2, against KIVI-2's own ~1e-1).
//
// Same bits on every target (snapshots resume bit-identically on x86-64 and aarch64):
//  - f16 dot products accumulate in 16 fixed "virtual lanes" (lane l sums channels c = l mod 16
//    in channel order from 0; one AVX-512 vector = 2 AVX2 = 4 SSE4/NEON = 16 scalar vectors) and
//    reduce them by one fixed tree (l + l+8, then l + l+4, l + l+2, l + l+1; AVX-512 runs it on 16
//    tokens at once); channels past the last multiple of 16 are added afterwards in order;
//  - KIVI dot products are integers (exact, so any order), converted and scaled elementwise;
//  - value accumulation is per channel, token by token (no cross-lane order);
//  - sums of p (and of p z) run in 16 virtual lanes by token index within its segment and are
//    reduced by the same tree; max is exact in any order;
//  - segments are kSeg = 64 tokens from the start of the attended range (a KIVI segment may span
//    key blocks), the same on every target;
//  - no fused multiply-add (the build passes -ffp-contract=off; no MulAdd is called);
//  - rounding to integers is floor(x + 0.5) (not the targets' own round-to-nearest, which differ
//    at ties on the scalar target); softmax uses fast_exp below, made of +, -, *, floor and
//    exponent-bit assembly only.
// The results are NOT bit-identical to the scalar reference (cpu::OnlineAttention, the oracle):
// the sums are ordered differently, and KIVI's are quantized as above; the test bounds the gap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kivi_store.h"
#include "partial_state.h"

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
  size_t capacity_floats() const { return buf_.capacity() / sizeof(float); }
  // 64-byte aligned; grows (allocates) only if floats exceed the capacity.
  float* data(size_t floats);
 private:
  std::vector<uint8_t> buf_;  // float, int32 and byte buffers of the kernels
};

// Dense f16 rows (the exact tier): k/v [n_tokens][dim] IEEE binary16, positions [n_tokens].
// Writes out [n_rows][dim]; rows that see no token get zeros.
void attend_f16(const Queries& qs, const uint16_t* k, const uint16_t* v, const int32_t* positions,
                size_t n_tokens, Scratch& scratch, float* out);

// Every token of a KIVI head (quantized blocks of any bits 1/2/4/8, ragged or not, and the f16
// residual window). store.head_dim() must equal qs.dim.
void attend_kivi(const Queries& qs, const KiviHeadStore& store, Scratch& scratch, float* out);

// f16 rows that are each either a stored row times a per-row scale or a direct row (MiniCache's
// merged directions with the layer's magnitude, and its retained rows: MergedLayerPair's
// layout). Token t's slot s = slots[t]: without kDirectRow, the row is scaled + s * dim times
// scales[s]; with it, direct + (s & ~kDirectRow) * dim as stored.
constexpr uint32_t kDirectRow = 0x80000000u;
struct ScaledF16Rows {
  const uint32_t* slots = nullptr;
  const uint16_t* scaled = nullptr;
  const float* scales = nullptr;
  const uint16_t* direct = nullptr;
};

// attend_f16 over n_tokens keys k and values v given as ScaledF16Rows (positions [n_tokens]),
// then n_pending dense f16 rows (pending_k/pending_v/pending_positions), in one softmax. A
// scaled key's score is (q . row) * scale * qs.scale and a scaled value enters as
// p * scale * row: the f32 rows are never formed. Same kernel, segments and bits rules as
// attend_f16 (the pending rows' segments start at their first row).
void attend_scaled_f16(const Queries& qs, const ScaledF16Rows& k, const ScaledF16Rows& v,
                       const int32_t* positions, size_t n_tokens, const uint16_t* pending_k,
                       const uint16_t* pending_v, const int32_t* pending_positions,
                       size_t n_pending, Scratch& scratch, float* out);

// --- split-K: one token range at a time, merged in a fixed order --------------------------------
// The softmax state of n_rows rows over some tokens (partial_state.h: the seam's own type).
using PartialState = backend::PartialState;

// attend_f16 / attend_kivi over tokens [first, first + count) only (append order; for KIVI the
// quantized tokens come first, then the residual window), writing the partial state. A range may
// start or end inside a KIVI block. Separate ranges can run on separate threads, each with its
// own Scratch. attend_kivi_partial throws kvsdk::Error (KVSDK_E_INVALID_ARG) for a range past the
// store's end.
void attend_f16_partial(const Queries& qs, const uint16_t* k, const uint16_t* v,
                        const int32_t* positions, size_t first, size_t count, Scratch& scratch,
                        const PartialState& out);
// `taps` (NULL: none) serve SpeCache (specache_attention.h), which attends the low-bit copy with
// some tokens replaced by full-precision rows and ranks tokens by their low-bit scores.
struct KiviTaps {
  // NULL, or [n_rows][scores_stride]: each row's score of every token of the range, at the
  // token's store index (q . k * scale as the kernel computes it, -inf in the row's future),
  // written before `exclude` applies.
  float* scores = nullptr;
  size_t scores_stride = 0;
  // NULL, or [store.size()] bytes: tokens whose byte is nonzero are left out of the attention
  // (as if masked), so that another part merged with this one can hold their rows instead.
  const uint8_t* exclude = nullptr;
};
void attend_kivi_partial(const Queries& qs, const KiviHeadStore& store, size_t first,
                         size_t count, Scratch& scratch, const PartialState& out,
                         const KiviTaps* taps = nullptr);

// The scores alone (KiviTaps::scores of attend_kivi_partial over the whole store, the same bits)
// into scores [n_rows][stride]: no softmax, no values.
void kivi_scores(const Queries& qs, const KiviHeadStore& store, Scratch& scratch, float* scores,
                 size_t stride);
// The scores alone of attend_f16 over f16 keys k [n_tokens][dim] (q . k * scale as its kernel
// computes it, the same bits; -inf in a row's future) into scores [n_rows][stride]: the keys are
// read as f16, never converted into an f32 copy.
void f16_scores(const Queries& qs, const uint16_t* k, const int32_t* positions, size_t n_tokens,
                Scratch& scratch, float* scores, size_t stride);

// out [n_rows][dim] = the attention of the union of the parts' ranges, combined in the order
// given (max over parts, then each part rescaled by exp(max_i - max) and added, part 0 first).
// Deterministic for a given split; a split's result differs from the whole range's only by
// rounding (segments and lane sums start at each range's first token). attend_f16/attend_kivi
// are exactly one whole-range part merged alone.
void merge_partials(const PartialState* parts, size_t n_parts, size_t n_rows, size_t dim,
                    float* out);

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
