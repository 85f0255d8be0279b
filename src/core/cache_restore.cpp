// The restore path of Cache used by snapshot loading (formats/): adopts validated tier data and
// charges it to the context budget. Kept apart from cache.cpp so the cache's hot paths and the
// snapshot code change independently.
#include <memory>
#include <utility>

#include "core/cache.h"
#include "core/error.h"
#include "core/policy.h"
#include "core/quant_overlay.h"
#include "core/representation.h"

namespace kvsdk {

std::unique_ptr<Cache> Cache::restore(std::shared_ptr<Context> ctx, const Geometry& geometry,
                                      const kvsdk_policy& policy, std::vector<LayerState> layers,
                                      const std::vector<std::vector<TierRecord>>& tiers) {
  if (layers.size() != geometry.n_layers) {
    fail(KVSDK_E_INTERNAL, "restore: ", layers.size(), " layers for a geometry of ",
         geometry.n_layers);
  }
  for (const LayerState& l : layers) {
    if (l.heads.size() != geometry.n_kv_heads) {
      fail(KVSDK_E_INTERNAL, "restore: layer with ", l.heads.size(), " heads");
    }
  }
  if (!tiers.empty() && tiers.size() != geometry.n_layers) {
    fail(KVSDK_E_INTERNAL, "restore: tier records for ", tiers.size(), " layers");
  }
  auto cache = std::make_unique<Cache>(std::move(ctx), geometry, policy);
  const bool overlay = quant_overlay(policy);
  if (overlay && tiers.empty()) {
    // A KIVI overlay (core/quant_overlay.h) keeps its rows in LayerState::quant, which the caller
    // must have restored (quant_overlay_restore); exact rows would be ignored, so refuse them.
    for (const LayerState& l : layers) {
      if (l.quant.size() != geometry.n_kv_heads) {
        fail(KVSDK_E_UNSUPPORTED, "restore: policy '", policy_spec(policy), "' keeps its rows in "
             "KIVI overlay stores, which this snapshot does not have");
      }
      for (const ExactStore& h : l.heads) {
        if (h.size() != 0) fail(KVSDK_E_CORRUPT, "restore: exact rows in a KIVI overlay cache");
      }
    }
  }
  cache->layers_ = std::move(layers);
  for (uint32_t l = 0; l < geometry.n_layers; ++l) {
    static const std::vector<TierRecord> kNone;
    const std::vector<TierRecord>& records = tiers.empty() ? kNone : tiers[l];
    if (overlay && !tiers.empty()) {
      // KIVI overlay of an eviction preset: the layer's rows are its KIVI stores' records.
      for (const ExactStore& h : cache->layers_[l].heads) {
        if (h.size() != 0) fail(KVSDK_E_CORRUPT, "snapshot: exact rows in a KIVI overlay cache");
      }
      quant_overlay_restore(cache->layers_[l], l, geometry, policy, records);
      continue;
    }
    if (!cache->covered(l)) {
      if (!records.empty()) {
        fail(KVSDK_E_CORRUPT, "snapshot layer ", l, " has compressed-tier records, but policy '",
             policy_spec(policy), "' keeps it exact");
      }
      continue;
    }
    for (const ExactStore& h : cache->layers_[l].heads) {
      if (h.size() != 0) {
        fail(KVSDK_E_CORRUPT, "snapshot layer ", l, " has exact rows, but policy '",
             policy_spec(policy), "' holds it compressed");
      }
    }
    cache->repr_->restore(l, records);
  }
  // The same per-tier accounting as stats(), so a restored cache is charged what it reports.
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < geometry.n_layers; ++l) {
    uint64_t by_tier[KVSDK_TIER_SLOTS];
    cache->layer_bytes(l, by_tier);
    for (uint64_t b : by_tier) bytes += b;
  }
  if (!cache->ctx_->try_reserve(bytes)) {
    fail(KVSDK_E_BUDGET, "the snapshot holds ", bytes, " bytes but the context has ",
         cache->ctx_->available(), " of its ", cache->ctx_->budget(), " budget bytes free");
  }
  cache->charged_ = bytes;
  return cache;
}

}  // namespace kvsdk
