// Policy 'smallkv' (SmallKV (docs/papers.md) §4): every layer. Per KV head, full rows (f16
// K+V: critical and recent tokens, KVSDK_TIER_EXACT), marginal rows (f16 V only,
// KVSDK_TIER_VALUE_ONLY), and per row its position and the proxy's accumulated attention
// (KVSDK_TIER_METADATA). Kernels: backends/cpu/smallkv.h.
//
//  - Until the budget is reached every token is kept full.
//  - Head matching (Eqs. 1-3) per large query head: Eq. 1 of the large model's queries over the
//    first match_tokens tokens of each layer (from attend), against Eq. 1 of every proxy head
//    (all layers, numbered layer * heads + head), Jaccard of the top 10% (at least 1) tokens.
//    A KV head is matched once its layer has attended the match_tokens-th token, or at the first
//    eviction with the tokens seen so far (the budget cannot wait). One mapping per query head
//    as in the paper; a GQA group's rows are selected with the sum of its heads' proxy scores.
//  - Critical-token scores: each row accumulates the matched proxy heads' attention over the
//    proxy's full cache at every step (Eq. 1 of the proxy, "saliency shift compensation"),
//    starting with the proxy's matching statistics.
//  - Eviction (evict): one byte cap per KV head for every head (water-filling to the target);
//    a head over the cap is split critical:recent:marginal = 2:1:2 (smallkv_split_budget, then
//    the marginal count fitted to the bytes a value-only row really costs) and selected by its
//    scores (smallkv_select); marginal rows drop K; evicted rows are gone (kvsdk keeps no
//    off-budget copy for smallkv, unlike the paper's CPU-memory migration).
//  - Attention (Eq. 6, smallkv_attend): full rows with the large model's softmax, marginal rows
//    with the matched proxy head's probabilities of the same step.
//  - Without a proxy: appends within the budget and attention over full rows work; eviction and
//    attention over marginal rows fail with KVSDK_E_STATE. The link is not saved.
#pragma once

#include <memory>
#include <vector>

#include "core/representation.h"
#include "repr/smallkv_proxy.h"

namespace kvsdk {

class Cache;

class SmallKvRepresentation final : public Representation {
 public:
  SmallKvRepresentation(const Geometry& geometry, const kvsdk_policy& policy);
  ~SmallKvRepresentation() override;

  // Links the proxy cache (checked by the caller: 'full', not serving another cache), or detaches
  // it (null). Throws KVSDK_E_GEOMETRY when a restored mapping names proxy heads `proxy` lacks.
  void set_proxy(Cache* proxy);
  bool has_proxy() const { return link_->proxy() != nullptr; }
  const Cache* proxy_cache() const { return link_->proxy(); }

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  // Also updates the importance state (matching statistics, mapping, row scores); bytes do not
  // change.
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  // Rows in position order; marginal rows have zero keys (their weights come from the proxy).
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  uint64_t evict(uint64_t bytes) override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  // For tests: the proxy head matched to each query head of `layer` (meaningful once matched).
  std::vector<uint32_t> mapping(uint32_t layer) const { return layers_[layer].mapping; }
  bool matched(uint32_t layer, uint32_t kv_head) const {
    return layers_[layer].heads[kv_head].matched;
  }
  size_t marginal_tokens(uint32_t layer, uint32_t kv_head) const {
    return layers_[layer].heads[kv_head].marg_pos.size();
  }

 private:
  struct Head {
    std::vector<int32_t> full_pos;     // critical + recent rows, position order
    std::vector<uint16_t> full_k, full_v;  // f16 [n_full][head_dim]
    std::vector<float> full_score;     // proxy's accumulated attention per row
    std::vector<int32_t> marg_pos;     // marginal rows (V only), position order
    std::vector<uint16_t> marg_v;      // f16 [n_marg][head_dim]
    std::vector<float> marg_score;
    bool stats_done = false;  // the layer attended its match_tokens-th token (Eq. 1 complete)
    bool matched = false;     // mapping of this head's query heads is set
    int64_t scores_from = 0;  // query positions above this add their proxy weights to scores
    size_t size() const { return full_pos.size() + marg_pos.size(); }
  };
  struct Layer {
    std::vector<Head> heads;
    bool started = false;            // first append charged the mapping and matching statistics
    std::vector<uint32_t> mapping;   // [n_q_heads] proxy head per query head (Eq. 3)
    std::vector<float> match_stats;  // [n_q_heads][match_tokens] Eq. 1; freed once all matched
  };

  uint64_t full_row_bytes() const;      // K + V + position + score
  uint64_t marginal_row_bytes() const;  // V + position + score
  uint64_t head_bytes(const Head& h) const;
  uint64_t fixed_bytes(const Layer& l) const;  // mapping + matching statistics
  uint64_t total_bytes() const;
  void accumulate_match_stats(uint32_t layer, uint32_t kv_head, const float* q_rows,
                              const int32_t* row_positions, size_t n_rows) const;
  void match_head(uint32_t layer, uint32_t kv_head) const;  // Eqs. 2-3, then the score backlog
  bool all_matched() const;
  void drop_finished_stats();
  // Bytes a head keeps under a cap of `cap` bytes (without changing it), and the change itself.
  uint64_t bytes_under_cap(const Head& h, uint64_t cap) const;
  void shrink_to_cap(Head& h, uint64_t cap);

  uint32_t match_tokens_;
  // Attention is where SmallKV observes both models, so matching and scores change in attend().
  mutable std::vector<Layer> layers_;
  std::shared_ptr<SmallKvProxyLink> link_;
};

}  // namespace kvsdk
