#include "kivi_store.h"

#include <algorithm>

#include "core/error.h"
#include "core/half.h"
#include "kivi_quant.h"

namespace kvsdk::cpu {

KiviHeadStore::KiviHeadStore(size_t head_dim, const KiviConfig& config)
    : dim_(head_dim), cfg_(config) {
  KVSDK_REQUIRE(kivi_bits_supported(cfg_.bits), "KIVI bits is ", cfg_.bits,
                " (supported: 1, 2, 4, 8)");
  KVSDK_REQUIRE(cfg_.group > 0, "KIVI group size must be > 0");
  KVSDK_REQUIRE(head_dim > 0, "head_dim must be > 0");
  row_bytes_ = kivi_packed_bytes(dim_, cfg_.bits);
  v_groups_ = kivi_value_groups(dim_, cfg_.group);
}

void KiviHeadStore::append(const float* k, const float* v, const int32_t* positions, size_t n) {
  const size_t old = res_k_.size();
  res_k_.resize(old + n * dim_);
  res_v_.resize(old + n * dim_);
  for (size_t i = 0; i < n * dim_; ++i) {
    res_k_[old + i] = f32_to_f16(k[i]);
    res_v_[old + i] = f32_to_f16(v[i]);
  }
  positions_.insert(positions_.end(), positions, positions + n);
  while (residual_tokens() >= size_t(cfg_.residual) + cfg_.group) flush_block();
}

void KiviHeadStore::flush_block() {
  const size_t G = cfg_.group;
  std::vector<float> k(G * dim_), v(G * dim_);
  for (size_t i = 0; i < G * dim_; ++i) {
    k[i] = f16_to_f32(res_k_[i]);
    v[i] = f16_to_f32(res_v_[i]);
  }
  k_codes_.resize((n_quant_ + G) * row_bytes_);
  v_codes_.resize((n_quant_ + G) * row_bytes_);
  const size_t block = n_quant_ / G;
  k_scale_.resize((block + 1) * dim_);
  k_zero_.resize((block + 1) * dim_);
  v_scale_.resize((n_quant_ + G) * v_groups_);
  v_zero_.resize((n_quant_ + G) * v_groups_);
  kivi_quantize_keys(k.data(), G, dim_, cfg_.bits, k_codes_.data() + n_quant_ * row_bytes_,
                     k_scale_.data() + block * dim_, k_zero_.data() + block * dim_);
  kivi_quantize_values(v.data(), G, dim_, G, cfg_.bits, v_codes_.data() + n_quant_ * row_bytes_,
                       v_scale_.data() + n_quant_ * v_groups_,
                       v_zero_.data() + n_quant_ * v_groups_);
  res_k_.erase(res_k_.begin(), res_k_.begin() + G * dim_);
  res_v_.erase(res_v_.begin(), res_v_.begin() + G * dim_);
  n_quant_ += G;
}

void KiviHeadStore::read_rows(size_t first, size_t count, float* k, float* v) const {
  const size_t G = cfg_.group;
  size_t t = first;
  const size_t end = first + count;
  while (t < end && t < n_quant_) {
    // Rows of one key block share the block's per-channel parameters.
    const size_t block = t / G;
    const size_t n = std::min(end, (block + 1) * G) - t;
    float* ko = k + (t - first) * dim_;
    float* vo = v + (t - first) * dim_;
    kivi_dequantize_keys(k_codes_.data() + block * G * row_bytes_, k_scale_.data() + block * dim_,
                         k_zero_.data() + block * dim_, t - block * G, n, dim_, cfg_.bits, ko);
    kivi_dequantize_values(v_codes_.data() + t * row_bytes_, v_scale_.data() + t * v_groups_,
                           v_zero_.data() + t * v_groups_, n, dim_, G, cfg_.bits, vo);
    t += n;
  }
  for (; t < end; ++t) {
    const size_t r = (t - n_quant_) * dim_;
    for (size_t c = 0; c < dim_; ++c) {
      k[(t - first) * dim_ + c] = f16_to_f32(res_k_[r + c]);
      v[(t - first) * dim_ + c] = f16_to_f32(res_v_[r + c]);
    }
  }
}

KiviBytes KiviHeadStore::bytes() const {
  KiviBytes b;
  b.codes = k_codes_.size() + v_codes_.size();
  b.scales_zeros = 2 * (k_scale_.size() + k_zero_.size() + v_scale_.size() + v_zero_.size());
  b.residual = 2 * (res_k_.size() + res_v_.size());
  b.positions = sizeof(int32_t) * positions_.size();
  return b;
}

double KiviHeadStore::bytes_per_quantized_token(size_t head_dim, const KiviConfig& c) {
  const double codes = 2.0 * double(kivi_packed_bytes(head_dim, c.bits));
  const double key_params = 2.0 * 2.0 * double(head_dim) / double(c.group);
  const double value_params = 2.0 * 2.0 * double(kivi_value_groups(head_dim, c.group));
  return codes + key_params + value_params + sizeof(int32_t);
}

}  // namespace kvsdk::cpu
