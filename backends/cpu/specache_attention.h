// SpeCache's decode attention for the optimized CPU backend ("SpeCache: Speculative Key-Value
// Caching for Efficient Generation of LLMs", §3.3): the low-bit KIVI copy with the fetched
// full-precision rows substituted, C' ∪ C_K, as two parts of one softmax merged split-K style
// (fast_attention.h):
//   1. the fused KIVI kernel over the low-bit copy (codes never dequantized to floats) with the
//      fetched tokens excluded, handing out every row's low-bit scores on the way (KiviTaps),
//      which SpeCache's selection ranks;
//   2. the f16 kernel over the fetched rows (at their tokens' positions);
//   3. fast::merge_partials of the two.
// Every target gives the same bits (the kernels' rules). Not the bits of the reference
// (cpu::specache_attend: dequantized rows in float): the KIVI kernel's integer query codes and
// value weights, and another summation order; backend_ops_test bounds the gap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fast_attention.h"
#include "specache.h"

namespace kvsdk::cpu {

// From the scores [group][n] of one query's rows (overwritten: each becomes exp(score - max))
// to the group-averaged probabilities (into *avg_probs when non-null) and the top k
// (specache_topk) in `tokens`: exp vectorized (fast::exp_f32), each head's normalization one
// multiply by 1 / (z * group) (z in double, 4 lanes by token index). Elementwise loops in a fixed
// order: the same bits in every target clone.
void specache_select_fast(float* scores, size_t group, size_t n, size_t k,
                          SpeCacheSelectScratch& scratch, std::vector<uint32_t>& tokens,
                          std::vector<float>* avg_probs);

// The low-bit scores of query rows q against every token of the copy (fast::kivi_scores: the
// bits attend_fast's `lowbit_scores` gets) into scores [q.n_rows][lowbit.size()] (-inf after a
// row's position; q.positions NULL: every token visible).
void specache_scores_fast(const fast::Queries& q, const KiviHeadStore& lowbit,
                          SpeCacheSelectScratch& scratch, fast::Scratch& kernel, float* scores);

// out [q.n_rows][dim]; rows that see no token get zeros. `lowbit_scores`: NULL, or
// [q.n_rows][lowbit.size()] for the low-bit scores (-inf where a token is after the row's
// position; q.positions NULL: every token visible), the fetched tokens' included.
// `fetched_share` (needs lowbit_scores): NULL, or [q.n_rows] for the share of each row's softmax
// over the low-bit scores that the fetched tokens hold (0 for a row that sees no token), from
// the KIVI part's own softmax state (max and sum over the other tokens) and the fetched tokens'
// scores: no second pass over the copy. No allocation once the scratches have grown.
void specache_attend_fast(const fast::Queries& q, const KiviHeadStore& lowbit,
                          const SpeCacheFetched& fetched, SpeCacheSelectScratch& scratch,
                          fast::Scratch& kernel, float* out, float* lowbit_scores,
                          float* fetched_share = nullptr);

}  // namespace kvsdk::cpu
