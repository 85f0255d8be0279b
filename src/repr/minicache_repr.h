// Policy 'minicache' (MiniCache, docs/papers.md) and the composition 'minicache+kivi4'
// (quant_bits != 0): from the boundary layer m (policy.boundary_layer, -1 = n_layers / 2) on,
// the adjacent layer pairs (m, m+1), (m+2, m+3), ... share one SLERP direction per token and
// KV head (t = policy.merge_t), with per-layer magnitudes; the γ = policy.retain_ratio most
// distant tokens stay unmerged in both layers (backends/cpu/minicache_merge.h, or
// minicache_kivi.h when the directions are KIVI-quantized). Layers below m, and a last layer
// without a partner, are not covered: they stay in the cache's exact tier. Never evicts.
//
// Layer-by-layer appends. The host appends one layer at a time, so the rows of the first layer of
// a pair to arrive wait, exact (f16, KVSDK_TIER_EXACT, attended and read as they are), in a
// pending buffer per KV head until the partner layer's append of the same tokens arrives; then
// both are merged into the pair and the pending rows are released. Either layer of a pair may
// lead. When the partner's append has a different token count, the common prefix is merged and
// the rest stays pending (pending rows of the leading layer, or the partner's surplus, which then
// becomes the pending side). The merged tokens must carry the same positions in both layers;
// otherwise append() fails with KVSDK_E_INVALID_ARG before changing anything.
//
// Bytes (add_bytes): a pair's shared store is attributed to its first layer, the per-layer parts
// to their layer: f16 directions -> MERGED (first layer); the f32 magnitudes of a layer ->
// MERGED (that layer); retained rows of a layer -> MERGED (that layer): they are part of the
// merged store (the pair's slot table points into them, and they are restored by the pair), not
// exact-tier rows; slots, positions and the retention threshold -> METADATA (first layer);
// pending rows -> EXACT and their positions -> METADATA (their layer). For '+kivi' the KIVI store
// of the directions (codes, scales, its f16 residual window of directions and its positions) ->
// QUANTIZED (first layer). Merging on the partner's append releases the leader's pending bytes,
// so an append changes the bytes of both layers of a pair: append_bound() bounds the change of
// the representation's total bytes (which Cache measures for every append).
#pragma once

#include <memory>
#include <vector>

#include "core/representation.h"
#include "minicache_kivi.h"
#include "minicache_merge.h"

namespace kvsdk {

// The first layer MiniCache merges (policy.boundary_layer, -1 = n_layers / 2). Throws
// KVSDK_E_INVALID_ARG when it is beyond the geometry's layers.
uint32_t minicache_boundary(const Geometry& geometry, const kvsdk_policy& policy);
// The message of a refused truncation of `layer` (KV head `kv_head`) at `position`, for both
// stores (the host's and the device's): which pair, and `why`.
std::string minicache_truncate_refusal(uint32_t layer, uint32_t boundary, uint32_t kv_head,
                                       int32_t position, const char* why);
// One f16 pair head's part of its "minicache.pair" snapshot record (both tensors' buffers and the
// positions), and the pair rebuilt from it (throws KVSDK_E_CORRUPT when inconsistent); shared
// with the device store (src/repr/device_minicache.h), whose snapshots are this store's.
void minicache_pair_to_record(const cpu::MiniCacheHeadPair& pair, TierRecord& record);
cpu::MiniCacheHeadPair minicache_pair_from_record(size_t dim, const cpu::MiniCacheConfig& config,
                                                  const TierRecord& record, uint32_t layer,
                                                  uint32_t head);

class MiniCacheRepresentation final : public Representation {
 public:
  // Throws KVSDK_E_INVALID_ARG when boundary_layer is beyond the geometry's layers.
  MiniCacheRepresentation(const Geometry& geometry, const kvsdk_policy& policy);

  bool covers(uint32_t layer) const override;
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  // Truncation, per layer pair (either layer's call cuts both; idempotent): the merged tokens by
  // the pair stores' rule (cpu::MiniCacheHeadPair / MiniCacheKiviPair::removal_refusal: the
  // newest tokens, not inside the threshold-setting first merge, and for '+kivi' only directions
  // since the last flush), the pending rows of the leading layer freely (exact f16 rows that no
  // merge saw yet), as long as the tokens that go are the newest of each layer.
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  uint32_t boundary() const { return boundary_; }
  // Tokens of `layer` (covered) waiting in the exact pending buffer of each head.
  size_t pending_tokens(uint32_t layer) const;

 private:
  // Rows of one layer of a pair waiting for the partner layer (f16, as the exact tier holds them).
  struct Pending {
    std::vector<uint16_t> k, v;  // [n][head_dim]
    std::vector<int32_t> positions;
    size_t size() const { return positions.size(); }
  };
  // One layer pair: per KV head either f16 pairs or KIVI pairs (quant_bits != 0), and the rows
  // of the one side (0 = first layer, 1 = second) that leads.
  struct Pair {
    std::vector<cpu::MiniCacheHeadPair> f16;
    std::vector<cpu::MiniCacheKiviPair> kivi;
    std::vector<Pending> pending;  // per KV head, all the same length
    int pending_side = 0;          // meaningful when pending[0].size() > 0
  };
  size_t pair_of(uint32_t layer) const { return (layer - boundary_) / 2; }
  int side_of(uint32_t layer) const { return int((layer - boundary_) % 2); }
  uint32_t partner(uint32_t layer) const { return side_of(layer) == 0 ? layer + 1 : layer - 1; }
  size_t merged_tokens(const Pair& p) const;
  size_t pending_of(const Pair& p, int side) const {
    return !p.pending.empty() && p.pending_side == side ? p.pending[0].size() : 0;
  }
  // The stored rows of one head of one side, chunk by chunk, into `sink(k, v, pos, n)`.
  template <typename Sink>
  void for_rows(uint32_t layer, uint32_t kv_head, Sink&& sink) const;
  uint64_t pair_store_bytes_bound(const Pair& p, uint32_t head, size_t n_merge) const;
  void make_stores(Pair& p) const;

  uint32_t boundary_;
  cpu::MiniCacheConfig merge_;
  cpu::KiviConfig quant_;
  bool kivi_;
  std::vector<Pair> pairs_;
  // append()'s working memory, reused (one thread per cache): both layers' rows of the merged
  // tokens of one head, and the pairs' scratch.
  std::vector<float> merge_kp_, merge_vp_, merge_kc_, merge_vc_;
  cpu::MiniCacheScratch merge_scratch_;
};

}  // namespace kvsdk
