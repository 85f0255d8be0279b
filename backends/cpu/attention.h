// CPU reference attention: exact softmax accumulated online over chunks of tokens, so every tier
// can feed its own (dequantised, reconstructed) rows without materialising the whole cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::cpu {

// Softmax state of `n_rows` query rows (one row = one query of one query head) against one KV
// head. Rows carry their query position for causal masking (INT32_MAX = sees everything).
class OnlineAttention {
 public:
  OnlineAttention(const float* q_rows, const int32_t* row_positions, size_t n_rows,
                  size_t head_dim, float scale);

  // Adds a chunk of `n_tokens` keys/values (f32, [n_tokens][head_dim]) with their positions.
  void add_chunk(const float* k, const float* v, const int32_t* positions, size_t n_tokens);

  // Writes normalised outputs [n_rows][head_dim]; rows that saw no token get zeros.
  void finish(float* out) const;

 private:
  const float* q_;
  const int32_t* qpos_;
  size_t n_rows_;
  size_t dim_;
  float scale_;
  std::vector<float> max_;    // running max score per row
  std::vector<float> sum_;    // running sum of exp(score - max) per row
  std::vector<float> acc_;    // running weighted sum of values [n_rows][dim]
  std::vector<float> scores_; // scratch for one chunk
};

float dot_f32(const float* a, const float* b, size_t n);

}  // namespace kvsdk::cpu
