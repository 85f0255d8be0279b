// SpeCache (Jie et al. 2025, paper 003): the full-precision KV cache lives in a backing store, a
// low-bit KIVI copy (2- or 1-bit) is where attention runs. Each decode step also decodes a
// speculative next token; its attention over the low-bit keys picks the top-k tokens (scores
// averaged over the query heads of a GQA group, so one set per KV head) whose full-precision rows
// are fetched for the next step (§3.3). Attention then uses the low-bit rows with the fetched
// rows substituted: C' ∪ C_K (§3.3, "replace C'_K with 16-bit C_K in this computation").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention.h"
#include "kivi_store.h"

namespace kvsdk::cpu {

// Full-precision (f16) rows of one KV head, in the same token order as the low-bit copy. Lives
// outside the budgeted memory (host RAM, or a file mapping), so it is reported separately.
struct SpeCacheBackingStore {
  size_t dim = 0;
  std::vector<uint16_t> k, v;  // [n][dim] f16
  void append(const float* k_rows, const float* v_rows, size_t n);
  size_t size() const { return dim ? k.size() / dim : 0; }
  uint64_t bytes() const { return 2 * uint64_t(k.size() + v.size()); }
};

// Rows fetched into the budgeted memory for one step: ascending token indices and their rows.
struct SpeCacheFetched {
  std::vector<uint32_t> tokens;
  std::vector<uint16_t> k, v;  // [tokens.size()][dim] f16
  uint64_t bytes() const { return 4 * uint64_t(tokens.size()) + 2 * uint64_t(k.size() + v.size()); }
};

// Group-averaged top-k: q [group][dim] are the speculative token's queries of the group's heads at
// position q_position; each head's softmax over the dequantized low-bit keys is averaged over the
// group and the k most probable tokens (ties: lower index) are returned in ascending order.
// Also writes the averaged probabilities [store.size()] to `avg_probs` when non-null.
std::vector<uint32_t> specache_select(const KiviHeadStore& lowbit, const float* q, size_t group,
                                      int32_t q_position, float scale, size_t k,
                                      std::vector<float>* avg_probs = nullptr);

// Copies the rows of `tokens` (ascending, < backing.size()) out of the backing store.
SpeCacheFetched specache_fetch(const SpeCacheBackingStore& backing,
                               const std::vector<uint32_t>& tokens);

// Adds every token of the low-bit copy to `attn`, using the fetched full-precision row instead of
// the dequantized one where there is one.
void specache_attend(const KiviHeadStore& lowbit, const SpeCacheFetched& fetched,
                     OnlineAttention& attn);

// Fraction of `probs` (a distribution over the tokens) that falls on `tokens`: the fetch hit rate.
double specache_hit_rate(const std::vector<float>& probs, const std::vector<uint32_t>& tokens);

}  // namespace kvsdk::cpu
