// The scoring kernel of the eviction presets on the device: for each query row, the causal f32
// softmax probabilities over a KV head's keys, summed into one column per key. The same bits as
// the CPU backends' column_sums (backends/cpu/attention_scores.h), so a device cache keeps the
// rows a CPU cache keeps, and snapshots resume alike on either: the logits are dot_f32's four
// partial sums (channel c into sum c mod 4, then (s0 + s1) + (s2 + s3), times the scale), the
// exponentials pmath::exp_f32 (backends/cpu/portable_exp.h), each row's sum of them in key order,
// and the columns add p * (1 / sum) row after row. The file compiles with --fmad=false: nothing is
// fused into an FMA. This is the window scoring of SnapKV, PyramidKV and XKV and H2O's
// accumulated attention (src/policy/importance.h); cuda_window_scoring.h is the cuBLAS variant
// with f16 queries, which does not keep the CPU's bits.
//
// Device pointers; work is enqueued on `stream`, nothing synchronises. Throws kvsdk::Error
// (KVSDK_E_BACKEND) when a launch fails.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// A KIVI store's quantized keys (backend_ops.h KiviTier's key buffers): ColumnSumsShape::quant
// rows of packed codes (ceil(dim * bits / 8) bytes a row), in key blocks of `group` tokens or,
// with block_starts, `blocks` ragged ones; each key is zero + code * scale of its block and
// channel, as the CPU's kivi_dequantize_keys widens it.
struct QuantKeys {
  const uint8_t* codes = nullptr;      // [tokens][row bytes]
  const uint16_t* scale = nullptr;     // [blocks][dim] f16
  const uint16_t* zero = nullptr;
  const int32_t* positions = nullptr;  // [tokens]
  const uint32_t* block_starts = nullptr;  // [blocks]; null: tokens / group full blocks
  size_t blocks = 0;
  uint32_t bits = 2, group = 32;
};

struct ColumnSumsShape {
  size_t rows = 0;     // query rows
  size_t dim = 0;      // head_dim
  float scale = 1.0f;  // the logits' scale
  size_t quant = 0;    // keys of `quant` (KIVI codes, its tokens), then
  size_t held = 0;     // keys of `held_k` (f16), then
  size_t tail = 0;     // keys of `tail_k` (f32): n_keys = quant + held + tail
};

// Floats of working memory `column_sums` needs for `max_logits` logits at once (rows are taken
// in blocks of at most max_logits / n_keys, at least one): the block's logits plus 3 per row.
size_t column_sums_workspace(const ColumnSumsShape& shape, size_t max_logits);

// q [rows][dim] f32 with q_pos [rows] (a key at a position after its row's is masked); `quant`
// (shape.quant = quant.tokens keys; ignored when 0); held_k [held][dim] f16 bits with held_pos
// [held]; tail_k [tail][dim] f32 with tail_pos [tail]. Overwrites col_sums [quant + held + tail].
// `work` holds column_sums_workspace(shape, max_logits) floats.
void column_sums(const float* q, const int32_t* q_pos, const QuantKeys& quant,
                 const uint16_t* held_k,
                 const int32_t* held_pos, const float* tail_k, const int32_t* tail_pos,
                 const ColumnSumsShape& shape, size_t max_logits, float* work, float* col_sums,
                 cudaStream_t stream);

// The logits alone, the first step of column_sums with its bits: scores [rows][quant + held +
// tail] (row-major, caller's memory: no working memory, no limit on rows) = each row's dot_f32
// with each key (quantized keys as kivi_dequantize_keys widens them) times shape.scale, -inf
// where the key's position is after the row's. Arguments as column_sums' (q_pos may be null:
// every key is seen). SpeCache's selection scores: the reference's cpu::specache_score_chunk,
// bit for bit (backend_ops.h specache_scores_tier).
void key_scores(const float* q, const int32_t* q_pos, const QuantKeys& quant,
                const uint16_t* held_k, const int32_t* held_pos, const float* tail_k,
                const int32_t* tail_pos, const ColumnSumsShape& shape, float* scores,
                cudaStream_t stream);

}  // namespace kvsdk::cuda
