// SnapKV observation-window scores and their 1-D pooling (also used by PyramidKV and XKV, whose
// importance vector w_i — XKV paper Eq. (3), Fig. 8 — is the same pooled window attention).
#include <algorithm>
#include <limits>

#include "policy/importance.h"
#include "core/representation.h"

namespace kvsdk::policy {

namespace {

// Gathers the group's query rows [n][group][dim] of `kv_head` and their positions.
void gather_group_rows(const QueryBlock& qb, const Geometry& g, uint32_t kv_head,
                       std::vector<float>& rows, std::vector<int32_t>& pos) {
  const uint32_t group = g.group_size();
  const size_t dim = g.head_dim;
  rows.resize(qb.n * group * dim);
  pos.resize(qb.n * group);
  for (size_t i = 0; i < qb.n; ++i) {
    for (uint32_t j = 0; j < group; ++j) {
      const size_t h = size_t(kv_head) * group + j;
      std::copy_n(qb.q + i * g.q_elems_per_token() + h * dim, dim,
                  rows.data() + (i * group + j) * dim);
      pos[i * group + j] = qb.positions ? qb.positions[i] : std::numeric_limits<int32_t>::max();
    }
  }
}

}  // namespace

std::vector<float> window_scores(const QueryBlock& window, const Geometry& g, uint32_t kv_head,
                                 const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                                 size_t n_keys) {
  std::vector<float> scores(n_keys);
  ScoreScratch scratch;
  window_scores(window, g, kv_head, keys, key_pos, n_keys, scores.data(), scratch);
  return scores;
}

void window_scores(const QueryBlock& window, const Geometry& g, uint32_t kv_head,
                   const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                   float* out, ScoreScratch& scratch) {
  std::fill_n(out, n_keys, 0.0f);
  group_column_sums(window, g, kv_head, keys, key_pos, n_keys, out, scratch);
}

void group_column_sums(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                       const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                       float* scores) {
  ScoreScratch scratch;
  group_column_sums(queries, g, kv_head, keys, key_pos, n_keys, scores, scratch);
}

void group_column_sums(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                       const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                       float* scores, ScoreScratch& scratch) {
  if (queries.n == 0 || n_keys == 0) return;
  gather_group_rows(queries, g, kv_head, scratch.rows, scratch.pos);
  std::vector<float>& sums = scratch.sums;
  if (sums.size() < n_keys) sums.resize(n_keys);
  std::fill_n(sums.begin(), n_keys, 0.0f);
  const backend::QueryRows rows{scratch.rows.data(), scratch.pos.data(), scratch.pos.size(),
                                g.head_dim, g.attn_scale};
  const bool here = scratch.rows_store &&
                    scratch.rows_store->column_sums_here(scratch.rows_layer, kv_head, rows, keys,
                                                         key_pos, n_keys, sums.data());
  if (!here) scratch.ops->column_sums(rows, keys, key_pos, n_keys, scratch.workspace(), sums.data());
  // Sum over queries (inside the kernel), average over the group's query heads.
  const float inv_group = 1.0f / float(g.group_size());
  for (size_t t = 0; t < n_keys; ++t) scores[t] += sums[t] * inv_group;
}

void pool_scores(const float* in, size_t n, int kernel, kvsdk_pool_kind kind, float* out) {
  const ptrdiff_t half = kernel / 2;
  for (size_t t = 0; t < n; ++t) {
    const size_t lo = size_t(std::max<ptrdiff_t>(0, ptrdiff_t(t) - half));
    const size_t hi = std::min(n - 1, t + size_t(half));
    if (kind == KVSDK_POOL_MAX) {
      float m = in[lo];
      for (size_t i = lo + 1; i <= hi; ++i) m = std::max(m, in[i]);
      out[t] = m;
    } else {
      float s = 0.0f;
      for (size_t i = lo; i <= hi; ++i) s += in[i];
      out[t] = s / float(kernel);
    }
  }
}

}  // namespace kvsdk::policy
