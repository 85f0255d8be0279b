#include "minicache_merge.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "portable_math.h"
#include "target_clones.h"
#include "util/error.h"
#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

namespace {

constexpr double kPi = 3.14159265358979323846;

double norm_d(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return std::sqrt(s);
}

// cos Ω of the two directions, clamped into arccos' domain.
double cos_omega(const float* a, const float* b, size_t dim, double na, double nb) {
  double d = 0;
  for (size_t i = 0; i < dim; ++i) d += double(a[i]) * double(b[i]);
  return std::min(1.0, std::max(-1.0, d / (na * nb)));
}

}  // namespace

float minicache_angular_distance(const float* a, const float* b, size_t dim) {
  const double na = norm_d(a, dim), nb = norm_d(b, dim);
  if (!(na > 0.0) || !(nb > 0.0) || !std::isfinite(na) || !std::isfinite(nb)) return 1.0f;
  const double d = pmath::acos(cos_omega(a, b, dim, na, nb)) / kPi;
  return d == d ? float(d) : 1.0f;  // NaN/inf rows: treat as unrelated (kept unmerged)
}

void minicache_slerp(const float* a, const float* b, size_t dim, float t, float* out) {
  const double na = norm_d(a, dim), nb = norm_d(b, dim);
  // acos and sin from portable_math.h, not libm: the merged directions and the retention
  // threshold are stored state, and must have the same bits on every platform.
  const double omega = pmath::acos(cos_omega(a, b, dim, na, nb));
  const double s = pmath::sin(omega);
  double wa, wb;
  if (s < 1e-6) {  // (anti)parallel directions: SLERP's weights are 0/0, interpolate linearly
    wa = 1.0 - t;
    wb = t;
  } else {
    wa = pmath::sin((1.0 - t) * omega) / s;
    wb = pmath::sin(t * omega) / s;
  }
  for (size_t i = 0; i < dim; ++i) out[i] = float(wa * a[i] / na + wb * b[i] / nb);
}

size_t minicache_kept_tokens(const std::vector<int32_t>& positions, int32_t position) {
  size_t k = positions.size();
  while (k > 0 && positions[k - 1] >= position) --k;
  for (size_t i = 0; i < k; ++i) {
    if (positions[i] >= position) return SIZE_MAX;
  }
  return k;
}

MergedLayerPair::MergedLayerPair(size_t dim, const MiniCacheConfig& config)
    : dim_(dim), cfg_(config) {
  KVSDK_REQUIRE(dim > 0, "MiniCache dim must be > 0");
  KVSDK_REQUIRE(cfg_.t >= 0.0f && cfg_.t <= 1.0f, "MiniCache t ", cfg_.t, " must lie in [0, 1]");
  KVSDK_REQUIRE(cfg_.gamma >= 0.0f && cfg_.gamma <= 1.0f, "MiniCache gamma ", cfg_.gamma,
                " must lie in [0, 1]");
}

void MergedLayerPair::push_retained(const float* a, const float* b) {
  reserve_for_growth(retained_prev_, retained_prev_.size() + dim_);
  reserve_for_growth(retained_cur_, retained_cur_.size() + dim_);
  slot_.push_back(kRetainedBit | uint32_t(retained()));
  for (size_t i = 0; i < dim_; ++i) {
    retained_prev_.push_back(f32_to_f16(a[i]));
    retained_cur_.push_back(f32_to_f16(b[i]));
  }
}

void MergedLayerPair::push_merged(const float* a, const float* b, std::vector<float>& e) {
  at_least(e, dim_);
  minicache_slerp(a, b, dim_, cfg_.t, e.data());
  double en = 0;
  const size_t base = direction_.size();
  reserve_for_growth(direction_, base + dim_);
  direction_.resize(base + dim_);
  for (size_t i = 0; i < dim_; ++i) {
    direction_[base + i] = f32_to_f16(e[i]);
    const double r = f16_to_f32(direction_[base + i]);
    en += r * r;
  }
  en = std::sqrt(en);
  slot_.push_back(uint32_t(merged()));
  // ||x|| / ||e_f16||: the restored row keeps the layer's norm even though e was rounded.
  mag_prev_.push_back(en > 0 ? float(norm_d(a, dim_) / en) : 0.0f);
  mag_cur_.push_back(en > 0 ? float(norm_d(b, dim_) / en) : 0.0f);
}

void MergedLayerPair::append(const float* rows_prev, const float* rows_cur, size_t n) {
  MiniCacheScratch scratch;
  append(rows_prev, rows_cur, n, scratch);
}

void MergedLayerPair::append(const float* rows_prev, const float* rows_cur, size_t n,
                             MiniCacheScratch& scratch) {
  if (n == 0) return;
  if (slot_.capacity() < size() + n) {
    // Every buffer grows when the tokens do, by the same schedule (growth.h), with room for
    // the new tokens whichever kind they become: every pair of a cache then grows at the same
    // appends, not whenever its merged or retained count happens to cross a capacity.
    const size_t cap = grown_capacity(slot_.capacity(), size() + n), more = cap - size();
    slot_.reserve(cap);
    mag_prev_.reserve(std::max(mag_prev_.capacity(), mag_prev_.size() + more));
    mag_cur_.reserve(std::max(mag_cur_.capacity(), mag_cur_.size() + more));
    direction_.reserve(std::max(direction_.capacity(), direction_.size() + more * dim_));
    retained_prev_.reserve(std::max(retained_prev_.capacity(), retained_prev_.size() + more * dim_));
    retained_cur_.reserve(std::max(retained_cur_.capacity(), retained_cur_.size() + more * dim_));
  }
  std::vector<float>& dist = at_least(scratch.dist, n);
  for (size_t i = 0; i < n; ++i) {
    dist[i] = minicache_angular_distance(rows_prev + i * dim_, rows_cur + i * dim_, dim_);
  }
  std::vector<char>& keep = at_least(scratch.keep, n);
  std::fill(keep.begin(), keep.begin() + n, char(0));
  if (!threshold_set_) {
    // Prefill: the ceil(γ·n) most distant tokens (ties: earlier token first) stay unmerged.
    // (The small subtraction keeps f32's 0.05 = 0.0500000007 from turning 15.0 into 16.)
    const size_t n_keep =
        std::min(n, size_t(std::ceil(double(cfg_.gamma) * double(n) - 1e-6)));
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return dist[x] > dist[y]; });
    for (size_t i = 0; i < n_keep; ++i) keep[order[i]] = 1;
    threshold_ = n_keep > 0 ? dist[order[n_keep - 1]] : 2.0f;  // 2 > any distance: none kept
    threshold_set_ = true;
    threshold_tokens_ = size() + n;  // (size() is 0: the pair was empty)
  } else {
    for (size_t i = 0; i < n; ++i) keep[i] = dist[i] >= threshold_;
  }
  for (size_t i = 0; i < n; ++i) {
    const float* a = rows_prev + i * dim_;
    const float* b = rows_cur + i * dim_;
    // A zero row has no direction to share (distance 1); it can only be kept as is.
    if (keep[i] || dist[i] >= 1.0f) {
      push_retained(a, b);
    } else {
      push_merged(a, b, scratch.e);
    }
  }
}

KVSDK_TARGET_CLONES  // elementwise: the same bits in every clone (target_clones.h)
void MergedLayerPair::reconstruct(int layer, size_t first, size_t count, float* out) const {
  for (size_t t = 0; t < count; ++t) {
    const uint32_t s = slot_[first + t];
    float* o = out + t * dim_;
    if (s & kRetainedBit) {
      const std::vector<uint16_t>& src = layer == 0 ? retained_prev_ : retained_cur_;
      f16_to_f32_array(&src[size_t(s & ~kRetainedBit) * dim_], o, dim_);  // exact
    } else {
      const float m = layer == 0 ? mag_prev_[s] : mag_cur_[s];
      f16_to_f32_array(&direction_[size_t(s) * dim_], o, dim_);  // exact: f16_to_f32(e) * m
      for (size_t i = 0; i < dim_; ++i) o[i] *= m;
    }
  }
}

void MergedLayerPair::truncate(size_t tokens) noexcept {
  if (tokens >= size()) return;
  // Slots number merged and retained tokens in order within each kind: the dropped tokens are
  // the newest of their kind.
  size_t merged = this->merged(), retained = this->retained();
  for (size_t t = tokens; t < size(); ++t) {
    if (slot_[t] & kRetainedBit) {
      --retained;
    } else {
      --merged;
    }
  }
  slot_.resize(tokens);  // shrinking: no allocation
  direction_.resize(merged * dim_);
  mag_prev_.resize(merged);
  mag_cur_.resize(merged);
  retained_prev_.resize(retained * dim_);
  retained_cur_.resize(retained * dim_);
  if (tokens == 0) {  // the fresh pair: the next append fixes the threshold again
    threshold_set_ = false;
    threshold_ = 2.0f;
    threshold_tokens_ = 0;
  }
}

void MergedLayerPair::reset(bool threshold_set, float threshold) noexcept {
  truncate(0);  // (clears every buffer, capacity kept)
  threshold_set_ = threshold_set;
  threshold_ = threshold;
  threshold_tokens_ = 0;
}

const char* MiniCacheHeadPair::removal_refusal(int32_t position) const {
  const size_t k = minicache_kept_tokens(positions, position);
  if (k == SIZE_MAX) return "it holds tokens from that position before older ones";
  if (!keys.can_truncate(k) || !values.can_truncate(k)) {
    return kMiniCacheFirstMergeRefusal;
  }
  return nullptr;
}

void MiniCacheHeadPair::remove_from(int32_t position) noexcept {
  const size_t k = minicache_kept_tokens(positions, position);
  if (k >= positions.size()) return;  // nothing goes (or refused: not called then)
  keys.truncate(k);
  values.truncate(k);
  positions.resize(k);
}

MergedLayerPair::Buffers MergedLayerPair::buffers() const {
  return {threshold_set_, threshold_, slot_, direction_, mag_prev_, mag_cur_, retained_prev_,
          retained_cur_};
}

MergedLayerPair MergedLayerPair::restore(size_t dim, const MiniCacheConfig& config, Buffers b) {
  MergedLayerPair p(dim, config);
  const size_t merged = b.magnitudes_prev.size(), retained = b.retained_prev.size() / dim;
  bool ok = b.magnitudes_cur.size() == merged && b.directions.size() == merged * dim &&
            b.retained_prev.size() % dim == 0 && b.retained_cur.size() == b.retained_prev.size() &&
            b.slots.size() == merged + retained;
  // Slots must number merged and retained tokens in order: 0, 1, 2... within each kind.
  size_t next_m = 0, next_r = 0;
  for (size_t i = 0; ok && i < b.slots.size(); ++i) {
    const uint32_t s = b.slots[i];
    ok = (s & kRetainedBit) ? (s & ~kRetainedBit) == next_r++ : s == next_m++;
  }
  if (!ok) fail(KVSDK_E_CORRUPT, "MiniCache buffers are inconsistent (head_dim ", dim, ")");
  p.threshold_set_ = b.threshold_set;
  p.threshold_ = b.threshold;
  // How many tokens the first append held is not recorded: every restored token counts.
  p.threshold_tokens_ = b.threshold_set ? b.slots.size() : 0;
  p.slot_ = std::move(b.slots);
  p.direction_ = std::move(b.directions);
  p.mag_prev_ = std::move(b.magnitudes_prev);
  p.mag_cur_ = std::move(b.magnitudes_cur);
  p.retained_prev_ = std::move(b.retained_prev);
  p.retained_cur_ = std::move(b.retained_cur);
  return p;
}

uint64_t MergedLayerPair::bytes() const {
  return 4 * uint64_t(slot_.size()) + 2 * uint64_t(direction_.size()) +
         4 * uint64_t(mag_prev_.size() + mag_cur_.size()) +
         2 * uint64_t(retained_prev_.size() + retained_cur_.size()) +
         sizeof(threshold_);  // the retention threshold is state too
}

void minicache_attend(const MiniCacheHeadPair& pair, int layer, OnlineAttention& attn) {
  std::vector<float> k, v;
  minicache_attend(pair, layer, attn, k, v);
}

}  // namespace kvsdk::cpu
