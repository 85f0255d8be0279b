// Policy 'kivi' (KIVI, docs/papers.md): every layer and KV head in a KiviHeadStore
// (backends/cpu/kivi_store.h): keys per channel in blocks of G tokens, values per token, an exact
// f16 residual window of R recent tokens. Quantizes, never evicts.
#pragma once

#include <vector>

#include "core/representation.h"
#include "kivi_store.h"

namespace kvsdk {

// TierRecord <-> KiviHeadStore, shared by every representation that holds KIVI stores.
void kivi_store_to_record(const cpu::KiviHeadStore& store, const std::string& prefix,
                          TierRecord& record);
cpu::KiviHeadStore kivi_store_from_record(size_t head_dim, const cpu::KiviConfig& config,
                                          const std::string& prefix, const TierRecord& record);
cpu::KiviConfig kivi_config(const kvsdk_policy& policy);

class KiviRepresentation final : public Representation {
 public:
  KiviRepresentation(const Geometry& geometry, const kvsdk_policy& policy);

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

 private:
  cpu::KiviConfig config_;
  std::vector<std::vector<cpu::KiviHeadStore>> heads_;  // [layer][kv_head]
};

}  // namespace kvsdk
