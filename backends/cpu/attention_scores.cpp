// The scalar reference of the scoring kernel (the oracle of attention_scores_simd.cpp, which
// must give the same bits: change both or neither).
#include "attention_scores.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention.h"
#include "portable_math.h"

namespace kvsdk::cpu {

namespace {

constexpr size_t kChunkKeys = 256;
// Largest logits block held at once (floats): rows are processed in blocks so that scratch stays
// bounded (64 MiB) whatever the sequence length. (Blocking never changes a result: rows are
// independent and add to the columns in row order either way.)
constexpr size_t kMaxLogits = size_t(16) << 20;

}  // namespace

void attention_column_sums_reference(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                                     size_t head_dim, float scale,
                                     const KeyChunkLoader& load_keys, const int32_t* key_pos,
                                     size_t n_keys, float* col_sums) {
  if (n_rows == 0 || n_keys == 0) return;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t rows_per_block = std::max<size_t>(1, std::min(n_rows, kMaxLogits / n_keys));
  std::vector<float> logits(rows_per_block * n_keys);
  std::vector<float> kbuf(kChunkKeys * head_dim);
  for (size_t r0 = 0; r0 < n_rows; r0 += rows_per_block) {
    const size_t nr = std::min(rows_per_block, n_rows - r0);
    // Pass 1: logits of every row of the block, one key chunk at a time (keys loaded once).
    for (size_t t0 = 0; t0 < n_keys; t0 += kChunkKeys) {
      const size_t nt = std::min(kChunkKeys, n_keys - t0);
      load_keys(t0, nt, kbuf.data());
      for (size_t r = 0; r < nr; ++r) {
        const float* q = q_rows + (r0 + r) * head_dim;
        const int32_t limit = row_pos[r0 + r];
        float* lr = logits.data() + r * n_keys + t0;
        for (size_t t = 0; t < nt; ++t) {
          lr[t] = key_pos[t0 + t] > limit ? neg_inf
                                          : dot_f32(q, kbuf.data() + t * head_dim, head_dim) * scale;
        }
      }
    }
    // Pass 2: f32 softmax per row, probabilities summed into the columns.
    for (size_t r = 0; r < nr; ++r) {
      float* lr = logits.data() + r * n_keys;
      float m = neg_inf;
      for (size_t t = 0; t < n_keys; ++t) m = std::max(m, lr[t]);
      if (m == neg_inf) continue;  // this row sees no key
      float sum = 0.0f;
      for (size_t t = 0; t < n_keys; ++t) {
        // Portable exp (portable_math.h): scores decide evictions, which snapshots resume.
        const float e = lr[t] == neg_inf ? 0.0f : pmath::exp_f32(lr[t] - m);
        lr[t] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (size_t t = 0; t < n_keys; ++t) col_sums[t] += lr[t] * inv;
    }
  }
}

}  // namespace kvsdk::cpu
