// Policy 'specache' (SpeCache, docs/papers.md): every layer and KV head in a
// cpu::SpeCacheHead (backends/cpu/specache.h). Budgeted: the low-bit KIVI copy (quant_bits 2, or
// SpeCache's 1-bit variant) and the full-precision rows fetched for the next step. Off budget: the
// f16 backing store, in host memory or in a file (set_backing_file), reported as backing_bytes.
//
// A decode step (§3.3): attend() for the output token uses the rows prefetch() fetched with the
// previous step's speculative token; prefetch() with this step's speculative queries picks
// fetch_tokens rows per KV head for the next step. Never evicts.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/representation.h"
#include "repr/specache_hit_rate.h"
#include "specache.h"

namespace kvsdk {

class SpeCacheRepresentation final : public Representation {
 public:
  SpeCacheRepresentation(const Geometry& geometry, const kvsdk_policy& policy);

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t backing_bytes() const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  // Also measures the fetch hit rate on the first attend() of a head after its prefetch()
  // (inside an attend transaction, applied by commit_attend()), from the low-bit scores taken
  // in the same pass, and keeps a single query's scores for a prefetch() of that query.
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  // Inside an attend transaction, a head's attend() writes only that head's state (its kept
  // scores, its staged measurement) and works in workspace(): heads may run on the pool.
  bool attend_reentrant() const override { return true; }
  bool prefetch_reentrant() const override { return true; }
  void begin_attend() const noexcept override;
  void commit_attend() const noexcept override;
  void abort_attend() const noexcept override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  // Rows as attention sees them: dequantized low-bit rows, fetched rows in full precision.
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  uint64_t prefetch_bound(uint32_t layer, uint32_t kv_head) const override;
  // One speculative query (n_rows == group); throws KVSDK_E_INVALID_ARG otherwise. Selects from
  // the scores of this head's latest attend() when that attended the same query (see
  // AttendScores), else scans the low-bit keys.
  void prefetch(uint32_t layer, uint32_t kv_head, const float* q_rows,
                const int32_t* row_positions, size_t n_rows) override;
  double hit_rate() const override;
  uint64_t hit_rate_samples() const override { return hits_.samples(); }
  void set_backing_file(const std::string& path) override;
  // Truncation: the low-bit copy's KIVI rule (only residual rows appended since its last flush
  // can go; cpu::KiviHeadStore::can_remove_from); the backing rows go with them, and the layer's
  // fetched rows are dropped (the next prefetch() fetches again). See the .cpp.
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  const cpu::SpeCacheHead& head(uint32_t layer, uint32_t kv_head) const {
    return heads_[layer][kv_head];
  }

 private:
  void make_heads();

  cpu::KiviConfig config_;
  size_t fetch_tokens_;
  std::shared_ptr<cpu::BackingArena> arena_;           // shared by every head
  std::vector<std::vector<cpu::SpeCacheHead>> heads_;  // [layer][kv_head]
  mutable SpeCacheHitRate hits_;  // (a measurement: not saved)
  // Working memory reused across calls (one thread per cache): append()'s per-head rows.
  std::vector<float> append_k_, append_v_;
  // The low-bit selection scores of each KV head's latest single-query attend (SpeCache §3.3:
  // the speculative token's top-k comes from its own attention pass). prefetch() with the same
  // queries at the same position, on the same layer and copy (no append since), selects from
  // them instead of scanning the low-bit copy again: the same bits either way.
  struct AttendScores {
    bool valid = false;
    uint32_t layer = 0;
    size_t tokens = 0;
    int32_t position = 0;
    size_t first_row = 0;  // the kept query's first row in `scores`
    const backend::Ops* ops = nullptr;
    std::vector<float> q;       // [group][head_dim]
    std::vector<float> scores;  // [rows of the attend][tokens]
    std::vector<float> shares;  // each row's share on the fetched rows (hit-rate measurement)
    std::vector<uint32_t> selected;  // prefetch()'s top-k tokens (working memory)
  };
  mutable std::vector<AttendScores> attend_scores_;  // [kv_head]
};

// One head's "specache.head" snapshot record: the same bytes from the host store and the device
// one (src/repr/device_specache.h).
TierRecord specache_head_record(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& lowbit,
                                const cpu::SpeCacheBackingStore& backing,
                                const std::vector<uint32_t>& fetched_tokens,
                                std::vector<uint16_t> fetched_k, std::vector<uint16_t> fetched_v);
// The heads a layer's "specache.head" records hold, validated (KVSDK_E_CORRUPT: count, kind, KV
// head, sizes, fetched tokens ascending below the copy's and at most fetch_tokens), their backing
// rows in `arena` (rebuilt from the low-bit copy when saved without them).
std::vector<cpu::SpeCacheHead> specache_layer_from_records(
    const Geometry& geometry, const cpu::KiviConfig& config, size_t fetch_tokens,
    const std::shared_ptr<cpu::BackingArena>& arena, uint32_t layer,
    const std::vector<TierRecord>& records);

}  // namespace kvsdk
