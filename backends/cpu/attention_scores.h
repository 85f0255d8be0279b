// CPU scoring kernel shared by the importance signals (SnapKV/PyramidKV/XKV window scores, H2O
// accumulation, the mini-prefill planner): how much softmax attention probability a block of
// query rows gives every key. Scores and the softmax are f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvsdk::cpu {

// Loads keys [first, first + n) as f32 rows [n][head_dim] into `out`. Lets callers feed stored
// f16 rows and a host's incoming buffer (any dtype) without first concatenating them.
using KeyChunkLoader = std::function<void(size_t first, size_t n, float* out)>;

// For `n_rows` query rows (f32 [n_rows][head_dim], row r at position row_pos[r]; INT32_MAX sees
// every key) against `n_keys` keys at positions key_pos: computes each row's softmax over the
// keys it may see (key position <= row position) and adds the probabilities to
// col_sums[t] (summed over rows). Rows that see no key add nothing.
void attention_column_sums(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                           size_t head_dim, float scale, const KeyChunkLoader& load_keys,
                           const int32_t* key_pos, size_t n_keys, float* col_sums);

}  // namespace kvsdk::cpu
