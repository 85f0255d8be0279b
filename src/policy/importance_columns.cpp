// group_column_sums over reusable scratch: the importance signals of the decode path (H2O's
// accumulation on every observe, the window scores of every selection pass) without a heap
// allocation per call. The arithmetic is cpu::attention_column_sums's (backends/cpu/
// attention_scores.cpp), operation for operation, so both give the same bits: evictions, and
// the snapshots that resume them, do not depend on which one scored. Once the kernel there takes
// caller-owned scratch, this file reduces to the gather and the group average.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention.h"
#include "policy/importance.h"
#include "portable_math.h"
#include "util/growth.h"

namespace kvsdk::policy {

namespace {

constexpr size_t kChunkKeys = 256;                 // as attention_scores.cpp
constexpr size_t kMaxLogits = size_t(16) << 20;    // as attention_scores.cpp

void column_sums(const float* q_rows, const int32_t* row_pos, size_t n_rows, size_t head_dim,
                 float scale, const cpu::KeyChunkLoader& load_keys, const int32_t* key_pos,
                 size_t n_keys, float* col_sums, ColumnSumsScratch& s) {
  if (n_rows == 0 || n_keys == 0) return;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t rows_per_block = std::max<size_t>(1, std::min(n_rows, kMaxLogits / n_keys));
  float* logits = at_least(s.logits, rows_per_block * n_keys).data();
  float* kbuf = at_least(s.keys, kChunkKeys * head_dim).data();
  for (size_t r0 = 0; r0 < n_rows; r0 += rows_per_block) {
    const size_t nr = std::min(rows_per_block, n_rows - r0);
    for (size_t t0 = 0; t0 < n_keys; t0 += kChunkKeys) {
      const size_t nt = std::min(kChunkKeys, n_keys - t0);
      load_keys(t0, nt, kbuf);
      for (size_t r = 0; r < nr; ++r) {
        const float* q = q_rows + (r0 + r) * head_dim;
        const int32_t limit = row_pos[r0 + r];
        float* lr = logits + r * n_keys + t0;
        for (size_t t = 0; t < nt; ++t) {
          lr[t] = key_pos[t0 + t] > limit ? neg_inf
                                          : cpu::dot_f32(q, kbuf + t * head_dim, head_dim) * scale;
        }
      }
    }
    for (size_t r = 0; r < nr; ++r) {
      float* lr = logits + r * n_keys;
      float m = neg_inf;
      for (size_t t = 0; t < n_keys; ++t) m = std::max(m, lr[t]);
      if (m == neg_inf) continue;
      float sum = 0.0f;
      for (size_t t = 0; t < n_keys; ++t) {
        const float e = lr[t] == neg_inf ? 0.0f : cpu::pmath::exp_f32(lr[t] - m);
        lr[t] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (size_t t = 0; t < n_keys; ++t) col_sums[t] += lr[t] * inv;
    }
  }
}

}  // namespace

void group_column_sums(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                       const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                       float* scores, ColumnSumsScratch& s) {
  if (queries.n == 0 || n_keys == 0) return;
  const uint32_t group = g.group_size();
  const size_t dim = g.head_dim, n_rows = queries.n * group;
  float* rows = at_least(s.rows, n_rows * dim).data();
  int32_t* pos = at_least(s.pos, n_rows).data();
  for (size_t i = 0; i < queries.n; ++i) {
    for (uint32_t j = 0; j < group; ++j) {
      const size_t h = size_t(kv_head) * group + j;
      std::copy_n(queries.q + i * g.q_elems_per_token() + h * dim, dim,
                  rows + (i * group + j) * dim);
      pos[i * group + j] =
          queries.positions ? queries.positions[i] : std::numeric_limits<int32_t>::max();
    }
  }
  float* sums = at_least(s.sums, n_keys).data();
  std::fill_n(sums, n_keys, 0.0f);
  column_sums(rows, pos, n_rows, g.head_dim, g.attn_scale, keys, key_pos, n_keys, sums, s);
  const float inv_group = 1.0f / float(g.group_size());
  for (size_t t = 0; t < n_keys; ++t) scores[t] += sums[t] * inv_group;
}

}  // namespace kvsdk::policy
