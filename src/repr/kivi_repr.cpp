#include "repr/kivi_repr.h"

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "core/policy.h"
#include "kivi_attention.h"
#include "repr/head_store.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

cpu::KiviConfig kivi_config(const kvsdk_policy& p) {
  if (p.quant_residual < 0) {  // KVSDK_QUANT_RESIDUAL_AUTO is resolved by the cache (policy.h)
    fail(KVSDK_E_INTERNAL, "KIVI store built from an unresolved quant_residual ",
         p.quant_residual);
  }
  // (The cache resolves kivi_weight_bits when it is created; stores built on their own, as in
  // tests and tools, get the same rule here. 14 where there are no codes to attend.)
  const int32_t resolved = resolve_auto_weight_bits(p).kivi_weight_bits;
  const int32_t weight_bits = resolved != 0 ? resolved : kLegacyKiviWeightBits;
  return cpu::KiviConfig{uint32_t(p.quant_bits), uint32_t(p.quant_group),
                         uint32_t(p.quant_residual), uint32_t(weight_bits)};
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
    : Representation(g, p),
      config_(kivi_config(p)),
      heads_(g.n_layers),
      planned_(g.n_layers),
      planned_active_(g.n_layers, 0) {
  KVSDK_REQUIRE(p.quant_bits != 0, "KIVI stores need quant_bits 1, 2, 4 or 8 (got 0)");
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
  // One head's rows at a time, in reused scratch.
  std::vector<float>& kf = at_least(scratch_.k_chunk, n * dim);
  std::vector<float>& vf = at_least(scratch_.v_chunk, n * dim);
  // Room in every head first: the appends below then allocate nothing and cannot fail half-way.
  for (cpu::KiviHeadStore& s : heads_[layer]) s.reserve(n);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    head_rows(k, v, n, h, kf.data(), vf.data());
    heads_[layer][h].append(kf.data(), vf.data(), positions, n);
  }
}

void KiviRepresentation::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                const int32_t* row_positions, size_t n_rows, float* out) const {
  ops().attend_kivi(query_rows(q_rows, row_positions, n_rows), heads_[layer][kv_head],
                    workspace(), out);
}

void KiviRepresentation::attend_range(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                      const int32_t* row_positions, size_t n_rows, size_t first,
                                      size_t count, const backend::PartialState& out) const {
  ops().attend_kivi_range(query_rows(q_rows, row_positions, n_rows), heads_[layer][kv_head],
                          first, count, workspace(), out);
}

size_t KiviRepresentation::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].size();
}

void KiviRepresentation::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                              int32_t* positions) const {
  read_head_store(heads_[layer][kv_head], geometry_.head_dim, k, v, positions);
}

std::string KiviRepresentation::truncate_refusal(uint32_t layer, int32_t position) const {
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const cpu::KiviHeadStore& s = heads_[layer][h];
    if (!s.can_remove_from(position)) {
      return kivi_flush_refusal(layer, position, s.residual_tokens(), config_);
    }
  }
  return {};
}

std::string kivi_flush_refusal(uint32_t layer, int32_t position, size_t residual_tokens,
                               const cpu::KiviConfig& config) {
  const size_t since = residual_tokens - std::min<size_t>(residual_tokens, config.residual);
  return "layer " + std::to_string(layer) + " quantized a KIVI block while it held tokens " +
         "from position " + std::to_string(position) + " on; only the " + std::to_string(since) +
         " tokens appended since its last flush can go";
}

void KiviRepresentation::truncate(uint32_t layer, int32_t position) noexcept {
  for (cpu::KiviHeadStore& s : heads_[layer]) s.remove_from(position);
}

std::vector<TierRecord> kivi_layer_to_records(uint32_t layer,
                                              const std::vector<cpu::KiviHeadStore>& heads) {
  std::vector<TierRecord> out(heads.size());
  for (uint32_t h = 0; h < heads.size(); ++h) {
    out[h].layer = layer;
    out[h].kv_head = h;
    out[h].kind = "kivi.head";
    kivi_store_to_record(heads[h], "", out[h]);
  }
  return out;
}

std::vector<cpu::KiviHeadStore> kivi_layer_from_records(const Geometry& g,
                                                        const cpu::KiviConfig& config,
                                                        uint32_t layer,
                                                        const std::vector<TierRecord>& records) {
  if (records.size() != g.n_kv_heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " KIVI head records, expected ", g.n_kv_heads);
  }
  std::vector<cpu::KiviHeadStore> heads;
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
    const TierRecord& r = records[h];
    if (r.kind != "kivi.head" || r.kv_head != h || r.layer != layer) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", h, " is '", r.kind,
           "' for layer ", r.layer, " KV head ", r.kv_head, ", expected 'kivi.head' for KV head ",
           h);
    }
    heads.push_back(kivi_store_from_record(g.head_dim, config, "", r));
    if (h > 0 && heads[h].size() != heads[0].size()) {
      // Appends and evictions keep the same number of rows in every head of a layer.
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " KV head ", h, " holds ", heads[h].size(),
           " rows but head 0 holds ", heads[0].size());
    }
  }
  return heads;
}

std::vector<TierRecord> KiviRepresentation::save(uint32_t layer) const {
  return kivi_layer_to_records(layer, heads_[layer]);
}

void KiviRepresentation::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  heads_[layer] = kivi_layer_from_records(geometry_, config_, layer, records);
}

const int32_t* KiviRepresentation::row_positions(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].positions().data();
}

void KiviRepresentation::load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                                   float* dst) const {
  heads_[layer][kv_head].read_rows(first, count, dst, nullptr);
}

uint64_t KiviRepresentation::plan_keep(uint32_t layer,
                                       const std::vector<std::vector<uint32_t>>& keep,
                                       const IncomingRows* in) {
  const size_t dim = geometry_.head_dim;
  if (keep.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_INTERNAL, "plan_keep: ", keep.size(), " heads for ", geometry_.n_kv_heads);
  }
  std::vector<cpu::KiviHeadStore>& built = planned_[layer];
  planned_active_[layer] = 0;  // (replaced: a throw below leaves nothing planned)
  if (built.size() != geometry_.n_kv_heads) {
    built.clear();
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) built.emplace_back(dim, config_);
  }
  uint64_t bytes = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const cpu::KiviHeadStore& store = heads_[layer][h];
    cpu::KiviHeadStore& out = built[h];
    out.reserve_as(store);  // (then the copy reuses it: nothing allocates in a steady state)
    out = store;
    kivi_keep_head(out, keep[h], in, geometry_, h, keep_scratch_);
    bytes += out.bytes().total();
  }
  planned_active_[layer] = 1;
  return bytes;
}

void kivi_keep_head(cpu::KiviHeadStore& out, const std::vector<uint32_t>& keep,
                    const Representation::IncomingRows* in, const Geometry& g, uint32_t h,
                    KiviKeepScratch& scratch) {
  const size_t dim = g.head_dim, row = g.kv_elems_per_token(), held = out.size();
  const size_t split =
      size_t(std::lower_bound(keep.begin(), keep.end(), uint32_t(held)) - keep.begin());
  out.retain(keep.data(), split);
  const size_t n_new = keep.size() - split;
  if (n_new == 0) return;
  if (!in) fail(KVSDK_E_INTERNAL, "plan_keep: incoming rows kept without an append");
  float* kf = at_least(scratch.k, n_new * dim).data();
  float* vf = at_least(scratch.v, n_new * dim).data();
  int32_t* pos = at_least(scratch.positions, n_new).data();
  for (size_t j = 0; j < n_new; ++j) {
    const size_t t = keep[split + j] - held;
    load_f32(g.dtype, in->k, t * row + size_t(h) * dim, dim, kf + j * dim);
    load_f32(g.dtype, in->v, t * row + size_t(h) * dim, dim, vf + j * dim);
    pos[j] = in->positions[t];
  }
  out.reserve(n_new);
  out.append(kf, vf, pos, n_new);
}

void KiviRepresentation::commit_keep() noexcept {
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    if (!planned_active_[l]) continue;
    heads_[l].swap(planned_[l]);  // the replaced stores keep their capacity for the next plan
    planned_active_[l] = 0;
  }
}

void KiviRepresentation::drop_keep() noexcept {
  for (char& a : planned_active_) a = 0;
}

uint64_t kivi_layer_token_bytes(const Geometry& g, const cpu::KiviConfig& config,
                                uint64_t extra_per_row) {
  const double per_row = cpu::KiviHeadStore::bytes_per_quantized_token(g.head_dim, config);
  return uint64_t(g.n_kv_heads) * (uint64_t(std::ceil(per_row)) + extra_per_row);
}

uint64_t kivi_layer_token_capacity(const Geometry& g, const cpu::KiviConfig& config,
                                   uint64_t bytes, uint64_t extra_per_row) {
  // Per layer, the newest rows of every head sit in the exact residual window (R to R + G - 1 of
  // them); charge the largest window at the exact cost so that the estimate rarely overshoots.
  const uint64_t exact =
      uint64_t(g.n_kv_heads) * (ExactStore::bytes_per_token(g.head_dim) + extra_per_row);
  const uint64_t quant = kivi_layer_token_bytes(g, config, extra_per_row);
  const uint64_t window = uint64_t(config.residual) + uint64_t(config.group) - 1;
  const uint64_t window_bytes = uint64_t(g.n_layers) * window * exact;
  if (bytes <= window_bytes) return bytes / exact;
  return uint64_t(g.n_layers) * window + (bytes - window_bytes) / quant;
}

uint64_t KiviRepresentation::layer_token_bytes(uint64_t extra_per_row) const {
  return kivi_layer_token_bytes(geometry_, config_, extra_per_row);
}

uint64_t KiviRepresentation::layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const {
  return kivi_layer_token_capacity(geometry_, config_, bytes, extra_per_row);
}

}  // namespace kvsdk
