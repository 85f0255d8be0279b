#include "repr/kivi_repr.h"

#include <algorithm>

#include "attention.h"
#include "core/error.h"
#include "kivi_attention.h"
#include "repr/head_store.h"

namespace kvsdk {

cpu::KiviConfig kivi_config(const kvsdk_policy& p) {
  return cpu::KiviConfig{uint32_t(p.quant_bits), uint32_t(p.quant_group),
                         uint32_t(p.quant_residual)};
}

void kivi_store_to_record(const cpu::KiviHeadStore& s, const std::string& prefix,
                          TierRecord& r) {
  cpu::KiviHeadBuffers b = s.buffers();
  r.set_scalar(prefix + "quantized_tokens", b.quantized_tokens);
  r.add(prefix + "block_tokens").u32 = std::move(b.block_tokens);  // empty unless ragged
  r.add(prefix + "positions").i32 = std::move(b.positions);
  r.add(prefix + "key_codes").u8 = std::move(b.key_codes);
  r.add(prefix + "value_codes").u8 = std::move(b.value_codes);
  r.add(prefix + "key_scales").u16 = std::move(b.key_scales);
  r.add(prefix + "key_zeros").u16 = std::move(b.key_zeros);
  r.add(prefix + "value_scales").u16 = std::move(b.value_scales);
  r.add(prefix + "value_zeros").u16 = std::move(b.value_zeros);
  r.add(prefix + "residual_keys").u16 = std::move(b.residual_keys);
  r.add(prefix + "residual_values").u16 = std::move(b.residual_values);
}

cpu::KiviHeadStore kivi_store_from_record(size_t head_dim, const cpu::KiviConfig& config,
                                          const std::string& prefix, const TierRecord& r) {
  cpu::KiviHeadBuffers b;
  b.quantized_tokens = size_t(r.scalar(prefix + "quantized_tokens"));
  b.block_tokens = r.get(prefix + "block_tokens").u32;
  b.positions = r.get(prefix + "positions").i32;
  b.key_codes = r.get(prefix + "key_codes").u8;
  b.value_codes = r.get(prefix + "value_codes").u8;
  b.key_scales = r.get(prefix + "key_scales").u16;
  b.key_zeros = r.get(prefix + "key_zeros").u16;
  b.value_scales = r.get(prefix + "value_scales").u16;
  b.value_zeros = r.get(prefix + "value_zeros").u16;
  b.residual_keys = r.get(prefix + "residual_keys").u16;
  b.residual_values = r.get(prefix + "residual_values").u16;
  return cpu::KiviHeadStore::restore(head_dim, config, std::move(b));
}

KiviRepresentation::KiviRepresentation(const Geometry& g, const kvsdk_policy& p)
    : Representation(g, p), config_(kivi_config(p)), heads_(g.n_layers) {
  KVSDK_REQUIRE(p.quant_bits != 0, "method 'kivi' needs quant_bits 1, 2, 4 or 8 (got 0)");
  for (auto& layer : heads_) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) layer.emplace_back(g.head_dim, config_);
  }
}

void KiviRepresentation::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (const cpu::KiviHeadStore& h : heads_[layer]) {
    const cpu::KiviBytes b = h.bytes();
    by_tier[KVSDK_TIER_QUANTIZED] += b.codes + b.scales_zeros;
    by_tier[KVSDK_TIER_EXACT] += b.residual;  // the f16 residual window is exact
    by_tier[KVSDK_TIER_METADATA] += b.positions;
  }
}

uint64_t KiviRepresentation::append_bound(uint32_t layer, size_t n_tokens) const {
  // Exact: a store knows its bytes after an append, flushes included.
  uint64_t before = 0, after = 0;
  for (const cpu::KiviHeadStore& h : heads_[layer]) {
    before += h.bytes().total();
    after += h.projected_bytes(n_tokens).total();
  }
  return after > before ? after - before : 0;
}

void KiviRepresentation::append(uint32_t layer, size_t n, const float* k, const float* v,
                                const int32_t* positions) {
  const size_t dim = geometry_.head_dim;
  std::vector<float> kf(n * dim), vf(n * dim);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    head_rows(k, v, n, h, kf.data(), vf.data());
    heads_[layer][h].append(kf.data(), vf.data(), positions, n);
  }
}

void KiviRepresentation::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                const int32_t* row_positions, size_t n_rows, float* out) const {
  // Dequantized chunk by chunk.
  attend_head_store(heads_[layer][kv_head], cpu::kivi_attend, geometry_, q_rows, row_positions,
                    n_rows, out);
}

size_t KiviRepresentation::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].size();
}

void KiviRepresentation::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                              int32_t* positions) const {
  read_head_store(heads_[layer][kv_head], geometry_.head_dim, k, v, positions);
}

std::vector<TierRecord> KiviRepresentation::save(uint32_t layer) const {
  std::vector<TierRecord> out(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    out[h].layer = layer;
    out[h].kv_head = h;
    out[h].kind = "kivi.head";
    kivi_store_to_record(heads_[layer][h], "", out[h]);
  }
  return out;
}

void KiviRepresentation::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  if (records.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " KIVI head records, expected ", geometry_.n_kv_heads);
  }
  std::vector<cpu::KiviHeadStore> heads;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const TierRecord& r = records[h];
    if (r.kind != "kivi.head" || r.kv_head != h) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", h, " is '", r.kind,
           "' for KV head ", r.kv_head, ", expected 'kivi.head' for KV head ", h);
    }
    heads.push_back(kivi_store_from_record(geometry_.head_dim, config_, "", r));
  }
  heads_[layer] = std::move(heads);
}

}  // namespace kvsdk
