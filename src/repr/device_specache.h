// The 'specache' policy in a device backend's memory (ops().device_memory: CUDA). SpeCache
// (docs/papers.md): the budgeted low-bit KIVI copy of every layer and KV head and the rows
// fetched for the next step live in the context's device arena; the full-precision (f16)
// backing store stays off the budget in host memory or a file (set_backing_file), exactly as in
// the host store (src/repr/specache_repr.h), whose bytes, rules and snapshot records this store
// keeps.
//
// What runs where, and why the rows are the CPU's:
//  - The low-bit copy is a DeviceKivi (src/repr/device_kivi.h): the same bytes as the CPU's
//    KiviHeadStore, flushes quantized with the CPU's bits.
//  - Attention (§3.3, C' ∪ C_K): the backend's attend_specache_tier over the copy's buffers, the
//    fetched tokens left out of the low-bit part and their f16 rows in the same softmax.
//  - A prefetch (§3.3: the speculative token's group-averaged top-k): the backend's
//    specache_scores_tier scores the low-bit keys and specache_select_tier picks the tokens on
//    the device, both with the reference's bits (cpu::specache_score_chunk,
//    cpu::specache_select_from_scores); the k token indices come back, and those rows are copied
//    from the backing store into the arena. So a device cache fetches the tokens a reference CPU
//    cache fetches, and its snapshots load into either.
//  - The fetch hit rate (kvsdk_cache_fetch_stats): the first attend after a prefetch scores the
//    real query's rows the same way and specache_shares_tier measures the share of their low-bit
//    attention on the fetched tokens (cpu::specache_fetched_shares' bits): a float per row back.
//  - Reads and snapshots copy a head out (the low-bit copy and the fetched rows).
//
// Device memory outside the arena (like attention's): the queries, the fetched rows' positions
// of one attention call, one head's scores and the selection's working memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/representation.h"
#include "device_arena_plan.h"
#include "repr/device_kivi.h"
#include "repr/device_queries.h"
#include "repr/specache_hit_rate.h"
#include "specache.h"

namespace kvsdk {

class DeviceSpeCache final : public Representation, private ArenaOwner {
 public:
  // Every layer of a 'specache' cache on `ctx` (a device backend). Throws KVSDK_E_UNSUPPORTED for
  // a head_dim the device kernels lack, or a backend without the SpeCache entries;
  // KVSDK_E_INVALID_ARG for quant_bits other than 1 or 2.
  DeviceSpeCache(const Geometry& geometry, const kvsdk_policy& policy, Context& ctx);
  ~DeviceSpeCache() override;

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t backing_bytes() const override;
  uint64_t device_reserved_bytes() const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  void attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const override;
  void begin_attend() const noexcept override;
  void commit_attend() const noexcept override;
  void abort_attend() const noexcept override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  // As the host store: dequantized low-bit rows with the fetched rows substituted.
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  uint64_t prefetch_bound(uint32_t layer, uint32_t kv_head) const override;
  // One speculative query (n_rows == group), as the host store. A device failure after the
  // fetched rows began to change drops the head's fetch (attention then uses the low-bit rows
  // alone, as after a truncation) before it throws KVSDK_E_BACKEND.
  void prefetch(uint32_t layer, uint32_t kv_head, const float* q_rows,
                const int32_t* row_positions, size_t n_rows) override;
  double hit_rate() const override;
  uint64_t hit_rate_samples() const override { return hits_.samples(); }
  void set_backing_file(const std::string& path) override;
  // The device KIVI store's rule (the newest rows, and only residual rows appended since the
  // last flush); the backing rows go with them and the layer's fetched rows are dropped.
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

 private:
  enum Part : size_t { kKeys, kValues, kTokens, kParts };
  size_t index(uint32_t layer, uint32_t head) const {
    return size_t(layer) * geometry_.n_kv_heads + head;
  }
  cuda::ArenaPartition layout_for(const std::vector<uint64_t>& capacity) const;
  char* slice(uint32_t layer, uint32_t head, Part part) const;
  // Room for `rows` fetched rows in the head's slices (may re-lay the region; contents kept).
  // Throws KVSDK_E_BUDGET (nothing changed) when the arena cannot hold them.
  void reserve_rows(uint32_t layer, uint32_t head, size_t rows);
  void relayout(const std::vector<uint64_t>& capacity);
  uint64_t shrink_to_fit() override;
  // attend() of heads [first, first + n_heads): q_rows and out [n_heads][n_rows][dim].
  void attend_range(uint32_t layer, uint32_t first, uint32_t n_heads, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const;
  // The hit-rate measurement of one head's attend after its prefetch (q_rows: that head's).
  void measure(uint32_t layer, uint32_t kv_head, const float* q_rows,
               const int32_t* row_positions) const;
  // The low-bit scores of host query rows q over the head's copy, on the device: [q.n_rows]
  // [tokens] floats, followed by room for max(fetch_tokens, q.n_rows) 4-byte results.
  float* score_head(uint32_t layer, uint32_t kv_head, const backend::QueryRows& q) const;
  // Writes `fetched` into the head's slices and mirror (which must hold them).
  void upload_fetch(uint32_t layer, uint32_t kv_head, const cpu::SpeCacheFetched& fetched);
  // The fetched rows of a head, copied out (reads, snapshots).
  void download_fetch(uint32_t layer, uint32_t kv_head, std::vector<uint16_t>& k,
                      std::vector<uint16_t>& v) const;
  void make_backing(std::shared_ptr<cpu::BackingArena> arena);

  Context& ctx_;
  const backend::Ops& device_;
  ArenaRegions& regions_;
  cpu::KiviConfig config_;
  size_t fetch_tokens_;
  std::unique_ptr<DeviceKivi> lowbit_;  // the budgeted low-bit copy, in a region of its own
  std::shared_ptr<cpu::BackingArena> arena_;                   // the backing rows' blocks
  std::vector<std::vector<cpu::SpeCacheBackingStore>> backing_;  // [layer][head]
  // The fetched rows: in the arena (f16 keys, values and u32 token indices per head), their
  // token indices mirrored here.
  cuda::ArenaPartition layout_;
  std::vector<uint64_t> capacity_;               // rows per [layer * heads + head]
  std::vector<std::vector<uint32_t>> fetched_;   // [layer * heads + head]
  // Attention's transfers: queries and outputs, and the fetched rows' positions of every head.
  mutable DeviceQueries queries_;
  mutable DeviceScratch fetched_pos_;
  mutable std::vector<int32_t> fetched_pos_host_;
  // Scoring: the device scores of one head and the selection's or measurement's results; the
  // selected tokens and the rows' shares on the host.
  mutable DeviceScratch scores_device_;
  std::vector<uint32_t> selected_;
  cpu::SpeCacheFetched staged_fetch_;  // a prefetch's rows on their way in
  std::vector<float> append_k_, append_v_;  // one head's appended rows
  mutable SpeCacheHitRate hits_;  // (a measurement: not saved)
  mutable std::vector<float> shares_;
};

}  // namespace kvsdk
