// The restore path of Cache used by snapshot loading (formats/): adopts validated store data and
// charges it to the context budget. Kept apart from cache.cpp so the cache's hot paths and the
// snapshot code change independently.
#include <memory>
#include <utility>

#include "core/cache.h"
#include "util/error.h"

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
  for (uint32_t l = 0; l < geometry.n_layers; ++l) {
    static const std::vector<TierRecord> kNone;
    // Each layer's store takes what a snapshot holds for it: exact rows (the exact tier; any other
    // store refuses them) and store records (validated; the exact tier refuses them).
    Representation& s = cache->store(l);
    s.restore_exact(l, std::move(layers[l].heads));
    s.restore(l, tiers.empty() ? kNone : tiers[l]);
    static_cast<LayerPolicyState&>(cache->layers_[l]) = std::move(layers[l]);
  }
  // The same per-tier accounting as stats(), so a restored cache is charged what it reports.
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < geometry.n_layers; ++l) {
    uint64_t by_tier[KVSDK_TIER_SLOTS];
    cache->layer_bytes(l, by_tier);
    for (uint64_t b : by_tier) bytes += b;
  }
  BudgetReservation r = cache->reservation();
  if (!r.reserve(bytes)) {
    fail(KVSDK_E_BUDGET, "the snapshot holds ", bytes, " bytes but the context has ",
         cache->ctx_->available(), " of its ", cache->ctx_->budget(), " budget bytes free");
  }
  r.commit();
  cache->restored_floor();
  return cache;
}

std::unique_ptr<Cache> Cache::fork(std::shared_ptr<Context> into) const {
  // What a snapshot of this cache holds, without encoding it: the copy is exact for every store
  // (the snapshot round trip tests check that restore continues bit for bit), and a new store
  // needs nothing here beyond its save()/restore() records.
  std::vector<LayerState> layers;
  std::vector<std::vector<TierRecord>> tiers;
  layers.reserve(geometry_.n_layers);
  tiers.reserve(geometry_.n_layers);
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    layers.push_back(layer_image(l));
    tiers.push_back(tier_records(l));
  }
  std::unique_ptr<Cache> copy =
      restore(into ? std::move(into) : ctx_, geometry_, policy_, std::move(layers), tiers);
  copy->restore_policy_runtime(policy_runtime());
  // The copy continues this cache's history exactly, so it can truncate as far back as this one
  // from the cache's side (its stores restart their own history, as after a load).
  copy->prefix_ = prefix_;  // the same shared prefix (the copy itself is not frozen)
  copy->max_position_ = max_position_;
  copy->exact_floor_ = exact_floor_;
  return copy;
}

}  // namespace kvsdk
