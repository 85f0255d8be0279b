#include "spindlekv_store.h"

#include <algorithm>
#include <limits>

#include "fast_chunk_attention.h"
#include "target_clones.h"
#include "util/error.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

SpindleHeadStore::SpindleHeadStore(size_t head_dim, float rope_theta, kvsdk_rope_style rope_style,
                                   float theta_k, float theta_v)
    : rope_(head_dim, rope_theta, rope_style), keys_(head_dim, theta_k), values_(head_dim, theta_v) {}

void SpindleHeadStore::append(const float* k, const float* v, const int32_t* positions,
                              size_t n) {
  SpindleScratch scratch;
  append(k, v, positions, n, scratch);
}

void SpindleHeadStore::append(const float* k, const float* v, const int32_t* positions, size_t n,
                              SpindleScratch& scratch) {
  const size_t dim = head_dim();
  std::vector<float>& pre = at_least(scratch.pre_rope, n * dim);
  std::copy_n(k, n * dim, pre.data());
  for (size_t t = 0; t < n; ++t) rope_.inverse(&pre[t * dim], positions[t]);
  reserve_for_growth(positions_, positions_.size() + n);
  for (size_t first = 0; first < n; first += kSpindlePrefillBlock) {
    const size_t c = std::min(kSpindlePrefillBlock, n - first);
    keys_.append(&pre[first * dim], c, scratch.codebook);
    values_.append(v + first * dim, c, scratch.codebook);
    // A block is encoded as an append of its own would be (it joins the entries of the blocks
    // before it, its leftovers build new ones): a batch for truncation. A single row (decode)
    // needs no record, so the decode path does not grow this.
    const size_t at = positions_.size() + first;
    if (c > 1) batches_.push_back({at, at + c});
  }
  positions_.insert(positions_.end(), positions, positions + n);
}

void SpindleHeadStore::read_rows(size_t first, size_t count, float* k, float* v) const {
  read_keys(first, count, k);
  values_.reconstruct(first, count, v);
}

void SpindleHeadStore::read_keys(size_t first, size_t count, float* k) const {
  keys_.reconstruct(first, count, k);
  rope_.apply_rows(k, positions_.data() + first, count);
}

void SpindleHeadStore::read_keys_f32(size_t first, size_t count, float* k) const {
  keys_.reconstruct(first, count, k);
  rope_.apply_rows_f32(k, positions_.data() + first, count);
}

SpindleHeadStore SpindleHeadStore::restore(size_t head_dim, float rope_theta,
                                           kvsdk_rope_style rope_style, SpindleCodebook keys,
                                           SpindleCodebook values,
                                           std::vector<int32_t> positions) {
  SpindleHeadStore s(head_dim, rope_theta, rope_style, keys.theta(), values.theta());
  if (keys.dim() != head_dim || values.dim() != head_dim || keys.size() != positions.size() ||
      values.size() != positions.size()) {
    fail(KVSDK_E_CORRUPT, "SpindleKV head buffers: ", keys.size(), " key rows and ",
         values.size(), " value rows for ", positions.size(), " positions (head_dim ", head_dim,
         ")");
  }
  s.keys_ = std::move(keys);
  s.values_ = std::move(values);
  s.positions_ = std::move(positions);
  s.restored_rows_ = s.positions_.size();
  return s;
}

size_t SpindleHeadStore::rows_before(int32_t position) const {
  size_t k = positions_.size();
  while (k > 0 && positions_[k - 1] >= position) --k;
  return k;
}

const char* SpindleHeadStore::removal_refusal(int32_t position) const {
  const size_t k = rows_before(position);
  for (size_t i = 0; i < k; ++i) {
    if (positions_[i] >= position) {
      return "it holds tokens from that position before older rows that would stay";
    }
  }
  if (k == positions_.size() || k == 0) return nullptr;  // nothing goes, or all: the empty store
  if (k < restored_rows_) {
    return "the tokens from that position were restored from a snapshot or a fork, which does "
           "not record which of them SpindleKV encoded together with older ones";
  }
  for (const Batch& b : batches_) {
    if (b.first < k && k < b.end) {
      return "SpindleKV encoded tokens from that position in one append with older ones (the "
             "greedy codebook construction saw both)";
    }
  }
  return nullptr;
}

void SpindleHeadStore::remove_from(int32_t position) noexcept {
  const size_t k = rows_before(position);
  if (k == positions_.size()) return;
  keys_.truncate(k);
  values_.truncate(k);
  positions_.resize(k);
  while (!batches_.empty() && batches_.back().first >= k) batches_.pop_back();
  restored_rows_ = std::min(restored_rows_, k);
}

SpindleBytes SpindleHeadStore::bytes() const {
  return {keys_.bytes(), values_.bytes(), sizeof(int32_t) * uint64_t(positions_.size())};
}

void spindlekv_attend(const SpindleHeadStore& store, OnlineAttention& attn) {
  std::vector<float> k, v;
  spindlekv_attend(store, attn, k, v);
}

namespace {

// Query rows per block of spindlekv_attend_entries: a decode step's GQA group fits in one.
constexpr size_t kEntryRowBlock = 16;

// acc[d] += w * c[d] (elementwise: the same bits in every clone, target_clones.h).
KVSDK_TARGET_CLONES
void add_scaled(float* __restrict acc, const float* __restrict c, float w, size_t dim) {
  for (size_t d = 0; d < dim; ++d) acc[d] += w * c[d];
}

}  // namespace

void spindlekv_attend_entries(const float* q, const int32_t* q_positions, size_t n_rows,
                              float scale, const SpindleHeadStore& store,
                              AttentionScratch& scratch, float* out) {
  const size_t n = store.size(), dim = store.head_dim();
  const SpindleCodebook& values = store.values();
  const size_t n_entries = values.entries();
  const uint32_t* index = values.index().data();
  const float* magnitude = values.magnitude().data();
  const int32_t* pos = store.positions().data();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill_n(out, n_rows * dim, 0.0f);
  if (n == 0) return;
  const size_t block = std::min(kEntryRowBlock, n_rows);
  float* scores = at_least(scratch.scores, block * n).data();
  float* chunk = at_least(scratch.k_chunk, kSpindleAttendChunk * dim).data();
  float* weights = at_least(scratch.v_chunk, block * n_entries).data();
  float* sums = at_least(scratch.sum, block).data();
  for (size_t r0 = 0; r0 < n_rows; r0 += block) {
    const size_t rows = std::min(block, n_rows - r0);
    // Scores of the block's rows against every key, rebuilt chunk by chunk.
    for (size_t first = 0; first < n; first += kSpindleAttendChunk) {
      const size_t c = std::min(kSpindleAttendChunk, n - first);
      store.read_keys_f32(first, c, chunk);
      fast::dot_scores(q + r0 * dim, rows, chunk, c, dim, scale, scores + first, n);
    }
    // Softmax per row, and its weight per value entry (tokens in order: deterministic sums).
    std::fill_n(weights, rows * n_entries, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      float* s = scores + r * n;
      const int32_t qp = q_positions ? q_positions[r0 + r] : INT32_MAX;
      float mx = neg_inf;
      for (size_t t = 0; t < n; ++t) {
        if (pos[t] > qp) s[t] = neg_inf;
        mx = std::max(mx, s[t]);
      }
      sums[r] = 0.0f;
      if (mx == neg_inf) continue;  // sees no token: zeros
      for (size_t t = 0; t < n; ++t) s[t] -= mx;
      fast::exp_f32(s, n, s);  // -inf -> 0
      double z = 0;
      for (size_t t = 0; t < n; ++t) z += s[t];
      sums[r] = float(z);
      float* w = weights + r * n_entries;
      for (size_t t = 0; t < n; ++t) w[index[t]] += s[t] * magnitude[t];
    }
    // Eq. 14 once per entry: out_r = sum_e W[r][e] C[e] / sum_r, entries converted in chunks.
    for (size_t e0 = 0; e0 < n_entries; e0 += kSpindleAttendChunk) {
      const size_t ec = std::min(kSpindleAttendChunk, n_entries - e0);
      f16_to_f32_array(values.entry_data().data() + e0 * dim, chunk, ec * dim);  // exact
      for (size_t r = 0; r < rows; ++r) {
        const float* w = weights + r * n_entries + e0;
        float* o = out + (r0 + r) * dim;
        for (size_t e = 0; e < ec; ++e) {
          if (w[e] != 0.0f) add_scaled(o, chunk + e * dim, w[e], dim);
        }
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      if (!(sums[r] > 0.0f)) continue;
      const float inv = 1.0f / sums[r];
      float* o = out + (r0 + r) * dim;
      for (size_t d = 0; d < dim; ++d) o[d] *= inv;
    }
  }
}

}  // namespace kvsdk::cpu
