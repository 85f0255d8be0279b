// The exact tier as a store (core/representation.h): per layer and KV head the f16 rows of an
// ExactStore, in append order. It holds every layer of 'full' and of the eviction presets without
// a KIVI overlay, and the layers that SpindleKV's codebooks and MiniCache's merges do not cover.
// The selection stage of the eviction presets keeps subsets of its rows (plan_keep/commit_keep):
// survivors are compacted in place, never reordered and never re-rounded.
#pragma once

#include <vector>

#include "attention.h"
#include "core/representation.h"
#include "repr/keep_plan.h"

namespace kvsdk {

class ExactRows final : public Representation {
 public:
  ExactRows(const Geometry& geometry, const kvsdk_policy& policy);

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void append_host(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                   const int32_t* positions) override;
  bool attend_reentrant() const override { return true; }  // reads rows, works in workspace()
  bool attend_splits() const override {
    return ops().attend_f16_range != nullptr && ops().merge_partials != nullptr;
  }
  void attend_range(uint32_t layer, uint32_t kv_head, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, size_t first, size_t count,
                    const backend::PartialState& out) const override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  void read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                 int32_t* positions) const override;

  bool selects_rows() const override { return true; }
  const int32_t* row_positions(uint32_t layer, uint32_t kv_head) const override;
  void load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                 float* dst) const override;
  uint64_t plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                     const IncomingRows* incoming) override;
  void commit_keep() noexcept override;
  void drop_keep() noexcept override;
  uint64_t layer_token_bytes(uint64_t extra_per_row) const override;
  uint64_t layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const override;

  const ExactStore* exact_rows(uint32_t layer, uint32_t kv_head) const override {
    return &heads_[layer][kv_head];
  }
  void restore_exact(uint32_t layer, std::vector<ExactStore> heads) override;
  // Any row can go: nothing else depends on it (evictions are the cache's to check).
  std::string truncate_refusal(uint32_t, int32_t) const override { return {}; }
  void truncate(uint32_t layer, int32_t position) noexcept override {
    for (ExactStore& s : heads_[layer]) s.remove_from(position, geometry_.head_dim);
  }

  // Exact rows travel as typed row tables (exact_rows()), not as tier records.
  std::vector<TierRecord> save(uint32_t) const override { return {}; }
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

 private:
  void append_rows(uint32_t layer, size_t n, kvsdk_dtype dtype, const void* k, const void* v,
                   const int32_t* positions);
  std::vector<std::vector<ExactStore>> heads_;  // [layer][kv_head]
  std::vector<KeepPlan> plans_;                 // [layer]
};

}  // namespace kvsdk
