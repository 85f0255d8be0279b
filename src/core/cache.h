// A cache: one conversation's KV cache for one model geometry, stored per layer and KV head in
// tiers, charged against its context's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/exact_store.h"
#include "core/geometry.h"
#include "kvsdk.h"

namespace kvsdk {

struct LayerState {
  std::vector<ExactStore> heads;  // one per KV head
  uint64_t appended_tokens = 0;
};

class Cache {
 public:
  Cache(std::shared_ptr<Context> ctx, const Geometry& geometry, const kvsdk_policy& policy);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Snapshot restore (formats/): a cache holding `layers`, already validated against `geometry`,
  // with their bytes charged to `ctx`. Throws KVSDK_E_BUDGET (charging nothing) when they do not
  // fit. Defined in cache_restore.cpp.
  static std::unique_ptr<Cache> restore(std::shared_ptr<Context> ctx, const Geometry& geometry,
                                        const kvsdk_policy& policy,
                                        std::vector<LayerState> layers);

  const Geometry& geometry() const { return geometry_; }
  const kvsdk_policy& policy() const { return policy_; }
  const Context& context() const { return *ctx_; }
  const LayerState& layer(uint32_t l) const { return layers_[l]; }

  // Each throws kvsdk::Error and leaves the cache unchanged on failure.
  void append(uint32_t layer, size_t n_tokens, const void* k, const void* v,
              const int32_t* positions);
  void attend(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions,
              void* out) const;
  // Copies one head's rows out in host dtype; returns the row count. Null outputs are skipped.
  size_t read(uint32_t layer, uint32_t kv_head, void* k, void* v, int32_t* positions,
              size_t capacity) const;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const;

  kvsdk_cache_stats stats() const;
  kvsdk_layer_stats layer_stats(uint32_t layer) const;
  uint64_t charged_bytes() const { return charged_; }

 private:
  void check_layer(uint32_t layer) const;
  void layer_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const;

  std::shared_ptr<Context> ctx_;
  Geometry geometry_;
  kvsdk_policy policy_;
  std::vector<LayerState> layers_;
  uint64_t charged_ = 0;  // bytes this cache holds charged to ctx_
};

}  // namespace kvsdk

namespace kvsdk::format {
struct JournalBase;
}

struct kvsdk_cache {
  std::unique_ptr<kvsdk::Cache> impl;
  // What the last snapshot save/load of this cache recorded, so that kvsdk_cache_save_delta can
  // append exactly what changed since (formats/journal.h). Null until the first save or load.
  std::shared_ptr<kvsdk::format::JournalBase> journal;
};
