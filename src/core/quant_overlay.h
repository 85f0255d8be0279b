// Eviction presets with a KIVI overlay (policies such as "xkv+kivi2", "snapkv+kivi2", "h2o+kivi4";
// issue 6; the compositions in docs/papers.md): the importance and allocation stages of the
// eviction preset run unchanged, but every row an exact-tier head keeps is stored the KIVI way in a
// cpu::KiviHeadStore (quantized blocks + an exact f16 residual window of the newest rows) instead
// of f16 rows. Selection sees the rows as attention does (dequantized keys); eviction calls
// KiviHeadStore::retain(), which drops rows without re-quantizing, so a kept row never changes.
//
// Storage: LayerState::quant holds one store per KV head and LayerState::heads stays empty (the
// stores hold the positions; nothing is counted twice). These helpers are the only places that
// know about the two layouts, so the cache's eviction code reads rows through them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cache.h"
#include "core/tier_record.h"
#include "kivi_store.h"
#include "kvsdk.h"

namespace kvsdk {

// True for an exact-tier eviction preset with quant_bits != 0.
bool quant_overlay(const kvsdk_policy& policy);
// Creates the (empty) per-KV-head stores of one layer of an overlay cache.
void quant_overlay_init(LayerState& layer, const Geometry& geometry, const kvsdk_policy& policy);

// Rows held by one KV head of a layer, whichever tier holds them.
size_t held_rows(const LayerState& layer, uint32_t kv_head);
const int32_t* held_positions(const LayerState& layer, uint32_t kv_head);
// Keys of held rows [first, first + count) as attention sees them, f32 [count][head_dim].
void load_held_keys(const LayerState& layer, uint32_t kv_head, uint32_t head_dim, size_t first,
                    size_t count, float* dst);
// Values likewise (null k or v skipped); positions too when non-null.
void read_held_rows(const LayerState& layer, uint32_t kv_head, uint32_t head_dim, float* k,
                    float* v, int32_t* positions);

// Adds the quantized stores' bytes by tier: codes, scales, zeros and block counts are QUANTIZED,
// the residual window EXACT, positions METADATA.
void quant_overlay_add_bytes(const LayerState& layer, uint64_t by_tier[KVSDK_TIER_SLOTS]);
uint64_t quant_overlay_bytes(const LayerState& layer);

// Budget planning (an estimate; the cache checks the exact bytes before it commits):
// bytes of one fully quantized layer-token (a row in every KV head), rounded up.
uint64_t quant_overlay_token_bytes(const Geometry& geometry, const kvsdk_policy& policy);
// Layer-tokens that `bytes` can hold, charging each head's residual window (R + G - 1 rows at
// most) at the exact f16 cost and the rest at the quantized cost. `extra_per_row` is the
// per-row metadata besides the store (H2O's score).
uint64_t quant_overlay_capacity(uint64_t bytes, const Geometry& geometry,
                                const kvsdk_policy& policy, uint64_t extra_per_row);

// The store of one KV head after an eviction: `store` with only the rows of `keep` (ascending
// candidate indices: held rows first, then rows of an incoming append), the kept incoming rows
// appended (read from k/v [n][n_kv_heads][head_dim] in `dtype`). `store` is not modified, so a
// caller can build every new store, check the bytes, and only then swap them in.
cpu::KiviHeadStore quant_overlay_kept(const cpu::KiviHeadStore& store,
                                      const std::vector<uint32_t>& keep, const Geometry& geometry,
                                      uint32_t kv_head, const void* in_k, const void* in_v,
                                      const int32_t* in_positions);

// Snapshot support (the writer/reader wire these in): one "kivi.head" record per KV head of the
// layer (the same records policy 'kivi' writes), and the inverse, which validates everything and
// throws KVSDK_E_CORRUPT on any inconsistency (layer unchanged).
std::vector<TierRecord> quant_overlay_records(const LayerState& layer, uint32_t layer_index);
void quant_overlay_restore(LayerState& layer, uint32_t layer_index, const Geometry& geometry,
                           const kvsdk_policy& policy, const std::vector<TierRecord>& records);

}  // namespace kvsdk
