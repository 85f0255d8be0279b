// A cache: one conversation's KV cache for one model geometry, stored per layer and KV head in
// tiers, charged against its context's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/budget_reservation.h"
#include "core/context.h"
#include "core/method_traits.h"
#include "core/representation.h"
#include "core/store_view.h"
#include "kvsdk.h"
#include "policy/score_scratch.h"

namespace kvsdk {

class Cache final : public StoreView {
 public:
  Cache(std::shared_ptr<Context> ctx, const Geometry& geometry, const kvsdk_policy& policy);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Snapshot restore (formats/): a cache holding `layers`, already validated against `geometry`,
  // with their bytes charged to `ctx`. Throws KVSDK_E_BUDGET (charging nothing) when they do not
  // fit. Defined in cache_restore.cpp.
  // `tiers[l]` are the store records of layer l (Representation::save), empty for exact layers;
  // they are validated here (KVSDK_E_CORRUPT).
  static std::unique_ptr<Cache> restore(std::shared_ptr<Context> ctx, const Geometry& geometry,
                                        const kvsdk_policy& policy,
                                        std::vector<LayerState> layers,
                                        const std::vector<std::vector<TierRecord>>& tiers = {});
  // An independent copy in the same context (kvsdk_cache_fork): the same rows, store records and
  // policy state, restored through the snapshot path (so it continues exactly as this cache
  // would), charged to the context. Throws KVSDK_E_BUDGET (charging nothing) when it does not
  // fit. Defined in cache_restore.cpp. `into`: another context to make the copy in (the same
  // geometry and policy; e.g. a host context for a device cache's targeted save).
  std::unique_ptr<Cache> fork(std::shared_ptr<Context> into = nullptr) const;
  // Snapshot support: the compressed stores of `layer` (empty when the layer is exact).
  std::vector<TierRecord> tier_records(uint32_t layer) const override;

  const Geometry& geometry() const override { return geometry_; }
  const kvsdk_policy& policy() const override { return policy_; }
  const Context& context() const { return *ctx_; }
  const std::shared_ptr<Context>& context_ptr() const { return ctx_; }
  const LayerPolicyState& layer(uint32_t l) const override { return layers_[l]; }
  // The exact rows of one head (empty for layers another store holds); snapshots write them.
  const ExactStore& exact_rows(uint32_t layer, uint32_t kv_head) const override;
  std::vector<int32_t> row_positions(uint32_t layer, uint32_t kv_head) const override;
  // The exact rows of one head where a device store keeps them (Representation::device_rows);
  // false when they are on the host or in another store.
  bool device_rows(uint32_t layer, uint32_t kv_head, backend::F16Rows& rows,
                   const int32_t*& host_positions) const {
    return !covered(layer) && rows_->device_rows(layer, kv_head, rows, host_positions);
  }
  uint64_t context_budget() const override { return ctx_->budget(); }
  // Frees the host copies of device-resident rows that a snapshot staged (exact_rows()).
  void release_host_staging() const noexcept {
    rows_->release_host_staging();
    if (repr_) repr_->release_host_staging();
  }
  // Layer `l` as a snapshot carries it (a copy: tests and tools).
  LayerState layer_image(uint32_t l) const;

  // Each throws kvsdk::Error and leaves the cache unchanged on failure.
  void append(uint32_t layer, size_t n_tokens, const void* k, const void* v,
              const int32_t* positions);
  void attend(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions,
              void* out) const;
  // Copies one head's rows out in host dtype; returns the row count. Null outputs are skipped.
  size_t read(uint32_t layer, uint32_t kv_head, void* k, void* v, int32_t* positions,
              size_t capacity) const;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;

  // Shared prefixes (kvsdk_cache_freeze, kvsdk_cache_create_on_prefix; cache_prefix.cpp). A frozen
  // cache is read-only (every mutator throws KVSDK_E_STATE) and may be the prefix of caches in
  // its context, which attend over its rows and their own ones without copying them; it stays
  // alive (and charged, once) as long as any of them does. Throws KVSDK_E_UNSUPPORTED for
  // policies whose attention changes their state (smallkv, specache).
  void freeze();
  bool frozen() const { return frozen_; }
  // A new, empty cache of `policy` whose rows continue `prefix` (frozen; KVSDK_E_STATE
  // otherwise), in its context and geometry.
  static std::unique_ptr<Cache> on_prefix(std::shared_ptr<const Cache> prefix,
                                          const kvsdk_policy& policy);
  const std::shared_ptr<const Cache>& prefix() const { return prefix_; }
  const StoreView* prefix_view() const override { return prefix_.get(); }
  // Snapshot loading: a restored cache continues `prefix` (frozen, same context and geometry).
  void attach_prefix(std::shared_ptr<const Cache> prefix) { prefix_ = std::move(prefix); }

  // Removes every token at a position >= `position` from every layer and tier (kvsdk_cache_truncate;
  // cache_truncate.cpp), leaving exactly the cache that never held them, or throws
  // KVSDK_E_STATE (nothing changed) where some layer cannot be exact: a store's own reason
  // (Representation::truncate_refusal), or an eviction or observation since those tokens came.
  void truncate(int32_t position);
  // The smallest position every layer can be truncated to from the cache's side (evictions,
  // H2O scores, windows that slid): the stores may refuse more (tests and messages).
  int32_t exact_floor(uint32_t layer) const { return exact_floor_[layer]; }

  // Compression (cache_compress.cpp). Each throws kvsdk::Error; the cache is unchanged on failure.
  void observe(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions);
  void compress();
  void set_budget(uint64_t bytes);  // per-cache byte budget, 0 = none
  uint64_t budget() const { return cache_budget_; }
  // Layer-tokens (one row in every KV head of a layer) the budget can hold besides the fixed
  // metadata; UINT64_MAX when no budget applies.
  uint64_t token_capacity() const;
  uint64_t token_bytes() const;  // bytes of one layer-token, metadata included
  // A fixed per-layer allocation (tokens per KV head); an empty vector returns to the policy.
  void set_allocation(const std::vector<uint64_t>& tokens);
  // Per-layer shares of an allocation profile; an empty vector returns to the policy.
  void set_profile_shares(const std::vector<double>& shares);
  std::vector<uint64_t> allocation() const;  // tokens per KV head, per layer, now
  // Snapshot support: the allocation-stage state, and its restore (validated by the reader).
  PolicyRuntime policy_runtime() const override;
  void restore_policy_runtime(PolicyRuntime rt);

  kvsdk_cache_stats stats() const;
  kvsdk_layer_stats layer_stats(uint32_t layer) const override;
  // The store of the compressed layers, or null (full and eviction presets).
  const Representation* representation() const { return repr_.get(); }
  Representation* representation() { return repr_.get(); }
  // The store that holds `layer`: the representation where it covers the layer, else the row
  // store of the exact tier (ExactRows, or KIVI stores under a KIVI overlay).
  const Representation& store(uint32_t layer) const;
  // SpeCache: speculative queries of the next step for `layer` (host dtype, like attend).
  void prefetch(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions);
  // Called by attend() once every KV head's attention succeeded, with the packed query rows of
  // every KV head (q_rows [n_kv_heads][n_rows][head_dim]; row_positions [n_rows], the same for
  // every head), before the outputs are written (SmallKV reads a proxy cache's queries this way).
  // If it throws, attend() fails. Empty = none.
  using AttentionTap = std::function<void(uint32_t layer, uint32_t n_kv_heads,
                                          const float* q_rows, const int32_t* row_positions,
                                          size_t n_rows)>;
  void set_attention_tap(AttentionTap tap) { attention_tap_ = std::move(tap); }
  bool has_attention_tap() const { return static_cast<bool>(attention_tap_); }
  uint64_t charged_bytes() const { return charged_; }
  // Selection passes so far: how many times the selection stage chose which rows to keep
  // because a layer had to evict (tests and tools; with policy.evict_slack, about one per
  // slack's worth of appended rows instead of one per appended row). Not saved in snapshots.
  uint64_t selection_passes() const { return selection_passes_; }

 private:
  Representation& store(uint32_t layer);
  void check_layer(uint32_t layer) const;
  // Every mutator starts here: a frozen cache changes no more (KVSDK_E_STATE).
  void check_mutable(const char* what) const;
  // attend() over a shared prefix: merges each KV head's output over the own rows (out_rows)
  // with the prefix's, weighted by their log-sum-exps (cache_prefix.cpp).
  void merge_prefix(uint32_t layer, const float* q_rows, const int32_t* row_pos, size_t n_rows,
                    float* out_rows) const;
  bool covered(uint32_t layer) const;
  // Split-K (cache_split_attend.cpp): attends every KV head of `layer` in token ranges on the
  // context's pool, each head's ranges merged in order into out_rows, and returns true; false
  // (nothing done) when the store attends whole heads only, the call has more than
  // kSplitMaxRows query rows over all heads (queries x query heads), or no head is long enough
  // to split.
  bool attend_split(const Representation& s, uint32_t layer, size_t n_rows, const float* q_rows,
                    const int32_t* row_pos, float* out_rows) const;
  BudgetReservation reservation() { return BudgetReservation(*ctx_, charged_, cache_budget_); }
  // The queries of KV head `kv_head`'s group as f32 rows [n_queries * group][head_dim].
  void pack_queries(uint32_t kv_head, size_t n_queries, const void* q, const int32_t* q_positions,
                    float* q_rows, int32_t* row_pos) const;
  // Appends to a layer that no selection stage evicts: the store's growth bound reserved first.
  void append_stored(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                     const int32_t* positions);
  uint64_t stored_bytes() const;  // the stores' bytes over every layer
  void layer_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const;

  // Compression internals (cache_compress.cpp).
  using Incoming = Representation::IncomingRows;  // with the layer it goes to
  struct Append {
    uint32_t layer;
    Incoming rows;
  };
  // Scores of one layer's candidate rows, per KV head. Their buffers are reused from one
  // selection pass to the next (SelectScratch), so `computed` and `recency_only` say what they
  // hold now.
  struct HeadScores {
    bool computed = false;      // this pass scored the layer
    bool recency_only = true;   // no signal: select by recency (the heads are stale)
    std::vector<std::vector<float>> heads;  // [kv_head][row]
    bool empty() const { return recency_only; }
  };
  void append_compressing(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                          const int32_t* positions);
  // Appends without selection when the budget takes the rows as they are; false: nothing changed.
  bool append_unselected(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                         const int32_t* positions);
  uint64_t score_bytes_per_row() const;  // H2O's accumulated score
  uint64_t fixed_bytes() const;
  uint64_t target_bytes() const;
  uint64_t layer_length(uint32_t layer, const Append* in) const;
  uint64_t protected_rows(uint32_t layer, uint64_t length) const;
  // Scores the layer into scratch_.select.scores[layer] (once per pass).
  void score_layer(uint32_t layer, const Append* in);
  std::vector<float> importance_vector(uint32_t layer, const HeadScores& scores,
                                       uint64_t length) const;
  // The allocation stage's caps (tokens per KV head, per layer) into `caps`.
  void plan_caps(uint64_t capacity, const Append* in, std::vector<uint64_t>& caps);
  // Returns false (nothing changed) only for a row store whose per-token bytes are an estimate
  // (KIVI) when the eviction would exceed the budget; fit_caps() then shrinks the caps and
  // retries. `needed` receives the bytes the eviction would have needed. Otherwise throws
  // KVSDK_E_BUDGET when the caps do not fit.
  bool apply_caps(const std::vector<uint64_t>& caps, const Append* in, uint64_t target,
                  uint64_t* needed);
  void fit_caps(std::vector<uint64_t>& caps, const Append* in, uint64_t target);
  uint64_t capacity_for(uint64_t bytes) const;  // layer-tokens `bytes` can hold
  // Rows a layer that must evict down to `cap` rows evicts beyond that (policy.evict_slack).
  uint64_t slack_rows(uint64_t cap) const;
  // Evicts until the cache holds at most `target` bytes. `slack`: layers that evict go down to
  // their cap minus slack_rows() (automatic compression on append and observe); explicit
  // compression (kvsdk_cache_compress, budgets, allocations) fits exactly.
  void compress_to(uint64_t target, bool slack = false);
  // Starts a selection pass: no layer is scored yet.
  void begin_pass();
  // Whether the selection stage evicts the rows of `layer` (an eviction preset's row store).
  bool selects(uint32_t layer) const;

  uint64_t cache_budget_ = 0;           // 0 = only the context budget applies
  std::vector<uint64_t> fixed_alloc_;   // host-set allocation (planner), tokens per layer
  std::vector<double> profile_shares_;  // applied allocation profile
  std::vector<uint64_t> last_caps_;     // allocation of the last global compression
  // (the four above are PolicyRuntime; kept as members for the hot paths)

  std::shared_ptr<Context> ctx_;
  Geometry geometry_;
  kvsdk_policy policy_;
  const MethodTraits& traits_;
  std::vector<LayerPolicyState> layers_;
  std::unique_ptr<Representation> repr_;  // the compressed layers' store; null: none
  std::unique_ptr<Representation> rows_;  // the exact tier's row store (the other layers)
  AttentionTap attention_tap_;
  uint64_t charged_ = 0;  // bytes this cache holds charged to ctx_
  // Working memory of attend() and prefetch(), reused (one thread per cache): once grown to the
  // largest call, the decode path allocates nothing here.
  // Row-tokens (query rows x stored tokens of a head) from which attend() runs KV heads on the
  // context's threads.
  static constexpr size_t kParallelAttendWork = 16384;
  struct Scratch {
    std::vector<float> q_rows, out_rows, result;
    std::vector<int32_t> row_pos;
    // observe(): the queries as f32, their positions, H2O's added scores per KV head.
    std::vector<float> obs_q;
    std::vector<int32_t> obs_pos;
    std::vector<std::vector<float>> h2o_added;
    ScoreScratch sums;  // importance signals (observe, score_layer)
  };
  mutable Scratch scratch_;
  // Split-K: a head of T >= 2 * kSplitTokens rows is attended in min(kMaxSplitParts,
  // T / kSplitTokens) ranges of equal length (rounded up to 64 tokens), from its first row; the
  // split depends on T alone, never on n_threads, so results are the same on any pool.
  static constexpr size_t kSplitTokens = 2048, kMaxSplitParts = 16, kSplitMaxRows = 256;
  struct SplitPart {
    uint32_t head;
    size_t first, count;
  };
  struct SplitScratch {
    std::vector<SplitPart> parts;              // [n_kv * kMaxSplitParts]
    std::vector<backend::PartialState> states;  // one per part, into `state`
    std::vector<float> state;                  // [n_kv * kMaxSplitParts][n_rows][head_dim + 2]
  };
  mutable SplitScratch split_;
  // Working memory of the selection stage (append_compressing, compress_to), reused: once grown
  // to the cache's size, a decode step that evicts allocates nothing (the allocation stage's
  // global re-plans aside, which XKV and profiles compute afresh).
  struct SelectScratch {
    std::vector<HeadScores> scores;                        // [layer]
    std::vector<uint64_t> lengths, prot, caps, plan, slack;  // [layer]
    std::vector<std::vector<std::vector<uint32_t>>> keep;  // [layer][kv_head]
    std::vector<char> planned;                             // [layer]: keep[layer] is a plan
    std::vector<int32_t> pos;                              // candidate positions of one head
    std::vector<float> raw;                                // window scores of one head
  };
  SelectScratch select_;
  uint64_t selection_passes_ = 0;

  // Shared prefixes: the frozen cache this one continues (null: none), whether this one is
  // frozen, and in a prefix the lock that serializes its dependents' attention over it (its
  // stores keep per-call scratch, and dependents may run on different threads).
  std::shared_ptr<const Cache> prefix_;
  bool frozen_ = false;
  mutable std::mutex prefix_lock_;
  struct PrefixScratch {
    std::vector<float> out, lse_own, lse_prefix;
    Representation::LseScratch lse;
  };
  mutable PrefixScratch prefix_scratch_;

  // Truncation bookkeeping (cache_truncate.cpp), per layer; not saved in snapshots (a restored
  // cache starts from restored_floor()). max_position_: an upper bound of the positions the layer
  // ever held (-1: none). exact_floor_: the positions at or above which truncation is exact from
  // the cache's side: an eviction (any layer's: the allocation stage weighs all layers) or an
  // observation that changed the layer's state (H2O's scores, a window that slid) depended on
  // every token held then, and so moves it past them.
  std::vector<int32_t> max_position_, exact_floor_;
  void note_positions(uint32_t layer, const int32_t* positions, size_t n);
  void note_eviction();  // every layer's floor past what it held
  // An observation of `layer` with queries at `q_positions` (INT32_MAX: no position, sees all).
  void note_observation(uint32_t layer, const int32_t* q_positions, size_t n);
  // After a restore: each layer's bound from what it holds, and a floor past it when the policy's
  // history (evictions, scores, windows) is unknown.
  void restored_floor();
};

}  // namespace kvsdk

namespace kvsdk::format {
struct JournalBase;
}

struct kvsdk_cache {
  // Shared: a frozen cache stays alive while caches that continue it hold it as their prefix.
  std::shared_ptr<kvsdk::Cache> impl;
  // What the last snapshot save/load of this cache recorded, so that kvsdk_cache_save_delta can
  // append exactly what changed since (formats/journal.h). Null until the first save or load.
  std::shared_ptr<kvsdk::format::JournalBase> journal;
};
