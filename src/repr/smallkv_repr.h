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
//    off-budget copy for smallkv, unlike the paper's CPU-memory migration). An eviction that
//    makes room for an append fills to the rows' byte target minus policy.evict_slack of it, so
//    the next appends fit without selecting again; explicit compression fits exactly. A shrunk
//    head is built into the head's spare buffers and swapped in at the commit: once warmed up, an
//    eviction allocates nothing.
//  - Attention (Eq. 6, smallkv_attend): full rows with the large model's softmax, marginal rows
//    with the matched proxy head's probabilities of the same step.
//  - Without a proxy: appends within the budget and attention over full rows work; eviction and
//    attention over marginal rows fail with KVSDK_E_STATE. The link is not saved.
//  - Failures change nothing: an eviction (matching included) is planned aside and committed by
//    the Cache only once the call's bytes are reserved; attend() inside an attend transaction
//    stages its importance updates per KV head and commit_attend() applies them together.
//  - Where the f16 rows live is this class's one seam (the rows_* hooks below): here in each
//    Head's vectors; a device store (src/repr/device_smallkv.h) overrides the hooks to keep them
//    in its arena and leaves everything else (matching, scores, selection, records) to this code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/representation.h"
#include "repr/smallkv_proxy.h"
#include "smallkv.h"

namespace kvsdk {

class Cache;

class SmallKvRepresentation : public Representation {
 public:
  SmallKvRepresentation(const Geometry& geometry, const kvsdk_policy& policy);
  ~SmallKvRepresentation() override;

  // Links the proxy cache (checked by the caller: 'full', not serving another cache), or detaches
  // it (null). Throws KVSDK_E_GEOMETRY when a restored mapping names proxy heads `proxy` lacks.
  void set_proxy(Cache* proxy);
  bool has_proxy() const { return link_->proxy() != nullptr; }
  // kvsdk_cache_set_proxy_wait: how long calls wait for a proxy running on another thread.
  void set_proxy_wait(uint32_t ms) { link_->set_wait_ms(ms); }
  const Cache* proxy_cache() const { return link_->proxy(); }

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  // Also updates the importance state (matching statistics, mapping, row scores); bytes do not
  // change. Inside an attend transaction the updates wait for commit_attend().
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  // The same for every KV head of the layer, the rows' kernels of several heads together (every
  // head of a decode step; a long prefill's heads one by one, bounding the proxy weights kept).
  void attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const override;
  void begin_attend() const noexcept override;
  void commit_attend() const noexcept override;
  void abort_attend() const noexcept override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  // Rows in position order; marginal rows have zero keys (their weights come from the proxy).
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  // Matches every head not matched yet (the budget cannot wait for match_tokens tokens), then
  // water-fills one byte cap per KV head; throws KVSDK_E_STATE without a proxy.
  uint64_t plan_eviction(uint64_t bytes, uint32_t append_layer, size_t append_tokens,
                         const int32_t* append_positions) override;
  void commit_eviction() noexcept override;
  void drop_eviction() noexcept override;
  // Truncation: only rows that no importance update saw (see the .cpp): rows appended after the
  // layer's last state-changing attend, eviction or restore, and only while the proxy link holds
  // no query of the removed positions.
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
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

 protected:
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
    // Truncation bookkeeping (not saved; see truncate_refusal()):
    int32_t newest_held = -1;     // the newest position any head holds (-1: none)
    int32_t frozen_through = -1;  // rows at positions <= this may not be cut (-1: none)
    // The smallest position of the append that started the layer: kNotStarted before it,
    // kUnknown after a restore (the snapshot does not say).
    int64_t first_min = kNotStarted;
    // Per KV head, the other buffer of a double buffer (not state: not saved, not counted): an
    // eviction builds a shrunk head here and commit_eviction() swaps it with the head, so the
    // replaced head's buffers are the next eviction's and no eviction allocates once both grew.
    std::vector<Head> spare;
  };
  static constexpr int64_t kNotStarted = INT64_MAX, kUnknown = INT64_MIN;

  // Head matching of one KV head (Eqs. 2-3), computed without changing anything: the proxy head
  // of each query head of its group, and the proxy's Eq. 1 over the head's first `n` rows.
  struct Match {
    std::vector<uint32_t> map;  // [group]
    std::vector<float> proxy;   // [proxy heads][n]
    size_t n = 0;
  };
  // Importance updates of one attend() of one KV head, applied by apply().
  struct AttendUpdate {
    uint32_t layer = 0, kv_head = 0;
    std::vector<float> stats;  // the group's new matching statistics [group][match_tokens]
    bool has_stats = false;
    bool stats_done = false;   // the head's new stats_done
    bool matched_now = false;  // matched in this attend: map and scores_from below
    std::vector<uint32_t> map;
    int64_t scores_from = 0;
    std::vector<float> full_score, marg_score;  // the new row scores
    bool has_scores = false;
    int32_t held_through = -1;  // the layer's newest held position when it was computed
  };
  // A planned eviction: heads matched by it (mapping, scores with the proxy's statistics) and the
  // new contents of the heads it shrinks (their flags and scores already those after matching).
  struct MatchedHead {
    uint32_t layer = 0, kv_head = 0;
    std::vector<uint32_t> map;
    std::vector<float> full_score;
    int64_t scores_from = 0;
  };
  struct ShrunkHead {  // its new contents: layers_[layer].spare[kv_head]
    uint32_t layer = 0, kv_head = 0;
  };
  struct EvictionPlan {
    bool active = false;
    std::vector<MatchedHead> matched;
    std::vector<ShrunkHead> shrunk;
  };

  // --- The seam: where the heads' f16 rows live --------------------------------------------------
  // Here the rows (full_k, full_v, marg_v) sit in each Head's vectors. A store that keeps them
  // elsewhere overrides every hook, and then Head's row vectors are empty except in a host copy
  // (host_head()) or while an eviction or a restore hands it new contents.
  //
  // The layer's heads as they are (the counts: full_pos and marg_pos) and their bookkeeping.
  const Layer& layer_state(uint32_t layer) const { return layers_[layer]; }
  Layer& layer_state(uint32_t layer) { return layers_[layer]; }
  // Whether the rows are in the heads' vectors (true here).
  virtual bool rows_in_heads() const { return true; }
  // Writes `n` appended rows of every head of `layer` (k, v [n][n_kv_heads][head_dim] f32; the
  // positions) after each head's full rows, before the bookkeeping counts them: on a throw the
  // heads are as before.
  virtual void rows_append(uint32_t layer, size_t n, const float* k, const float* v,
                           const int32_t* positions);
  // The first `count` full keys of a head, as f32 (Eq. 1 of the matching).
  virtual void rows_full_keys(uint32_t layer, uint32_t kv_head, size_t count, float* out) const;
  // Eq. 6's halves for the KV heads [first, first + n) of a layer (q_rows and out [n][n_rows]
  // [head_dim], the heads' rows as attend() takes them; row_positions shared): the backend's
  // attend_smallkv over each head's full rows into out, then smallkv_add_marginal on out with
  // the proxy's probabilities of each head's marginal rows (weights[i]; a head without marginal
  // rows has none and is left as it is).
  struct HeadWeights {
    const float* marginal = nullptr;  // row r's weights at marginal + r * stride
    size_t stride = 0;
  };
  virtual void rows_attend_full(uint32_t layer, uint32_t first, uint32_t n, const float* q_rows,
                                const int32_t* row_positions, size_t n_rows, float* out) const;
  virtual void rows_add_marginal(uint32_t layer, uint32_t first, uint32_t n, const float* q_rows,
                                 const int32_t* row_positions, size_t n_rows,
                                 const HeadWeights* weights, float* out) const;
  // The head with its row vectors filled: the head itself here; elsewhere a copy into `scratch`.
  virtual const Head& host_head(uint32_t layer, uint32_t kv_head, Head& scratch) const;
  // An eviction was planned (plan_: the shrunk heads' new contents in their layers' spare
  // heads): make room now for them and for `append_tokens` more full rows in every head of
  // `append_layer` (kNoAppend: none), so that neither the commit nor that append lacks room.
  virtual void rows_plan(uint32_t append_layer, size_t append_tokens);
  // The planned eviction was committed: the shrunk heads (now in `heads`) hold their new rows.
  virtual void rows_commit() noexcept {}
  // The eviction planned was dropped (rows_plan's room may go).
  virtual void rows_drop() noexcept {}
  // A restore's heads of `layer` (their vectors filled), before they replace the layer's.
  virtual void rows_restore(uint32_t layer, std::vector<Head>& heads) { (void)layer, (void)heads; }
  // truncate() cut the layer's heads to the rows before a position (their counts say how many).
  virtual void rows_truncated(uint32_t layer) noexcept { (void)layer; }
  // The host table (and its working memory) that computes the proxy's probabilities over the
  // proxy's rows, which are on the host: ops() here.
  virtual const backend::Ops& proxy_ops() const { return ops(); }
  virtual backend::Workspace& proxy_workspace() const { return workspace(); }
  const EvictionPlan& eviction_plan() const { return plan_; }
  Cache* linked_proxy() const { return link_->proxy(); }

 private:
  uint64_t full_row_bytes() const;      // K + V + position + score
  uint64_t marginal_row_bytes() const;  // V + position + score
  uint64_t head_bytes(const Head& h) const;
  // Bytes an eviction that makes room for an append frees beyond a cap of `cap` bytes of rows.
  uint64_t slack_bytes(uint64_t cap) const;
  uint64_t fixed_bytes(const Layer& l) const;  // mapping + matching statistics
  uint64_t total_bytes() const;
  // Eq. 1 of the large model's queries over the first match_tokens tokens of one KV head, added
  // to a copy of its group's statistics in `u` (u.stats_done set when complete).
  void accumulate_match_stats(uint32_t layer, uint32_t kv_head, const float* q_rows,
                              const int32_t* row_positions, size_t n_rows,
                              AttendUpdate& u) const;
  // `stats`: the group's matching statistics [group][match_tokens], or null (none kept).
  Match compute_match(uint32_t layer, uint32_t kv_head, const float* stats) const;
  // The proxy's accumulated attention so far starts the rows' scores (added to full_score).
  void add_match_scores(const Match& m, float* full_score) const;
  void apply(AttendUpdate& u) const noexcept;
  bool all_matched() const;
  // Every head is matched: the proxy's matching statistics go, and the proxy heads this cache
  // reads are final, so a proxy on its own thread may compute their probabilities
  // (SmallKvProxyLink::set_read_heads, once per link).
  void on_all_matched() const noexcept;
  void drop_finished_stats() noexcept;
  // Bytes a head keeps under a cap of `cap` bytes (without changing it), and the head it becomes
  // (into `out`, reusing its capacity; not `h`): `full_score` its row scores (after matching),
  // `extra` rows of capacity for a later append.
  uint64_t bytes_under_cap(const Head& h, uint64_t cap) const;
  void shrunk_to_cap(const Head& h, const float* full_score, uint64_t cap, size_t extra,
                     Head& out);
  // plan_eviction() once the proxy is checked (it drops what this planned if this throws).
  uint64_t plan_shrink(uint64_t bytes, uint32_t append_layer, size_t append_tokens);
  bool shrunk_in_plan(uint32_t layer, uint32_t kv_head) const;

  uint32_t match_tokens_;
  // Attention is where SmallKV observes both models, so matching and scores change in attend().
  mutable std::vector<Layer> layers_;
  std::shared_ptr<SmallKvProxyLink> link_;
  // Attend transaction: updates staged per KV head until commit_attend().
  mutable bool staging_ = false;
  mutable std::vector<AttendUpdate> staged_;
  mutable std::vector<AttendUpdate> spare_;  // spent updates whose buffers attend() reuses
  void recycle_staged() const noexcept;
  EvictionPlan plan_;  // the planned eviction (active until committed or dropped)
  // plan_eviction()'s working memory, reused: the index in plan_.matched of each head matched by
  // the plan ([layer][kv_head], -1: none), a head's rows in position order with their scores and
  // whether they have keys, and the selection.
  struct MergedRow {
    int32_t position;
    bool full;
    uint32_t index;
  };
  std::vector<int> matched_at_;
  Head host_copy_;  // a head's rows on the host while plan_eviction() shrinks it (rows elsewhere)
  std::vector<MergedRow> evict_rows_;
  std::vector<float> evict_scores_;
  std::vector<uint8_t> evict_has_key_;
  cpu::SmallKvSelectScratch select_scratch_;
  cpu::SmallKvSelection selection_;
  // attend_range() of the heads [first, first + n) of a layer (attend, attend_heads).
  void attend_range(uint32_t layer, uint32_t first, uint32_t n, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const;
  // Its working memory, reused: per head of the call, its update, whether its proxy weights it,
  // from which query position its scores grow, and the proxy's weights over its rows
  // [n_rows][rows] (stride rows); one proxy head's part of them, the rows' positions, and which
  // query rows map to the proxy head at hand (with their positions).
  struct HeadAttend {
    AttendUpdate u;
    bool proxied = false;
    int64_t scores_from = 0;
    std::vector<float> w;
    const float* weights = nullptr;
    size_t stride = 0;
  };
  mutable std::vector<HeadAttend> heads_;
  mutable std::vector<HeadWeights> head_weights_;
  mutable std::vector<float> attend_part_;
  mutable std::vector<int32_t> attend_wanted_, attend_rpos_;
  mutable std::vector<size_t> attend_rows_;
};

}  // namespace kvsdk
