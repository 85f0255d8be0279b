// The store interface as snapshots (formats/) see a cache: read-only access to what its stores and
// its policy hold, the types a snapshot is read into, and the per-layer layout a reader validates
// records against. formats/ includes no other src/core header (src/util's utilities aside), so
// snapshot code never reaches into the cache's internals, and a new store needs no snapshot code
// beyond its save()/restore() records (core/representation.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/exact_store.h"
#include "core/geometry.h"
#include "core/method_traits.h"
#include "core/policy.h"
#include "core/tier_record.h"
#include "kvsdk.h"

namespace kvsdk {

class Representation;

// Cache-level state of the allocation stage (saved in snapshots with the per-layer state).
struct PolicyRuntime {
  uint64_t cache_budget = 0;             // 0 = only the context budget applies
  std::vector<uint64_t> fixed_alloc;     // host-set allocation (planner), tokens per layer
  std::vector<double> profile_shares;    // applied allocation profile
  std::vector<uint64_t> last_caps;       // allocation of the last global compression
};

// Per-layer state of the importance stage, and the layer's counter of appended tokens.
struct LayerPolicyState {
  uint64_t appended_tokens = 0;
  // H2O: accumulated attention per stored row, parallel to the row store's rows of each KV head
  // (empty for other methods).
  std::vector<std::vector<float>> scores;
  // Window methods (SnapKV/PyramidKV/XKV): the last obs_window observed queries of this layer,
  // f32 [n][n_q_heads * head_dim], with their positions. Charged as metadata.
  std::vector<float> window_q;
  std::vector<int32_t> window_pos;
};

// A layer as snapshots carry it: its policy state and its exact rows (one ExactStore per KV head;
// empty for layers that other stores hold, whose rows travel as tier records).
struct LayerState : LayerPolicyState {
  std::vector<ExactStore> heads;
};

// What a snapshot writer reads of a cache (Cache implements it).
class StoreView {
 public:
  virtual ~StoreView() = default;
  virtual const Geometry& geometry() const = 0;
  virtual const kvsdk_policy& policy() const = 0;
  virtual uint64_t context_budget() const = 0;  // the context's budget, 0 = unlimited
  virtual PolicyRuntime policy_runtime() const = 0;
  virtual const LayerPolicyState& layer(uint32_t layer) const = 0;
  // The exact rows of one head (empty for layers another store holds): typed row tables.
  virtual const ExactStore& exact_rows(uint32_t layer, uint32_t kv_head) const = 0;
  // The records of the store holding `layer` (empty for the exact tier).
  virtual std::vector<TierRecord> tier_records(uint32_t layer) const = 0;
  virtual size_t head_tokens(uint32_t layer, uint32_t kv_head) const = 0;
  // Positions of the rows the selection stage keeps for one head (the row store's), which H2O's
  // scores are parallel to.
  virtual std::vector<int32_t> row_positions(uint32_t layer, uint32_t kv_head) const = 0;
  virtual kvsdk_layer_stats layer_stats(uint32_t layer) const = 0;
  // The shared prefix the cache continues (kvsdk_cache_create_on_prefix), or null.
  virtual const StoreView* prefix_view() const { return nullptr; }
};

// Which store holds each layer of a cache of `policy` (a snapshot reader's view: nothing is
// restored). Throws kvsdk::Error for a policy whose parameters no store accepts.
class StoreLayout {
 public:
  StoreLayout(const Geometry& geometry, const kvsdk_policy& policy);
  ~StoreLayout();
  StoreLayout(const StoreLayout&) = delete;
  StoreLayout& operator=(const StoreLayout&) = delete;
  // Whether the layer's rows travel as exact row tables (else as the store's records).
  bool exact_rows(uint32_t layer) const;
  // Restores `records` into a scratch store of the layer and drops it: throws kvsdk::Error
  // (KVSDK_E_CORRUPT) for records the store refuses. Checks the layer alone (row counts the
  // metadata declares and consistency across layers concern the final stores).
  void validate(uint32_t layer, const std::vector<TierRecord>& records) const;

 private:
  const Representation& store(uint32_t layer) const;
  Geometry geometry_;
  kvsdk_policy policy_;
  std::unique_ptr<Representation> repr_, rows_;
};

}  // namespace kvsdk
