// Decode attention on the device, directly over the stored tiers (docs/gpu.md): one new query token
// per sequence attends to every cached token of its KV head, read from
//  - the exact tier: f16 key/value rows, and/or
//  - a KIVI tier: packed codes with f16 scales/zero points in backends/cpu/kivi_store.h's layout
//    (keys per channel over blocks of G tokens, values per token over G-channel groups),
//    dequantized in registers as they are loaded (fused: no dense copy is ever materialised).
// GQA without repeating heads: one thread block loads each K/V row once and scores it for all the
// query heads of its group. Split-K ("flash-decoding"): the tokens of a head are cut into splits,
// each block keeps an online softmax (running max, sum, weighted values) over its split and writes
// an unnormalised partial; a reduction kernel merges the partials of all splits of all tiers, so a
// KIVI tier and the exact residual window form one exact softmax.
//
// Causal masking is optional: with positions for a tier's rows and for the queries, a query sees
// only the rows whose position is <= its own (what the cache's attend does for chunked prefill);
// without them every row is seen (decode: all tokens precede the query).
// Device pointers; everything is enqueued on `stream`, nothing synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

constexpr size_t kDecodeMaxGroup = 8;  // query heads per KV head handled by one block

struct DecodeShape {
  size_t batch = 1;
  size_t kv_heads = 0;
  size_t group = 1;  // query heads per KV head (1..kDecodeMaxGroup)
  size_t dim = 0;    // head_dim: 64, 128 or 256
  float scale = 1.0f;
  // Every sequence of the batch reads the same rows (those of sequence 0): the query tokens of one
  // conversation, each a "sequence" with its own position. The tiers then hold kv_heads heads.
  bool shared_rows = false;
};

// Tokens a tier leaves out (SpeCache (docs/papers.md) §3.3: the low-bit rows whose full-precision
// rows are attended instead): tier token `tok` is skipped, by every query row as if masked, when
// tok + exclude_base is in exclude[0 .. n_exclude) (device memory, strictly ascending). One list
// can so index the tokens of several tiers laid end to end (a KIVI tier with base 0, its residual
// exact tier with base = the KIVI tier's tokens). The same list applies to every head, so it is
// only accepted when the heads' rows are shared (DecodeShape::shared_rows, or one head). Each
// warp walks its tokens in ascending order with a cursor into the list (one binary search per
// split), so excluding costs one comparison per token, and nothing without a list.
struct TokenExclusion {
  const uint32_t* exclude = nullptr;
  size_t n_exclude = 0;
  uint32_t exclude_base = 0;
};

// Rows of head (b, h) start at row (b * kv_heads + h) * capacity:
// k/v f16 [batch*kv][capacity][dim], 16-byte aligned (rows are read with vector loads).
struct ExactTierView {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  size_t tokens = 0;    // valid rows per head
  size_t capacity = 0;  // row stride between heads (>= tokens)
  // Positions of the rows, [head][capacity] like the rows, or null: no causal mask for this tier.
  const int32_t* positions = nullptr;
  TokenExclusion skip;  // none by default
};

// Per head (b, h) = index i: k_codes/v_codes [i][capacity][packed_bytes(dim)],
// k_scale/k_zero [i][capacity / group][dim], v_scale/v_zero [i][capacity][ceil(dim / group)].
// Ragged key blocks (KIVI under eviction, backends/cpu/kivi_store.h's retain): with block_starts,
// head i's key blocks start at quantized tokens block_starts[i * block_stride + b] (ascending from
// 0, `blocks` per head), its scales are k_scale/k_zero [i][block_stride][dim], and tokens and
// capacity need not be multiples of G.
struct KiviTierView {
  const uint8_t* k_codes = nullptr;
  const uint8_t* v_codes = nullptr;
  const uint16_t* k_scale = nullptr;
  const uint16_t* k_zero = nullptr;
  const uint16_t* v_scale = nullptr;
  const uint16_t* v_zero = nullptr;
  uint32_t bits = 2;
  uint32_t group = 32;  // G
  size_t tokens = 0;    // quantized tokens per head (a multiple of G)
  size_t capacity = 0;  // token stride between heads (a multiple of G, >= tokens)
  const int32_t* positions = nullptr;  // [head][capacity], or null: no causal mask for this tier
  const uint32_t* block_starts = nullptr;  // null: every key block holds G tokens
  size_t blocks = 0;                       // key blocks per head (with block_starts)
  size_t block_stride = 0;                 // >= blocks
  TokenExclusion skip;                     // none by default
};

// One tensor of one KV head of a MiniCache layer pair, one layer of it (backend::MiniCacheTensor's
// layout: MiniCache (docs/papers.md), backends/cpu/minicache_merge.h): slots [tokens], merged
// slot s = magnitudes[s] * directions[s][dim], retained slot kMiniCacheRetained | j = retained[j].
constexpr uint32_t kMiniCacheRetained = 0x80000000u;
struct MiniCacheTensorView {
  const uint32_t* slots = nullptr;
  const uint16_t* directions = nullptr;  // f16 [merged][dim], 16-byte aligned
  const float* magnitudes = nullptr;
  const uint16_t* retained = nullptr;    // f16 [retained][dim], 16-byte aligned
};
// The merged tier of one head (the rows of one head only: shared_rows, or one head).
struct MiniCacheTierView {
  MiniCacheTensorView k, v;
  size_t tokens = 0;
  const int32_t* positions = nullptr;  // [tokens], or null: no causal mask for this tier
  TokenExclusion skip;                 // none by default
};

// How the tokens are split, and the f32 workspace the partials need.
struct DecodePlan {
  size_t kivi_splits = 0, kivi_split_tokens = 0;
  size_t exact_splits = 0, exact_split_tokens = 0;
  size_t extra_splits = 0, extra_split_tokens = 0;  // the second exact tier (decode_attention)
  size_t workspace_bytes = 0;  // for [batch*q_heads][splits] maxima and sums + [..][splits][dim]
};

// split_tokens 0 picks a size that gives the current device about two blocks per SM (at least
// 64 tokens per split). `extra_tokens`: the rows of decode_attention's second exact tier (0:
// none; the plan is then the one without it). Throws kvsdk::Error: KVSDK_E_INVALID_ARG for a bad
// shape (zero sizes, group > kDecodeMaxGroup, unsupported dim), KVSDK_E_BACKEND when the device
// cannot be queried.
DecodePlan plan_decode(const DecodeShape& shape, size_t kivi_tokens, size_t exact_tokens,
                       size_t split_tokens = 0, size_t extra_tokens = 0);

// q f32 [batch][kv_heads * group][dim] (query head h*group + g belongs to KV head h) -> out f32
// [batch][kv_heads * group][dim]. Any tier may be null (not all), and each must match the plan's
// token counts. `extra`: a second exact tier in the same softmax (SpeCache's fetched
// full-precision rows, at their own positions), its splits after the exact tier's. `workspace`
// has plan.workspace_bytes bytes, 16-byte aligned. `q_positions` [batch][kv_heads * group] (one
// per query row, like q) masks the rows of tiers that carry positions; null: no mask. A tier's
// `skip` leaves tokens out (TokenExclusion). A query row that sees no token yields zeros. Throws
// KVSDK_E_INVALID_ARG for a mismatch (also an exclusion list over rows that are not shared),
// KVSDK_E_BACKEND for launch failures.
void decode_attention(const float* q, const DecodeShape& shape, const KiviTierView* kivi,
                      const ExactTierView* exact, const DecodePlan& plan, void* workspace,
                      float* out, cudaStream_t stream, const int32_t* q_positions = nullptr,
                      const ExactTierView* extra = nullptr);

// decode_attention with a MiniCache tier in place of the KIVI one: its rows restored in
// registers as the CPU's MergedLayerPair::reconstruct restores them (one f16->f32 conversion and
// one f32 multiply per element, so the split-K kernel reads no scratch rows), and `pending`
// (may be null: the layer's exact rows waiting for its partner) in the same softmax. `plan` is
// plan_decode(shape, merged.tokens, pending tokens): the merged tier takes the KIVI tier's
// splits. Throws as decode_attention, and KVSDK_E_INVALID_ARG when the rows are not one head's.
void decode_attention_minicache(const float* q, const DecodeShape& shape,
                                const MiniCacheTierView& merged, const ExactTierView* pending,
                                const DecodePlan& plan, void* workspace, float* out,
                                cudaStream_t stream, const int32_t* q_positions = nullptr);

}  // namespace kvsdk::cuda
