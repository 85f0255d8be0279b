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

}  // namespace kvsdk::cpu
