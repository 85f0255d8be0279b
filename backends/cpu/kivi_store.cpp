#include "kivi_store.h"

#include <algorithm>
#include <vector>

#include "kivi_quant.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half_array.h"
#include "util/half.h"

namespace kvsdk::cpu {

namespace {

// The rows of a block being flushed, in f32: per-thread scratch grown once and reused, so that a
// flush on the decode path allocates nothing.
std::vector<float>& flush_scratch(size_t n) {
  thread_local std::vector<float> rows;
  if (rows.size() < n) rows.resize(n);
  return rows;
}

}  // namespace

KiviHeadStore::KiviHeadStore(size_t head_dim, const KiviConfig& config)
    : dim_(head_dim), cfg_(config) {
  KVSDK_REQUIRE(kivi_bits_supported(cfg_.bits), "KIVI bits is ", cfg_.bits,
                " (supported: 1, 2, 4, 8)");
  KVSDK_REQUIRE(cfg_.group > 0, "KIVI group size must be > 0");
  KVSDK_REQUIRE(cfg_.weight_bits == 7 || cfg_.weight_bits == 14, "KIVI weight_bits is ",
                cfg_.weight_bits, " (supported: 7, 14)");
  KVSDK_REQUIRE(head_dim > 0, "head_dim must be > 0");
  row_bytes_ = kivi_packed_bytes(dim_, cfg_.bits);
  v_groups_ = kivi_value_groups(dim_, cfg_.group);
}

void KiviHeadStore::append(const float* k, const float* v, const int32_t* positions, size_t n) {
  reserve(n);  // (a no-op when the caller reserved already)
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

bool KiviHeadStore::can_remove_from(int32_t position) const {
  const size_t first_free = n_quant_ == 0 ? 0 : n_quant_ + size_t(cfg_.residual);
  for (size_t t = 0; t < std::min(first_free, size()); ++t) {
    if (positions_[t] >= position) return false;
  }
  return true;
}

size_t KiviHeadStore::remove_from(int32_t position) noexcept {
  size_t j = n_quant_;
  for (size_t t = n_quant_; t < size(); ++t) {
    if (positions_[t] >= position) continue;
    if (j != t) {
      positions_[j] = positions_[t];
      const size_t from = (t - n_quant_) * dim_, to = (j - n_quant_) * dim_;
      std::copy_n(res_k_.data() + from, dim_, res_k_.data() + to);
      std::copy_n(res_v_.data() + from, dim_, res_v_.data() + to);
    }
    ++j;
  }
  const size_t removed = size() - j;
  positions_.resize(j);
  res_k_.resize((j - n_quant_) * dim_);
  res_v_.resize((j - n_quant_) * dim_);
  return removed;
}

void KiviHeadStore::flush_block() {
  const size_t G = cfg_.group;
  std::vector<float>& rows = flush_scratch(2 * G * dim_);  // (reserve() grew it)
  float* k = rows.data();
  float* v = rows.data() + G * dim_;
  for (size_t i = 0; i < G * dim_; ++i) {
    k[i] = f16_to_f32(res_k_[i]);
    v[i] = f16_to_f32(res_v_[i]);
  }
  k_codes_.resize((n_quant_ + G) * row_bytes_);
  v_codes_.resize((n_quant_ + G) * row_bytes_);
  const size_t block = blocks();
  k_scale_.resize((block + 1) * dim_);
  k_zero_.resize((block + 1) * dim_);
  v_scale_.resize((n_quant_ + G) * v_groups_);
  v_zero_.resize((n_quant_ + G) * v_groups_);
  kivi_quantize_keys(k, G, dim_, cfg_.bits, k_codes_.data() + n_quant_ * row_bytes_,
                     k_scale_.data() + block * dim_, k_zero_.data() + block * dim_);
  kivi_quantize_values(v, G, dim_, G, cfg_.bits, v_codes_.data() + n_quant_ * row_bytes_,
                       v_scale_.data() + n_quant_ * v_groups_,
                       v_zero_.data() + n_quant_ * v_groups_);
  res_k_.erase(res_k_.begin(), res_k_.begin() + G * dim_);
  res_v_.erase(res_v_.begin(), res_v_.begin() + G * dim_);
  if (!block_tokens_.empty()) block_tokens_.push_back(uint32_t(G));
  n_quant_ += G;
}

void KiviHeadStore::read_rows(size_t first, size_t count, float* k, float* v) const {
  const size_t G = cfg_.group;
  size_t t = first;
  const size_t end = first + count;
  // Find the key block holding token `first` (blocks may be ragged after retain()).
  size_t block = 0, block_first = 0;
  while (block < blocks() && block_first + block_size(block) <= t) block_first += block_size(block++);
  while (t < end && t < n_quant_) {
    // Rows of one key block share the block's per-channel parameters.
    const size_t in_block = block_size(block);
    const size_t n = std::min(end, block_first + in_block) - t;
    if (k) {
      kivi_dequantize_keys(k_codes_.data() + block_first * row_bytes_,
                           k_scale_.data() + block * dim_, k_zero_.data() + block * dim_,
                           t - block_first, n, dim_, cfg_.bits, k + (t - first) * dim_);
    }
    if (v) {
      kivi_dequantize_values(v_codes_.data() + t * row_bytes_, v_scale_.data() + t * v_groups_,
                             v_zero_.data() + t * v_groups_, n, dim_, G, cfg_.bits,
                             v + (t - first) * dim_);
    }
    t += n;
    if (t == block_first + in_block) block_first += in_block, ++block;
  }
  if (t < end) {  // the f16 residual rows, contiguous: converted in bulk (exact)
    const size_t r = (t - n_quant_) * dim_, o = (t - first) * dim_, len = (end - t) * dim_;
    if (k) f16_to_f32_array(res_k_.data() + r, k + o, len);
    if (v) f16_to_f32_array(res_v_.data() + r, v + o, len);
  }
}

std::vector<uint32_t> KiviHeadStore::block_tokens() const {
  if (!block_tokens_.empty()) return block_tokens_;
  return std::vector<uint32_t>(blocks(), uint32_t(cfg_.group));
}

void KiviHeadStore::reserve_as(const KiviHeadStore& o) {
  // A ragged store holds at most one block per token: block counts then never outgrow the token
  // capacity, so the double-buffered plans of an evicting cache stop allocating once their
  // token capacities have settled.
  block_tokens_.reserve(std::max(o.block_tokens_.capacity(),
                                 o.block_tokens_.empty() ? size_t(0) : o.positions_.capacity()));
  positions_.reserve(o.positions_.capacity());
  k_codes_.reserve(o.k_codes_.capacity());
  v_codes_.reserve(o.v_codes_.capacity());
  k_scale_.reserve(o.k_scale_.capacity());
  k_zero_.reserve(o.k_zero_.capacity());
  v_scale_.reserve(o.v_scale_.capacity());
  v_zero_.reserve(o.v_zero_.capacity());
  res_k_.reserve(o.res_k_.capacity());
  res_v_.reserve(o.res_v_.capacity());
}

void KiviHeadStore::retain(const std::vector<uint32_t>& keep) {
  retain(keep.data(), keep.size());
}

void KiviHeadStore::retain(const uint32_t* keep, size_t n_keep) {
  for (size_t i = 0; i < n_keep; ++i) {
    KVSDK_REQUIRE(keep[i] < size() && (i == 0 || keep[i] > keep[i - 1]), "retain: index ",
                  keep[i], " at ", i, " is out of range or not ascending (", size(), " tokens)");
  }
  const size_t n_blocks = blocks();
  // Whether a quantized token is dropped decides if block counts are needed at all.
  size_t kept_quant = 0;
  while (kept_quant < n_keep && keep[kept_quant] < n_quant_) ++kept_quant;
  if (kept_quant == n_quant_ && n_keep == size()) return;  // keeps everything
  if (kept_quant < n_quant_ && block_tokens_.empty()) {
    // Becoming ragged: record the count of every block (the one allocation; nothing changed yet).
    block_tokens_.assign(n_blocks, uint32_t(cfg_.group));
  }
  // Compact quantized rows (codes, value parameters, positions) block by block; drop empty
  // blocks' key parameters. Everything moves forward only, so in-place copies are safe.
  size_t out = 0, out_block = 0, i = 0, block_first = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t in_block = block_size(b);
    size_t kept = 0;
    for (; i < kept_quant && keep[i] < block_first + in_block; ++i, ++out, ++kept) {
      const size_t t = keep[i];
      if (t == out) continue;
      std::copy_n(k_codes_.data() + t * row_bytes_, row_bytes_, k_codes_.data() + out * row_bytes_);
      std::copy_n(v_codes_.data() + t * row_bytes_, row_bytes_, v_codes_.data() + out * row_bytes_);
      std::copy_n(v_scale_.data() + t * v_groups_, v_groups_, v_scale_.data() + out * v_groups_);
      std::copy_n(v_zero_.data() + t * v_groups_, v_groups_, v_zero_.data() + out * v_groups_);
      positions_[out] = positions_[t];
    }
    if (kept > 0) {
      if (out_block != b) {
        std::copy_n(k_scale_.data() + b * dim_, dim_, k_scale_.data() + out_block * dim_);
        std::copy_n(k_zero_.data() + b * dim_, dim_, k_zero_.data() + out_block * dim_);
      }
      if (!block_tokens_.empty()) block_tokens_[out_block] = uint32_t(kept);
      ++out_block;
    }
    block_first += in_block;
  }
  const size_t new_quant = out;
  // Residual rows: exact f16, simply removed.
  size_t r_out = 0;
  for (; i < n_keep; ++i, ++r_out, ++out) {
    const size_t r = keep[i] - n_quant_;
    positions_[out] = positions_[keep[i]];
    if (r == r_out) continue;
    std::copy_n(res_k_.data() + r * dim_, dim_, res_k_.data() + r_out * dim_);
    std::copy_n(res_v_.data() + r * dim_, dim_, res_v_.data() + r_out * dim_);
  }
  n_quant_ = new_quant;
  positions_.resize(out);
  k_codes_.resize(new_quant * row_bytes_);
  v_codes_.resize(new_quant * row_bytes_);
  v_scale_.resize(new_quant * v_groups_);
  v_zero_.resize(new_quant * v_groups_);
  k_scale_.resize(out_block * dim_);
  k_zero_.resize(out_block * dim_);
  if (!block_tokens_.empty()) block_tokens_.resize(out_block);
  res_k_.resize(r_out * dim_);
  res_v_.resize(r_out * dim_);
}

KiviBytes KiviHeadStore::bytes() const {
  KiviBytes b;
  b.codes = k_codes_.size() + v_codes_.size();
  b.scales_zeros = 2 * (k_scale_.size() + k_zero_.size() + v_scale_.size() + v_zero_.size()) +
                   sizeof(uint32_t) * block_tokens_.size();
  b.residual = 2 * (res_k_.size() + res_v_.size());
  b.positions = sizeof(int32_t) * positions_.size();
  return b;
}


void KiviHeadStore::reserve(size_t n_more) {
  const size_t G = cfg_.group;
  size_t res = residual_tokens() + n_more, nq = n_quant_, nb = blocks();
  const size_t peak_res = res;  // append() converts every row before it flushes
  if (res >= size_t(cfg_.residual) + G) {
    const size_t flushes = (res - size_t(cfg_.residual)) / G;
    nq += flushes * G;
    nb += flushes;
    flush_scratch(2 * G * dim_);
  }
  if (positions_.capacity() < size() + n_more) {
    // Every buffer grows at once, for the same number of tokens, so that the rare appends that
    // allocate are the same ones for all of them (and for every head of a layer).
    const size_t t = grown_capacity(positions_.capacity(), size() + n_more);
    positions_.reserve(t);
    res_k_.reserve(std::max(res_k_.capacity(), (size_t(cfg_.residual) + G + n_more) * dim_));
    res_v_.reserve(std::max(res_v_.capacity(), (size_t(cfg_.residual) + G + n_more) * dim_));
    k_codes_.reserve(t * row_bytes_);
    v_codes_.reserve(t * row_bytes_);
    k_scale_.reserve((t / G + 1) * dim_);
    k_zero_.reserve((t / G + 1) * dim_);
    v_scale_.reserve(t * v_groups_);
    v_zero_.reserve(t * v_groups_);
  }
  // What the append needs exactly (ragged stores hold more blocks than t / G).
  reserve_for_growth(positions_, size() + n_more);
  reserve_for_growth(res_k_, peak_res * dim_);
  reserve_for_growth(res_v_, peak_res * dim_);
  reserve_for_growth(k_codes_, nq * row_bytes_);
  reserve_for_growth(v_codes_, nq * row_bytes_);
  reserve_for_growth(k_scale_, nb * dim_);
  reserve_for_growth(k_zero_, nb * dim_);
  reserve_for_growth(v_scale_, nq * v_groups_);
  reserve_for_growth(v_zero_, nq * v_groups_);
  if (!block_tokens_.empty()) {
    reserve_for_growth(block_tokens_, nb);
    // At most one block per token (see reserve_as): grows with the token capacity, not with
    // every new maximum of the block count.
    if (block_tokens_.capacity() < positions_.capacity()) block_tokens_.reserve(positions_.capacity());
  }
}

size_t KiviHeadStore::flushed_tokens(const KiviConfig& config, size_t n_residual, size_t n_more) {
  const size_t G = config.group, res = n_residual + n_more;
  if (res < size_t(config.residual) + G) return 0;
  return (res - size_t(config.residual)) / G * G;
}

KiviBytes KiviHeadStore::bytes_for(size_t dim, const KiviConfig& config, size_t n_quant,
                                   size_t n_blocks, size_t n_residual, bool ragged) {
  const uint64_t row = kivi_packed_bytes(dim, config.bits);
  const uint64_t groups = kivi_value_groups(dim, config.group);
  KiviBytes b;
  b.codes = 2 * uint64_t(n_quant) * row;
  b.scales_zeros = 2 * (2 * uint64_t(n_blocks) * dim + 2 * uint64_t(n_quant) * groups) +
                   (ragged ? sizeof(uint32_t) * uint64_t(n_blocks) : 0);
  b.residual = 2 * 2 * uint64_t(n_residual) * dim;
  b.positions = sizeof(int32_t) * uint64_t(n_quant + n_residual);
  return b;
}

KiviBytes KiviHeadStore::projected_bytes(size_t n_more) const {
  const size_t flushed = flushed_tokens(cfg_, residual_tokens(), n_more);
  return bytes_for(dim_, cfg_, n_quant_ + flushed, blocks() + flushed / cfg_.group,
                   residual_tokens() + n_more - flushed, ragged());
}

KiviHeadBuffers KiviHeadStore::buffers() const {
  return {n_quant_, block_tokens_, positions_, k_codes_, v_codes_, k_scale_, k_zero_,
          v_scale_, v_zero_, res_k_, res_v_};
}

KiviHeadStore KiviHeadStore::restore(size_t head_dim, const KiviConfig& config, KiviHeadBuffers b) {
  KiviHeadStore s(head_dim, config);
  const size_t nq = b.quantized_tokens, n = b.positions.size(), G = config.group;
  const auto check = [](bool ok, const char* what) {
    if (!ok) fail(KVSDK_E_CORRUPT, "KIVI head buffers: ", what, " do not match the geometry");
  };
  check(nq <= n, "quantized token count");
  // Block counts: none (every block holds G), or one per block, each 1..G, summing to nq.
  size_t nb = nq / G;
  if (b.block_tokens.empty()) {
    check(nq % G == 0, "quantized token count");
  } else {
    uint64_t sum = 0;
    for (uint32_t c : b.block_tokens) {
      check(c >= 1 && c <= G, "block token counts");
      sum += c;
    }
    check(sum == nq, "block token counts");
    nb = b.block_tokens.size();
  }
  const size_t nr = n - nq;
  // A saved store holds fewer than R + G residual rows (more would have been flushed); retain()
  // may leave fewer than R.
  check(nr < size_t(config.residual) + G, "residual length");
  check(b.key_codes.size() == nq * s.row_bytes_ && b.value_codes.size() == nq * s.row_bytes_,
        "code buffers");
  check(b.key_scales.size() == nb * head_dim && b.key_zeros.size() == nb * head_dim,
        "key scales/zeros");
  check(b.value_scales.size() == nq * s.v_groups_ && b.value_zeros.size() == nq * s.v_groups_,
        "value scales/zeros");
  check(b.residual_keys.size() == nr * head_dim && b.residual_values.size() == nr * head_dim,
        "residual rows");
  s.n_quant_ = nq;
  s.block_tokens_ = std::move(b.block_tokens);
  s.positions_ = std::move(b.positions);
  s.k_codes_ = std::move(b.key_codes);
  s.v_codes_ = std::move(b.value_codes);
  s.k_scale_ = std::move(b.key_scales);
  s.k_zero_ = std::move(b.key_zeros);
  s.v_scale_ = std::move(b.value_scales);
  s.v_zero_ = std::move(b.value_zeros);
  s.res_k_ = std::move(b.residual_keys);
  s.res_v_ = std::move(b.residual_values);
  return s;
}

double KiviHeadStore::bytes_per_quantized_token(size_t head_dim, const KiviConfig& c) {
  const double codes = 2.0 * double(kivi_packed_bytes(head_dim, c.bits));
  const double key_params = 2.0 * 2.0 * double(head_dim) / double(c.group);
  const double value_params = 2.0 * 2.0 * double(kivi_value_groups(head_dim, c.group));
  return codes + key_params + value_params + sizeof(int32_t);
}

}  // namespace kvsdk::cpu
