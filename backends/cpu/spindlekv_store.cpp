#include "spindlekv_store.h"

#include <algorithm>

#include "util/error.h"

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
  }
  positions_.insert(positions_.end(), positions, positions + n);
}

void SpindleHeadStore::read_rows(size_t first, size_t count, float* k, float* v) const {
  keys_.reconstruct(first, count, k);
  rope_.apply_rows(k, positions_.data() + first, count);
  values_.reconstruct(first, count, v);
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
  return s;
}

SpindleBytes SpindleHeadStore::bytes() const {
  return {keys_.bytes(), values_.bytes(), sizeof(int32_t) * uint64_t(positions_.size())};
}

void spindlekv_attend(const SpindleHeadStore& store, OnlineAttention& attn) {
  std::vector<float> k, v;
  spindlekv_attend(store, attn, k, v);
}

}  // namespace kvsdk::cpu
