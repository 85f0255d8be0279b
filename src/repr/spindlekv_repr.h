// Policy 'spindlekv' (SpindleKV, docs/papers.md): the shallow layers below the boundary
// (policy.boundary_layer, -1 = n_layers / 2) hold per-KV-head codebooks (§3.4, Algorithm 1;
// backends/cpu/spindlekv_store.h: keys grouped before RoPE with θ_K = 0.98, values with
// θ_V = 0.95, decode tokens joining an entry above θ or extending the codebook). The layers from
// the boundary on are not covered: they stay in the cache's exact tier and evict as SnapKV does
// (window scores from observe) with the layer allocation of the SpindleKV schedule (§3.3, Eq. (5)
// and (6), policy::allocate_pyramid over the deep layers only; src/core/cache_compress.cpp).
//
// Bytes: codebook entries, per-token indices and magnitudes -> KVSDK_TIER_CODEBOOK; positions ->
// METADATA. The codebook layers never evict: their bytes are fixed for the eviction of the deep
// layers, whose token capacity is what the budget leaves.
#pragma once

#include <vector>

#include "core/representation.h"
#include "spindlekv_store.h"

namespace kvsdk {

class SpindleKvRepresentation final : public Representation {
 public:
  // Throws KVSDK_E_INVALID_ARG when boundary_layer is beyond the geometry's layers.
  SpindleKvRepresentation(const Geometry& geometry, const kvsdk_policy& policy);

  bool covers(uint32_t layer) const override { return layer < boundary_; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  // Truncation: per KV head, SpindleHeadStore::removal_refusal's rule (whole appends from the
  // end; after a restore only rows appended since, or every row).
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  uint32_t boundary() const { return boundary_; }

 private:
  uint32_t boundary_;
  std::vector<std::vector<cpu::SpindleHeadStore>> heads_;  // [layer < boundary][kv_head]
  // append()'s working memory, reused (one thread per cache).
  std::vector<float> append_k_, append_v_;
  cpu::SpindleScratch append_scratch_;
};

}  // namespace kvsdk
