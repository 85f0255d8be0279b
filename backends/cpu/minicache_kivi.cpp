#include "minicache_kivi.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.h"
#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

namespace {

float norm(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return float(std::sqrt(s));
}

void push_f16(std::vector<uint16_t>& dst, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) dst.push_back(f32_to_f16(x[i]));
}

// out = m · e / ||e|| (zero when either is zero).
void restore_row(const float* e, float m, size_t dim, float* out) {
  const float en = norm(e, dim);
  const float s = en > 0.0f ? m / en : 0.0f;
  for (size_t i = 0; i < dim; ++i) out[i] = e[i] * s;
}

}  // namespace

MiniCacheKiviPair::MiniCacheKiviPair(size_t dim, const MiniCacheConfig& merge,
                                     const KiviConfig& quant)
    : dim_(dim), cfg_(merge), directions_(dim, quant) {
  MergedLayerPair validate(dim, merge);  // same argument checks as the f16 pair
  (void)validate;
}

void MiniCacheKiviPair::append(const float* k_prev, const float* v_prev, const float* k_cur,
                               const float* v_cur, const int32_t* positions, size_t n) {
  MiniCacheScratch scratch;
  append(k_prev, v_prev, k_cur, v_cur, positions, n, scratch);
}

void MiniCacheKiviPair::append(const float* k_prev, const float* v_prev, const float* k_cur,
                               const float* v_cur, const int32_t* positions, size_t n,
                               MiniCacheScratch& scratch) {
  if (n == 0) return;
  if (slot_.capacity() < size() + n) {
    // As MergedLayerPair::append: every buffer grows with the tokens, by one schedule.
    const size_t cap = grown_capacity(slot_.capacity(), size() + n), more = cap - size();
    slot_.reserve(cap);
    positions_.reserve(cap);
    for (std::vector<float>* v : {&norm_k_prev_, &norm_k_cur_, &norm_v_prev_, &norm_v_cur_}) {
      v->reserve(std::max(v->capacity(), v->size() + more));
    }
    for (std::vector<uint16_t>* v :
         {&retained_k_prev_, &retained_k_cur_, &retained_v_prev_, &retained_v_cur_}) {
      v->reserve(std::max(v->capacity(), v->size() + more * dim_));
    }
    directions_.reserve(more);
  }
  std::vector<float>& dist = at_least(scratch.dist, n);
  for (size_t i = 0; i < n; ++i) {
    dist[i] = std::max(minicache_angular_distance(k_prev + i * dim_, k_cur + i * dim_, dim_),
                       minicache_angular_distance(v_prev + i * dim_, v_cur + i * dim_, dim_));
  }
  std::vector<char>& keep = at_least(scratch.keep, n);
  std::fill(keep.begin(), keep.begin() + n, char(0));
  if (!threshold_set_) {
    const size_t n_keep =
        std::min(n, size_t(std::ceil(double(cfg_.gamma) * double(n) - 1e-6)));
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return dist[x] > dist[y]; });
    for (size_t i = 0; i < n_keep; ++i) keep[order[i]] = 1;
    threshold_ = n_keep > 0 ? dist[order[n_keep - 1]] : 2.0f;
    threshold_set_ = true;
    threshold_tokens_ = size() + n;  // (size() is 0: the pair was empty)
  } else {
    for (size_t i = 0; i < n; ++i) keep[i] = dist[i] >= threshold_;
  }
  std::vector<float>& ek = scratch.ek;
  std::vector<float>& ev = scratch.ev;
  std::vector<int32_t>& merged_pos = scratch.merged_pos;
  ek.clear();
  ev.clear();
  merged_pos.clear();
  for (size_t i = 0; i < n; ++i) {
    const size_t o = i * dim_;
    if (keep[i] || dist[i] >= 1.0f) {
      slot_.push_back(kRetainedBit | uint32_t(retained()));
      push_f16(retained_k_prev_, k_prev + o, dim_);
      push_f16(retained_k_cur_, k_cur + o, dim_);
      push_f16(retained_v_prev_, v_prev + o, dim_);
      push_f16(retained_v_cur_, v_cur + o, dim_);
      continue;
    }
    slot_.push_back(uint32_t(norm_k_prev_.size()));
    const size_t base = ek.size();
    ek.resize(base + dim_);
    ev.resize(base + dim_);
    minicache_slerp(k_prev + o, k_cur + o, dim_, cfg_.t, &ek[base]);
    minicache_slerp(v_prev + o, v_cur + o, dim_, cfg_.t, &ev[base]);
    norm_k_prev_.push_back(norm(k_prev + o, dim_));
    norm_k_cur_.push_back(norm(k_cur + o, dim_));
    norm_v_prev_.push_back(norm(v_prev + o, dim_));
    norm_v_cur_.push_back(norm(v_cur + o, dim_));
    merged_pos.push_back(positions[i]);
  }
  directions_.append(ek.data(), ev.data(), merged_pos.data(), merged_pos.size());
  positions_.insert(positions_.end(), positions, positions + n);
}

void MiniCacheKiviPair::read_rows(int layer, size_t first, size_t count, float* k,
                                  float* v) const {
  MiniCacheScratch scratch;
  read_rows(layer, first, count, k, v, scratch);
}

void MiniCacheKiviPair::read_rows(int layer, size_t first, size_t count, float* k, float* v,
                                  MiniCacheScratch& scratch) const {
  // Merged tokens of a token range have consecutive merged indices: one KIVI read covers them.
  size_t m_begin = SIZE_MAX, m_end = 0;
  for (size_t t = first; t < first + count; ++t) {
    if (is_retained(t)) continue;
    m_begin = std::min<size_t>(m_begin, slot_[t]);
    m_end = std::max<size_t>(m_end, size_t(slot_[t]) + 1);
  }
  std::vector<float>& ek = scratch.ek;
  std::vector<float>& ev = scratch.ev;
  if (m_end > 0) {
    at_least(ek, (m_end - m_begin) * dim_);
    at_least(ev, (m_end - m_begin) * dim_);
    directions_.read_rows(m_begin, m_end - m_begin, ek.data(), ev.data());
  }
  for (size_t i = 0; i < count; ++i) {
    const uint32_t s = slot_[first + i];
    float* ko = k + i * dim_;
    float* vo = v + i * dim_;
    if (s & kRetainedBit) {
      const size_t r = size_t(s & ~kRetainedBit) * dim_;
      const std::vector<uint16_t>& rk = layer == 0 ? retained_k_prev_ : retained_k_cur_;
      const std::vector<uint16_t>& rv = layer == 0 ? retained_v_prev_ : retained_v_cur_;
      f16_to_f32_array(&rk[r], ko, dim_);  // exact
      f16_to_f32_array(&rv[r], vo, dim_);
    } else {
      const size_t m = s, o = (m - m_begin) * dim_;
      restore_row(&ek[o], layer == 0 ? norm_k_prev_[m] : norm_k_cur_[m], dim_, ko);
      restore_row(&ev[o], layer == 0 ? norm_v_prev_[m] : norm_v_cur_[m], dim_, vo);
    }
  }
}

const char* MiniCacheKiviPair::removal_refusal(int32_t position) const {
  const size_t k = minicache_kept_tokens(positions_, position);
  if (k == SIZE_MAX) return "it holds tokens from that position before older ones";
  if (k >= size() || k == 0) return nullptr;  // nothing goes, or all: the fresh pair
  if (k < threshold_tokens_) {
    return kMiniCacheFirstMergeRefusal;
  }
  if (!directions_.can_remove_from(position)) {
    return "its KIVI store quantized merged directions from that position (or the flush that "
           "quantized older ones counted them); only directions appended since the last flush "
           "can go";
  }
  return nullptr;
}

void MiniCacheKiviPair::remove_from(int32_t position) noexcept {
  const size_t k = minicache_kept_tokens(positions_, position);
  if (k >= size()) return;  // nothing goes (or refused: not called then)
  size_t merged = norm_k_prev_.size(), retained = this->retained();
  for (size_t t = k; t < size(); ++t) {
    if (slot_[t] & kRetainedBit) {
      --retained;
    } else {
      --merged;
    }
  }
  if (k == 0) {
    // The fresh pair. The store's constructor only checks a config it already accepted and
    // allocates nothing; the move releases the old buffers.
    directions_ = KiviHeadStore(dim_, directions_.config());
    threshold_set_ = false;
    threshold_ = 2.0f;
    threshold_tokens_ = 0;
  } else {
    directions_.remove_from(position);  // exactly the merged tokens that go
  }
  slot_.resize(k);  // shrinking: no allocation
  positions_.resize(k);
  for (std::vector<float>* v : {&norm_k_prev_, &norm_k_cur_, &norm_v_prev_, &norm_v_cur_}) {
    v->resize(merged);
  }
  for (std::vector<uint16_t>* v :
       {&retained_k_prev_, &retained_k_cur_, &retained_v_prev_, &retained_v_cur_}) {
    v->resize(retained * dim_);
  }
}

MiniCacheKiviPair::Buffers MiniCacheKiviPair::buffers() const {
  return {threshold_set_,   threshold_,       slot_,            positions_,
          directions_.buffers(), norm_k_prev_, norm_k_cur_,     norm_v_prev_,
          norm_v_cur_,      retained_k_prev_, retained_k_cur_,  retained_v_prev_,
          retained_v_cur_};
}

MiniCacheKiviPair MiniCacheKiviPair::restore(size_t dim, const MiniCacheConfig& merge,
                                             const KiviConfig& quant, Buffers b) {
  MiniCacheKiviPair p(dim, merge, quant);
  p.directions_ = KiviHeadStore::restore(dim, quant, std::move(b.directions));  // validates
  const size_t merged = b.norm_k_prev.size();
  const size_t retained = b.retained_k_prev.size() / dim;
  bool ok = b.norm_k_cur.size() == merged && b.norm_v_prev.size() == merged &&
            b.norm_v_cur.size() == merged && p.directions_.size() == merged &&
            b.retained_k_prev.size() % dim == 0 &&
            b.retained_k_cur.size() == b.retained_k_prev.size() &&
            b.retained_v_prev.size() == b.retained_k_prev.size() &&
            b.retained_v_cur.size() == b.retained_k_prev.size() &&
            b.slots.size() == merged + retained && b.positions.size() == b.slots.size();
  // Slots number merged and retained tokens in order within each kind, and a merged token's
  // position is the one its KIVI row carries.
  size_t next_m = 0, next_r = 0;
  for (size_t i = 0; ok && i < b.slots.size(); ++i) {
    const uint32_t s = b.slots[i];
    if (s & kRetainedBit) {
      ok = (s & ~kRetainedBit) == next_r++;
    } else {
      ok = s == next_m && p.directions_.positions()[next_m] == b.positions[i];
      ++next_m;
    }
  }
  if (!ok) fail(KVSDK_E_CORRUPT, "MiniCache+KIVI buffers are inconsistent (head_dim ", dim, ")");
  p.threshold_set_ = b.threshold_set;
  p.threshold_ = b.threshold;
  // How many tokens the first append held is not recorded: every restored token counts.
  p.threshold_tokens_ = b.threshold_set ? b.slots.size() : 0;
  p.slot_ = std::move(b.slots);
  p.positions_ = std::move(b.positions);
  p.norm_k_prev_ = std::move(b.norm_k_prev);
  p.norm_k_cur_ = std::move(b.norm_k_cur);
  p.norm_v_prev_ = std::move(b.norm_v_prev);
  p.norm_v_cur_ = std::move(b.norm_v_cur);
  p.retained_k_prev_ = std::move(b.retained_k_prev);
  p.retained_k_cur_ = std::move(b.retained_k_cur);
  p.retained_v_prev_ = std::move(b.retained_v_prev);
  p.retained_v_cur_ = std::move(b.retained_v_cur);
  return p;
}

MiniCacheKiviBytes MiniCacheKiviPair::bytes() const {
  MiniCacheKiviBytes b;
  b.quantized = directions_.bytes().total() - directions_.bytes().positions;
  b.merged = 4 * uint64_t(norm_k_prev_.size() + norm_k_cur_.size() + norm_v_prev_.size() +
                          norm_v_cur_.size());
  b.retained = 2 * uint64_t(retained_k_prev_.size() + retained_k_cur_.size() +
                            retained_v_prev_.size() + retained_v_cur_.size());
  // Slots, token positions, the KIVI store's own copy of the merged tokens' positions, threshold.
  b.metadata = 4 * uint64_t(slot_.size()) + 4 * uint64_t(positions_.size()) +
               directions_.bytes().positions + sizeof(threshold_);
  return b;
}

void minicache_kivi_attend(const MiniCacheKiviPair& pair, int layer, OnlineAttention& attn) {
  std::vector<float> k, v;
  MiniCacheScratch scratch;
  minicache_kivi_attend(pair, layer, attn, k, v, scratch);
}

}  // namespace kvsdk::cpu
