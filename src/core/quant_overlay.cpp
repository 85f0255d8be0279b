#include "core/quant_overlay.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "repr/kivi_repr.h"

namespace kvsdk {

bool quant_overlay(const kvsdk_policy& p) {
  const int32_t m = p.method;
  const bool evicting = m == KVSDK_METHOD_STREAMING_LLM || m == KVSDK_METHOD_H2O ||
                        m == KVSDK_METHOD_SNAPKV || m == KVSDK_METHOD_PYRAMIDKV ||
                        m == KVSDK_METHOD_XKV;
  return evicting && p.quant_bits != 0;
}

void quant_overlay_init(LayerState& L, const Geometry& g, const kvsdk_policy& p) {
  L.quant.clear();
  L.quant.reserve(g.n_kv_heads);
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) L.quant.emplace_back(g.head_dim, kivi_config(p));
}

size_t held_rows(const LayerState& L, uint32_t h) {
  return L.quant.empty() ? L.heads[h].size() : L.quant[h].size();
}

const int32_t* held_positions(const LayerState& L, uint32_t h) {
  return L.quant.empty() ? L.heads[h].positions.data() : L.quant[h].positions().data();
}

void load_held_keys(const LayerState& L, uint32_t h, uint32_t dim, size_t first, size_t count,
                    float* dst) {
  if (L.quant.empty()) {
    load_f32(KVSDK_DTYPE_F16, L.heads[h].k.data(), first * dim, count * dim, dst);
  } else {
    L.quant[h].read_rows(first, count, dst, nullptr);
  }
}

void read_held_rows(const LayerState& L, uint32_t h, uint32_t dim, float* k, float* v,
                    int32_t* positions) {
  const size_t n = held_rows(L, h);
  if (L.quant.empty()) {
    const ExactStore& s = L.heads[h];
    if (k) load_f32(KVSDK_DTYPE_F16, s.k.data(), 0, n * dim, k);
    if (v) load_f32(KVSDK_DTYPE_F16, s.v.data(), 0, n * dim, v);
  } else {
    L.quant[h].read_rows(0, n, k, v);
  }
  if (positions) std::copy_n(held_positions(L, h), n, positions);
}

void quant_overlay_add_bytes(const LayerState& L, uint64_t by_tier[KVSDK_TIER_SLOTS]) {
  for (const cpu::KiviHeadStore& s : L.quant) {
    const cpu::KiviBytes b = s.bytes();
    by_tier[KVSDK_TIER_QUANTIZED] += b.codes + b.scales_zeros;
    by_tier[KVSDK_TIER_EXACT] += b.residual;  // the f16 residual window is exact
    by_tier[KVSDK_TIER_METADATA] += b.positions;
  }
}

uint64_t quant_overlay_bytes(const LayerState& L) {
  uint64_t b = 0;
  for (const cpu::KiviHeadStore& s : L.quant) b += s.bytes().total();
  return b;
}

uint64_t quant_overlay_token_bytes(const Geometry& g, const kvsdk_policy& p) {
  const double per_row = cpu::KiviHeadStore::bytes_per_quantized_token(g.head_dim, kivi_config(p));
  return uint64_t(g.n_kv_heads) * uint64_t(std::ceil(per_row));
}

uint64_t quant_overlay_capacity(uint64_t bytes, const Geometry& g, const kvsdk_policy& p,
                                uint64_t extra_per_row) {
  // Per layer, the newest rows of every head sit in the exact residual window (R to R + G - 1 of
  // them); charge the largest window at the exact cost so that the estimate rarely overshoots.
  const uint64_t exact = uint64_t(g.n_kv_heads) *
                         (ExactStore::bytes_per_token(g.head_dim) + extra_per_row);
  const uint64_t quant = quant_overlay_token_bytes(g, p) + uint64_t(g.n_kv_heads) * extra_per_row;
  const uint64_t window = uint64_t(p.quant_residual) + uint64_t(p.quant_group) - 1;
  const uint64_t window_bytes = uint64_t(g.n_layers) * window * exact;
  if (bytes <= window_bytes) return bytes / exact;
  return uint64_t(g.n_layers) * window + (bytes - window_bytes) / quant;
}

cpu::KiviHeadStore quant_overlay_kept(const cpu::KiviHeadStore& store,
                                      const std::vector<uint32_t>& keep, const Geometry& g,
                                      uint32_t h, const void* in_k, const void* in_v,
                                      const int32_t* in_positions) {
  const size_t held = store.size();
  const size_t split = size_t(std::lower_bound(keep.begin(), keep.end(), uint32_t(held)) -
                              keep.begin());
  cpu::KiviHeadStore out = store;
  out.retain(std::vector<uint32_t>(keep.begin(), keep.begin() + split));
  const size_t n_new = keep.size() - split;
  if (n_new == 0) return out;
  // Kept incoming rows, appended in one call (so the flushes are those of one append).
  const size_t dim = g.head_dim, row = g.kv_elems_per_token();
  std::vector<float> k(n_new * dim), v(n_new * dim);
  std::vector<int32_t> pos(n_new);
  for (size_t j = 0; j < n_new; ++j) {
    const size_t t = keep[split + j] - held;
    load_f32(g.dtype, in_k, t * row + size_t(h) * dim, dim, k.data() + j * dim);
    load_f32(g.dtype, in_v, t * row + size_t(h) * dim, dim, v.data() + j * dim);
    pos[j] = in_positions[t];
  }
  out.append(k.data(), v.data(), pos.data(), n_new);
  return out;
}

std::vector<TierRecord> quant_overlay_records(const LayerState& L, uint32_t layer_index) {
  std::vector<TierRecord> out(L.quant.size());
  for (uint32_t h = 0; h < L.quant.size(); ++h) {
    out[h].layer = layer_index;
    out[h].kv_head = h;
    out[h].kind = "kivi.head";
    kivi_store_to_record(L.quant[h], "", out[h]);
  }
  return out;
}

void quant_overlay_restore(LayerState& L, uint32_t layer_index, const Geometry& g,
                           const kvsdk_policy& p, const std::vector<TierRecord>& records) {
  if (records.size() != g.n_kv_heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer_index, " has ", records.size(),
         " KIVI overlay records, expected ", g.n_kv_heads);
  }
  std::vector<cpu::KiviHeadStore> heads;
  heads.reserve(g.n_kv_heads);
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
    const TierRecord& r = records[h];
    if (r.kind != "kivi.head" || r.kv_head != h || r.layer != layer_index) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer_index, " record ", h, " is '", r.kind,
           "' for layer ", r.layer, " KV head ", r.kv_head, ", expected 'kivi.head' for KV head ",
           h);
    }
    heads.push_back(kivi_store_from_record(g.head_dim, kivi_config(p), "", r));
    if (h > 0 && heads[h].size() != heads[0].size()) {
      // Eviction keeps the same number of rows in every head of a layer.
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer_index, " KV head ", h, " holds ",
           heads[h].size(), " rows but head 0 holds ", heads[0].size());
    }
  }
  L.quant = std::move(heads);
}

}  // namespace kvsdk
