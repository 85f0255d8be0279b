// KIVI stores (KIVI, docs/papers.md): every layer and KV head in a KiviHeadStore
// (backends/cpu/kivi_store.h): keys per channel in blocks of G tokens, values per token, an exact
// f16 residual window of R recent tokens.
//
// Two policies use it: 'kivi' (quantizes, never evicts), and the eviction presets with a KIVI
// overlay ("xkv+kivi2", "snapkv+kivi2", "h2o+kivi4": the row store of core/method_traits.h's
// kivi_overlay). There the selection stage keeps subsets of the rows (plan_keep), and selection
// sees them as attention does (dequantized keys). Eviction calls KiviHeadStore::retain(), which
// drops rows without re-quantizing, so a kept row never changes.
#pragma once

#include <string>
#include <vector>

#include "attention.h"
#include "core/representation.h"
#include "kivi_store.h"

namespace kvsdk {

// TierRecord <-> KiviHeadStore, shared by every representation that holds KIVI stores.
void kivi_store_to_record(const cpu::KiviHeadStore& store, const std::string& prefix,
                          TierRecord& record);
cpu::KiviHeadStore kivi_store_from_record(size_t head_dim, const cpu::KiviConfig& config,
                                          const std::string& prefix, const TierRecord& record);
cpu::KiviConfig kivi_config(const kvsdk_policy& policy);
// One layer's KIVI heads as snapshot records ("kivi.head", one per KV head), and back: every
// record checked (KVSDK_E_CORRUPT for a wrong kind, head or layer, buffers that do not fit the
// geometry, heads of different lengths).
std::vector<TierRecord> kivi_layer_to_records(uint32_t layer,
                                              const std::vector<cpu::KiviHeadStore>& heads);
std::vector<cpu::KiviHeadStore> kivi_layer_from_records(const Geometry& geometry,
                                                        const cpu::KiviConfig& config,
                                                        uint32_t layer,
                                                        const std::vector<TierRecord>& records);
// Why a KIVI layer holding `residual_tokens` residual rows cannot truncate at `position`: it
// quantized a block while it held tokens from there on (KiviHeadStore::can_remove_from).
std::string kivi_flush_refusal(uint32_t layer, int32_t position, size_t residual_tokens,
                               const cpu::KiviConfig& config);
// Working memory of kivi_keep_head (reused: a steady state allocates nothing).
struct KiviKeepScratch {
  std::vector<float> k, v;
  std::vector<int32_t> positions;
};
// One head's part of an eviction plan (Representation::plan_keep) on `store`, a copy of the held
// head: the stored tokens of `keep` retained (KiviHeadStore::retain: nothing re-quantized), then
// the kept rows of `incoming` (KV head `kv_head` of its rows, candidate indices past the held
// ones) in one append, so the flushes are those of one append. Shared by the host and device
// KIVI stores. Throws KVSDK_E_INTERNAL for incoming rows kept without `incoming`.
void kivi_keep_head(cpu::KiviHeadStore& store, const std::vector<uint32_t>& keep,
                    const Representation::IncomingRows* incoming, const Geometry& geometry,
                    uint32_t kv_head, KiviKeepScratch& scratch);
// Representation::layer_token_bytes / layer_token_capacity of a KIVI store of `geometry` (every
// layer and KV head; estimates: see KiviRepresentation), shared by the host and device stores.
uint64_t kivi_layer_token_bytes(const Geometry& geometry, const cpu::KiviConfig& config,
                                uint64_t extra_per_row);
uint64_t kivi_layer_token_capacity(const Geometry& geometry, const cpu::KiviConfig& config,
                                   uint64_t bytes, uint64_t extra_per_row);

class KiviRepresentation final : public Representation {
 public:
  KiviRepresentation(const Geometry& geometry, const kvsdk_policy& policy);

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  bool attend_reentrant() const override { return true; }  // reads rows, works in workspace()
  bool attend_splits() const override {
    return ops().attend_kivi_range != nullptr && ops().merge_partials != nullptr;
  }
  void attend_range(uint32_t layer, uint32_t kv_head, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, size_t first, size_t count,
                    const backend::PartialState& out) const override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  // Exact only for tokens still in the residual window since the last flush (KiviHeadStore).
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  bool selects_rows() const override { return true; }
  const int32_t* row_positions(uint32_t layer, uint32_t kv_head) const override;
  void load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                 float* dst) const override;
  // Builds the kept stores aside (copies, retain(), then the kept incoming rows in one append, so
  // the flushes are those of one append) and counts their bytes exactly.
  uint64_t plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                     const IncomingRows* incoming) override;
  void commit_keep() noexcept override;
  void drop_keep() noexcept override;
  // Per-token costs are an estimate: residual windows cost the exact rate, ragged key blocks more.
  uint64_t layer_token_bytes(uint64_t extra_per_row) const override;
  uint64_t layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const override;
  bool token_bytes_estimated() const override { return true; }

 private:
  cpu::KiviConfig config_;
  // Reused by attend() and append() (one thread per cache): the decode path allocates nothing.
  mutable cpu::AttentionScratch scratch_;
  std::vector<std::vector<cpu::KiviHeadStore>> heads_;  // [layer][kv_head]
  // [layer]: the kept stores of a plan. Double buffers: commit_keep() swaps them with heads_,
  // so the next plan copies into the previous stores' capacity and a selection pass of the
  // decode path allocates nothing once they have grown (at the cost of host memory, off budget,
  // for a second copy of each evicting layer's stores).
  std::vector<std::vector<cpu::KiviHeadStore>> planned_;
  std::vector<char> planned_active_;  // [layer]
  KiviKeepScratch keep_scratch_;  // plan_keep(): one head's kept incoming rows
};

}  // namespace kvsdk
