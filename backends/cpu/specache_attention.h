// SpeCache's decode attention for the optimized CPU backend ("SpeCache: Speculative Key-Value
// Caching for Efficient Generation of LLMs", §3.3): the low-bit KIVI copy with the fetched
// full-precision rows substituted, in two passes over the copy (keys, then values) that share
// one score matrix with the selection:
//   1. keys: each chunk dequantized once, every query row scored against it (the SIMD dot
//      product of fast_chunk_attention.h): the LOW-BIT scores, which SpeCache's selection ranks
//      (written out when asked); the fetched tokens' scores are then recomputed from their f16
//      keys for the attention itself;
//   2. values: softmax over the whole row of scores (fast::exp_f32; each row's sum in 16 lanes
//      by token index reduced by a fixed tree), then each chunk of values dequantized once
//      (fetched rows substituted) and accumulated per channel, token by token, for up to 4 rows
//      at a time (each value row read once per tile).
// Every product and sum has a fixed order, so every SIMD target gives the same bits. Not the bits
// of the reference (cpu::OnlineAttention over the same rows: another summation order and exp);
// backend_ops_test bounds the gap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fast_attention.h"
#include "specache.h"

namespace kvsdk::cpu {

// lowbit.read_rows(first, count, k, v) (either may be NULL), the same bits, faster at 1 and 2 bits
// (head_dim and, for values, the group a multiple of 16; otherwise it calls read_rows): each
// block's key scales and zero points, and the chunk's value scales and zero points, converted
// from f16 in bulk (F16C where there is one; exact either way), then 16 channels at a time
// unpacked in a vector and dequantized as z + code * s (kivi_dequant's operations).
void specache_read_rows(const KiviHeadStore& lowbit, size_t first, size_t count, float* k,
                        float* v, SpeCacheSelectScratch& scratch);

// From the scores [group][n] of one query's rows (overwritten: each becomes exp(score - max))
// to the group-averaged probabilities (into *avg_probs when non-null) and the top k
// (specache_topk) in `tokens`: exp vectorized (fast::exp_f32). The normalization and the group
// average are the reference's (double; z summed in 4 lanes, the reference's in token order), so
// the probabilities differ from the reference (cpu::specache_select_from_scores) only by the
// scores' and exp's rounding, and the top-k only at near-ties. Elementwise loops in a fixed
// order: the same bits in every target clone.
void specache_select_fast(float* scores, size_t group, size_t n, size_t k,
                          SpeCacheSelectScratch& scratch, std::vector<uint32_t>& tokens,
                          std::vector<float>* avg_probs);

// out [q.n_rows][dim]; rows that see no token get zeros. `lowbit_scores`: NULL, or
// [q.n_rows][lowbit.size()] for the low-bit scores (-inf where a token is after the row's
// position; q.positions NULL: every token visible), as the selection computes them.
void specache_attend_fast(const fast::Queries& q, const KiviHeadStore& lowbit,
                          const SpeCacheFetched& fetched, SpeCacheSelectScratch& scratch,
                          float* out, float* lowbit_scores);

}  // namespace kvsdk::cpu
