// Importance signals (stage 1 of a policy, docs/papers.md): how much each cached token matters to
// one KV head.
//   - window scores (SnapKV, PyramidKV, XKV): attention of the observation-window queries;
//   - accumulated attention (H2O): column sums added up over every observed query.
// Both average over the query heads of a GQA group, so there is one score per token per KV head
// (repeated heads are never materialised).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention_scores.h"
#include "core/geometry.h"
#include "policy/score_scratch.h"
#include "kvsdk.h"

namespace kvsdk::policy {

using kvsdk::ScoreScratch;  // policy/score_scratch.h

// Observed queries of one layer: n rows of n_q_heads x head_dim f32, with positions.
struct QueryBlock {
  const float* q = nullptr;          // [n][n_q_heads * head_dim]
  const int32_t* positions = nullptr;  // [n]; INT32_MAX = sees every key
  size_t n = 0;
};

// The shared primitive: adds to scores[t] the f32 softmax probabilities the queries give key t
// (causal), summed over the queries and averaged over the query heads of `kv_head`'s group.
// The kernel is scratch.ops->column_sums (the backend seam: the reference's scalar kernel, or the
// optimized backend's SIMD one with the same bits).
void group_column_sums(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                       const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                       float* scores, ScoreScratch& scratch);
void group_column_sums(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                       const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                       float* scores);

// SnapKV (Li et al. 2024; docs/papers.md): for every key, the f32 softmax
// probability each window query gives it (causal inside the window), summed over the window
// queries and averaged over the query heads of `kv_head`'s group. Returns n_keys scores.
std::vector<float> window_scores(const QueryBlock& window, const Geometry& g, uint32_t kv_head,
                                 const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                                 size_t n_keys);
// The same into out[0, n_keys) (overwritten) with reused working memory.
void window_scores(const QueryBlock& window, const Geometry& g, uint32_t kv_head,
                   const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                   float* out, ScoreScratch& scratch);

// H2O (Zhang et al. 2023): adds the same group-averaged column sums of `queries` to the
// accumulated per-token scores (`scores` has n_keys entries and persists for kept tokens).
void h2o_accumulate(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                    const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                    float* scores);
// The same over reusable scratch (the decode path: no allocation once it has the capacity).
void h2o_accumulate(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                    const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                    float* scores, ScoreScratch& scratch);

// SnapKV 1-D pooling over `n` scores with an odd `kernel` centred on each token: max over the
// tokens inside the kernel, or their sum divided by `kernel` (zero padding at the ends, like a
// padded average pool that counts the padding).
void pool_scores(const float* in, size_t n, int kernel, kvsdk_pool_kind kind, float* out);

}  // namespace kvsdk::policy
