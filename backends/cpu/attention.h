// CPU reference attention: exact softmax accumulated online over chunks of tokens, so every tier
// can feed its own (dequantised, reconstructed) rows without materialising the whole cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "partial_state.h"

namespace kvsdk::cpu {

// The working memory of an OnlineAttention, reusable across calls: a caller that keeps one (a
// store, per cache) attends without heap allocation once it has grown to the largest shape seen.
struct AttentionScratch {
  std::vector<float> max, sum, acc, scores;
  // Dequantized / converted key and value rows of one chunk (tiers that feed f32 chunks).
  std::vector<float> k_chunk, v_chunk;
};

// Softmax state of `n_rows` query rows (one row = one query of one query head) against one KV
// head. Rows carry their query position for causal masking (INT32_MAX = sees everything).
class OnlineAttention {
 public:
  OnlineAttention(const float* q_rows, const int32_t* row_positions, size_t n_rows,
                  size_t head_dim, float scale);
  // The same over `scratch`'s buffers (which must outlive this object and not be shared by
  // another live OnlineAttention): no allocation once they have the capacity.
  OnlineAttention(const float* q_rows, const int32_t* row_positions, size_t n_rows,
                  size_t head_dim, float scale, AttentionScratch& scratch);
  OnlineAttention(const OnlineAttention&) = delete;
  OnlineAttention& operator=(const OnlineAttention&) = delete;

  // Adds a chunk of `n_tokens` keys/values (f32, [n_tokens][head_dim]) with their positions.
  void add_chunk(const float* k, const float* v, const int32_t* positions, size_t n_tokens);

  // Writes normalised outputs [n_rows][head_dim]; rows that saw no token get zeros.
  void finish(float* out) const;
  // The unnormalised state instead (split-K): each row's running max score (-inf: no token
  // seen), sum of exp(score - max), and sum of exp(score - max) * values [n_rows][head_dim].
  void state(float* max, float* sum, float* acc) const;

 private:
  const float* q_;
  const int32_t* qpos_;
  size_t n_rows_;
  size_t dim_;
  float scale_;
  AttentionScratch own_;      // used when the caller passed no scratch
  // In s_: max (running max score per row), sum (running sum of exp(score - max) per row), acc
  // (running weighted sum of values [n_rows][dim]), scores (one chunk's).
  AttentionScratch& s_;
};

float dot_f32(const float* a, const float* b, size_t n);

// Split-K's merge (the reference): out [n_rows][dim] = the attention over the union of the parts,
// each holding an OnlineAttention::state(): the max over the parts, then each part rescaled by
// exp(max_i - max) (the softmax's portable exp) and added, part 0 first; rows that saw no token
// in any part get zeros.
void merge_attention_states(const backend::PartialState* parts, size_t n_parts, size_t n_rows,
                            size_t dim, float* out);

}  // namespace kvsdk::cpu
