#include "attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "portable_math.h"
#include "target_clones.h"

namespace kvsdk::cpu {

float dot_f32(const float* a, const float* b, size_t n) {
  // Four partial sums: lets the compiler vectorise without -ffast-math reassociation.
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

OnlineAttention::OnlineAttention(const float* q_rows, const int32_t* row_positions, size_t n_rows,
                                 size_t head_dim, float scale)
    : OnlineAttention(q_rows, row_positions, n_rows, head_dim, scale, own_) {}

OnlineAttention::OnlineAttention(const float* q_rows, const int32_t* row_positions, size_t n_rows,
                                 size_t head_dim, float scale, AttentionScratch& scratch)
    : q_(q_rows), qpos_(row_positions), n_rows_(n_rows), dim_(head_dim), scale_(scale), s_(scratch) {
  // assign() reuses the capacity the buffers already have.
  s_.max.assign(n_rows, -std::numeric_limits<float>::infinity());
  s_.sum.assign(n_rows, 0.0f);
  s_.acc.assign(n_rows * head_dim, 0.0f);
}

// Cloned per x86-64 SIMD level (target_clones.h): the same bits in every clone.
KVSDK_TARGET_CLONES
void OnlineAttention::add_chunk(const float* k, const float* v, const int32_t* positions,
                                size_t n_tokens) {
  if (n_tokens == 0) return;
  std::vector<float>& scores_ = s_.scores;
  std::vector<float>& max_ = s_.max;
  std::vector<float>& sum_ = s_.sum;
  std::vector<float>& acc_ = s_.acc;
  if (scores_.size() < n_tokens) scores_.resize(n_tokens);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < n_rows_; ++r) {
    const float* q = q_ + r * dim_;
    const int32_t limit = qpos_[r];
    float chunk_max = neg_inf;
    for (size_t t = 0; t < n_tokens; ++t) {
      if (positions[t] > limit) {
        scores_[t] = neg_inf;
        continue;
      }
      const float s = dot_f32(q, k + t * dim_, dim_) * scale_;
      scores_[t] = s;
      if (s > chunk_max) chunk_max = s;
    }
    if (chunk_max == neg_inf) continue;  // nothing visible in this chunk
    float* acc = acc_.data() + r * dim_;
    if (chunk_max > max_[r]) {
      // exp from portable_math.h, not libm (whose expf differs by platform): outputs and the
      // importance state derived from them keep their bits on every architecture.
      const float rescale = pmath::exp_f32(max_[r] - chunk_max);  // exp(-inf) = 0 at first
      sum_[r] *= rescale;
      for (size_t d = 0; d < dim_; ++d) acc[d] *= rescale;
      max_[r] = chunk_max;
    }
    const float m = max_[r];
    for (size_t t = 0; t < n_tokens; ++t) {
      if (scores_[t] == neg_inf) continue;
      const float p = pmath::exp_f32(scores_[t] - m);
      sum_[r] += p;
      const float* vt = v + t * dim_;
      for (size_t d = 0; d < dim_; ++d) acc[d] += p * vt[d];
    }
  }
}

void OnlineAttention::finish(float* out) const {
  const std::vector<float>& sum_ = s_.sum;
  const std::vector<float>& acc_ = s_.acc;
  for (size_t r = 0; r < n_rows_; ++r) {
    const float inv = sum_[r] > 0.0f ? 1.0f / sum_[r] : 0.0f;
    for (size_t d = 0; d < dim_; ++d) out[r * dim_ + d] = acc_[r * dim_ + d] * inv;
  }
}

void OnlineAttention::state(float* max, float* sum, float* acc) const {
  std::copy_n(s_.max.data(), n_rows_, max);
  std::copy_n(s_.sum.data(), n_rows_, sum);
  std::copy_n(s_.acc.data(), n_rows_ * dim_, acc);
}

void merge_attention_states(const backend::PartialState* parts, size_t n_parts, size_t n_rows,
                            size_t dim, float* out) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < n_rows; ++r) {
    float m = neg_inf;
    for (size_t p = 0; p < n_parts; ++p) m = std::max(m, parts[p].max[r]);
    float* o = out + r * dim;
    std::fill_n(o, dim, 0.0f);
    if (m == neg_inf) continue;  // no part saw a token for this row
    float total = 0.0f;
    for (size_t p = 0; p < n_parts; ++p) {
      if (parts[p].max[r] == neg_inf) continue;
      const float w = pmath::exp_f32(parts[p].max[r] - m);
      total += parts[p].sum[r] * w;
      const float* a = parts[p].acc + r * dim;
      for (size_t d = 0; d < dim; ++d) o[d] += a[d] * w;
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (size_t d = 0; d < dim; ++d) o[d] *= inv;
  }
}

}  // namespace kvsdk::cpu
