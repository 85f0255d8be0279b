// CPU scoring kernel shared by the importance signals (SnapKV/PyramidKV/XKV window scores, H2O
// accumulation, the mini-prefill planner): how much softmax attention probability a block of
// query rows gives every key. Scores and the softmax are f32.
//
// Two implementations with the SAME BITS (not merely close ones):
//  - attention_column_sums_reference (attention_scores.cpp): plain scalar C++, the oracle;
//  - attention_column_sums (attention_scores_simd.cpp): Highway SIMD with runtime dispatch
//    (AVX-512, AVX2, SSE4, NEON, scalar), what every caller uses.
// Scores decide which tokens are evicted, and snapshots taken after compression must resume
// bit-identically on x86-64 and aarch64 (and rebuild the pinned golden files byte for byte), so
// the SIMD kernel repeats the reference's arithmetic operation for operation: SIMD lanes run
// across keys (never across the channels of one dot product), each lane summing its dot product
// in the reference's four partial sums and (s0 + s1) + (s2 + s3) order; per-row sums run key by
// key; exp is portable_math's exp_f32 evaluated in f64 lanes with the same operations; no FMA
// (-ffp-contract=off; no MulAdd). tests/backends/cpu/attention_scores_test.cpp checks bit
// equality on every compiled target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace kvsdk::cpu {

// Loads keys [first, first + n) as f32 rows [n][head_dim] into `out`. Lets callers feed stored
// f16 rows and a host's incoming buffer (any dtype) without first concatenating them. Calls ask
// for consecutive chunks of at most 256 keys.
using KeyChunkLoader = std::function<void(size_t first, size_t n, float* out)>;

// Working memory of attention_column_sums, reused across calls: it grows to the largest shape
// seen (about rows * keys floats of logits, at most 64 MiB, plus one key chunk) and never
// shrinks, so repeated calls of one shape allocate nothing. Not shared between threads.
struct ColumnSumsScratch {
  std::vector<float> logits;    // [row block][keys, padded]: logits, then probabilities
  std::vector<float> keys;      // one chunk as loaded [256][head_dim]
  std::vector<float> keys_t;    // the chunk transposed [head_dim][256 + 16 of padding]
  std::vector<int32_t> key_pos; // the chunk's positions, padded
  std::vector<float> row_max;   // per row: one vector of running maxima
};

// For `n_rows` query rows (f32 [n_rows][head_dim], row r at position row_pos[r]; INT32_MAX sees
// every key) against `n_keys` keys at positions key_pos: computes each row's softmax over the
// keys it may see (key position <= row position) and adds the probabilities to
// col_sums[t] (summed over rows). Rows that see no key add nothing.
void attention_column_sums(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                           size_t head_dim, float scale, const KeyChunkLoader& load_keys,
                           const int32_t* key_pos, size_t n_keys, float* col_sums,
                           ColumnSumsScratch& scratch);

// The same with working memory of its own (allocated per call).
void attention_column_sums(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                           size_t head_dim, float scale, const KeyChunkLoader& load_keys,
                           const int32_t* key_pos, size_t n_keys, float* col_sums);

// The scalar oracle of attention_column_sums (same contract, same bits).
void attention_column_sums_reference(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                                     size_t head_dim, float scale,
                                     const KeyChunkLoader& load_keys, const int32_t* key_pos,
                                     size_t n_keys, float* col_sums);

// out[i] = pmath::exp_f32(x[i]) bit for bit (NaN in gives NaN out), in SIMD lanes.
void portable_exp_f32_array(const float* x, size_t n, float* out);

// --- benchmarking hook (not for production code) ---------------------------------------------
// Pass 1 of attention_column_sums alone: the logits (q . k) * scale of every row and key,
// unmasked, computed exactly as the kernel computes them, left in scratch.logits (row r at
// r * *stride). tests/bench/scoring_gemm_bench.cpp compares it with a BLAS sgemm.
const float* attention_logits(const float* q_rows, size_t n_rows, size_t head_dim, float scale,
                              const KeyChunkLoader& load_keys, size_t n_keys,
                              ColumnSumsScratch& scratch, size_t* stride);

}  // namespace kvsdk::cpu
