// The store interface (stage 3 of a policy, docs/papers.md; per method docs/representations.md):
// how the rows of a layer are stored, attended, read, counted, evicted and saved. Every storage
// layout is one subclass in its own file under src/repr/: the exact tier (exact_rows), KIVI (also
// the KIVI overlay of the eviction presets), SpindleKV, MiniCache, SmallKV and SpeCache; the
// algorithms themselves are the pure kernels of backends/cpu. Which method builds which store is
// the method-traits table's (core/method_traits.h).
//
// The Cache owns two stores: the representation of the layers a method compresses (none for full
// and the eviction presets) and the row store of the exact tier for the other layers, whose rows
// the selection stage of the eviction presets picks from (plan_keep). So SpindleKV's deep layers
// evict there with the eviction machinery of src/policy, and MiniCache's shallow layers stay
// exact and never evict. The Cache never asks which store it holds.
//
// Budget contract (enforced by Cache, which charges the context): before an append the cache
// reserves append_bound() — an upper bound of the bytes the append can add — and after it charges
// exactly the change of layer_bytes(), returning the rest. So a representation never has to
// predict data-dependent growth (codebook entries, retained tokens) exactly, and the budget is
// never exceeded. A representation that can evict (SmallKV) plans an eviction without changing
// anything (plan_eviction), and the Cache commits it (commit_eviction, no-throw) only once the
// bytes of what follows are reserved, or drops it; so a refused call keeps every row.
//
// Failure contract: append() may throw only before it changes anything (validation) or on
// allocation failure; read/save never change state; attend never changes rows or bytes, but
// SmallKV updates its importance state there (matching statistics, head mapping, row scores) and
// SpeCache its hit-rate measurement (mutable members): inside an attend transaction
// (begin_attend .. commit_attend, which Cache::attend opens around the KV heads of one layer)
// those updates are staged and applied together by commit_attend (no-throw) once every head
// succeeded, or dropped by abort_attend, so a failed attend changes nothing. restore() validates
// everything and throws kvsdk::Error KVSDK_E_CORRUPT for any inconsistency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "core/exact_store.h"
#include "core/geometry.h"
#include "core/tier_record.h"
#include "kvsdk.h"

namespace kvsdk {

class Context;

class Representation {
 public:
  Representation(const Geometry& geometry, const kvsdk_policy& policy)
      : geometry_(geometry), policy_(policy) {}
  virtual ~Representation() = default;
  Representation(const Representation&) = delete;
  Representation& operator=(const Representation&) = delete;

  // Whether `layer` is held here (false: the cache's exact tier and eviction policy hold it).
  virtual bool covers(uint32_t layer) const = 0;

  // Adds the budgeted bytes of `layer` into by_tier (kvsdk_tier slots). Every byte counts:
  // codes, scales, codebooks, indices, magnitudes, positions, slots, fetched rows.
  virtual void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const = 0;
  uint64_t layer_bytes(uint32_t layer) const {
    uint64_t t[KVSDK_TIER_SLOTS] = {};
    add_bytes(layer, t);
    uint64_t s = 0;
    for (uint64_t b : t) s += b;
    return s;
  }
  // Off-budget bytes (SpeCache's full-precision backing store); reported apart in stats.
  virtual uint64_t backing_bytes() const { return 0; }
  // Bytes of a device arena the store's layout covers (device stores; 0 on the host).
  virtual uint64_t device_reserved_bytes() const { return 0; }

  // An upper bound of how much the representation's bytes (layer_bytes summed over the covered
  // layers) can grow when `n_tokens` are appended to `layer`; usually only `layer` changes, but
  // MiniCache's merge of a layer pair also releases the partner layer's waiting rows.
  virtual uint64_t append_bound(uint32_t layer, size_t n_tokens) const = 0;
  // Appends `n_tokens` rows to a covered layer: k and v are f32 [n_tokens][n_kv_heads][head_dim]
  // (keys as the host gives them, i.e. after RoPE), positions [n_tokens] (already checked >= 0).
  virtual void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
                      const int32_t* positions) = 0;
  // The same rows in the geometry's host dtype (what kvsdk_cache_append receives). The default
  // converts them to f32 and calls append(); stores that keep the host's bits (ExactRows) read
  // them directly. Throws before changing anything, or on allocation failure.
  virtual void append_host(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                           const int32_t* positions);

  // Attention of one KV head of a covered layer: q_rows [n_rows][head_dim] (the queries of the
  // group's query heads, row r = query r / group, head r % group), row_positions [n_rows] for
  // causal masking (INT32_MAX sees everything). Writes out [n_rows][head_dim].
  virtual void attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                      const int32_t* row_positions, size_t n_rows, float* out) const = 0;
  // Attention of the first n_kv KV heads of a covered layer in one call: q_rows [n_kv][n_rows]
  // [head_dim] (each head's rows as attend() takes them), the same row_positions for every head,
  // out [n_kv][n_rows][head_dim]. The default attends head by head; device stores override it to
  // move the queries and outputs once and enqueue every head's kernels back to back.
  virtual void attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                            const int32_t* row_positions, size_t n_rows, float* out) const;
  // Attend transaction (see the failure contract above). Outside one, attend() applies its state
  // updates at once. Representations whose attend() changes nothing keep these no-ops.
  virtual void begin_attend() const noexcept {}
  virtual void commit_attend() const noexcept {}
  virtual void abort_attend() const noexcept {}

  // Rows one KV head of a covered layer holds, and those rows as attention sees them
  // (dequantized / reconstructed), in stored order: k, v [n][head_dim], positions [n]. Null
  // outputs are skipped.
  virtual size_t head_tokens(uint32_t layer, uint32_t kv_head) const = 0;
  virtual void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                    int32_t* positions) const = 0;
  // The same rows in the geometry's host dtype (what kvsdk_cache_read returns). The default
  // converts read()'s f32; stores that keep f16 rows (ExactRows) hand back their bits, NaN
  // payloads included.
  virtual void read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                         int32_t* positions) const;

  // Evicting representations plan an eviction that frees at least `bytes` if they can (fewer if
  // they cannot) and return how many bytes it frees, changing nothing: commit_eviction() applies
  // the plan (no-throw), drop_eviction() discards it (a new plan discards the previous one). It
  // may throw (KVSDK_E_STATE: SmallKV without its proxy; allocation), with nothing planned.
  // `append_layer` / `append_tokens` / `append_positions`: the append the eviction makes room for
  // (kNoAppend, 0, null: none); the plan reserves what that append needs, so that append() cannot
  // fail after the commit.
  // Non-evicting representations plan nothing and return 0 (the defaults).
  static constexpr uint32_t kNoAppend = UINT32_MAX;
  virtual uint64_t plan_eviction(uint64_t /*bytes*/, uint32_t /*append_layer*/,
                                 size_t /*append_tokens*/, const int32_t* /*append_positions*/) {
    return 0;
  }
  virtual void commit_eviction() noexcept {}
  virtual void drop_eviction() noexcept {}
  // Plans and commits at once (tests, and callers with nothing to reserve); returns the bytes
  // freed.
  uint64_t evict(uint64_t bytes) {
    const uint64_t freed = plan_eviction(bytes, kNoAppend, 0, nullptr);
    commit_eviction();
    return freed;
  }

  // SpeCache: speculative queries of the next step (same layout as attend's q_rows) pick the rows
  // the next attend() of this head uses in full precision. Others: KVSDK_E_UNSUPPORTED.
  virtual void prefetch(uint32_t layer, uint32_t kv_head, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows);
  // An upper bound of how much layer_bytes(layer) can grow in one prefetch() of `kv_head`
  // (SpeCache: fetch_tokens rows minus those fetched now); Cache::prefetch reserves it first.
  virtual uint64_t prefetch_bound(uint32_t /*layer*/, uint32_t /*kv_head*/) const { return 0; }
  // Whether prefetch() of different KV heads of one layer may run at the same time on different
  // threads of the context's pool (each head's selection and fetch touch only that head's state
  // and workspace()).
  virtual bool prefetch_reentrant() const { return false; }
  // SpeCache: keep the off-budget backing store in the file `path` (mmap) instead of host memory;
  // only before the first append. Others: KVSDK_E_UNSUPPORTED.
  virtual void set_backing_file(const std::string& path);
  // Fetch hit rate so far (SpeCache): the share of the real queries' attention mass on prefetched
  // rows, averaged over attend() calls that followed a prefetch(); -1 when not applicable.
  virtual double hit_rate() const { return -1.0; }
  // How many measurements hit_rate() averages (0 when not applicable).
  virtual uint64_t hit_rate_samples() const { return 0; }

  // --- Row selection: the stores of the exact tier (ExactRows, and KiviRows under a KIVI
  // overlay; src/repr) hold the rows the eviction presets' selection stage picks from. Other
  // stores keep the defaults (selects_rows() false; the rest throws KVSDK_E_INTERNAL).
  virtual bool selects_rows() const { return false; }
  // Positions of one head's rows, in stored order (head_tokens() of them).
  virtual const int32_t* row_positions(uint32_t layer, uint32_t kv_head) const;
  // Keys of rows [first, first + count) of one head as attention sees them, f32 [count][head_dim].
  virtual void load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                         float* dst) const;
  // The scoring kernel (backend_ops.h column_sums) run where a device store's rows are, so that
  // their keys never leave the device: col_sums[n_keys] (host, overwritten) for the host query
  // rows `q` over the head's rows [0, head_tokens) and then `keys`' rows [head_tokens, n_keys)
  // (an append's incoming rows, positions key_pos[head_tokens...]). Returns false (nothing done)
  // where the caller scores on the host through load_keys (host stores, KIVI overlays).
  virtual bool column_sums_here(uint32_t /*layer*/, uint32_t /*kv_head*/,
                                const backend::QueryRows& /*q*/,
                                const cpu::KeyChunkLoader& /*keys*/, const int32_t* /*key_pos*/,
                                size_t /*n_keys*/, float* /*col_sums*/) const {
    return false;
  }
  // The rows of an append that the selection stage may keep: k, v [n][n_kv_heads][head_dim] in the
  // geometry's host dtype, read in place from the caller's buffers.
  struct IncomingRows {
    const void* k;
    const void* v;
    const int32_t* positions;
    size_t n;
  };
  // Plans that `layer` keep, per KV head, the rows keep[h] (strictly ascending candidate indices:
  // the stored rows first, then `incoming`'s), without changing what the store holds, and returns
  // the layer's bytes after the commit. May throw (allocation) with nothing planned for the
  // layer. A later plan of the same layer replaces it. `incoming` must stay valid until
  // commit_keep(), which applies every planned layer (no-throw, no allocation); drop_keep()
  // discards them.
  virtual uint64_t plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                             const IncomingRows* incoming);
  virtual void commit_keep() noexcept {}
  virtual void drop_keep() noexcept {}
  // The allocation stage's new plan after a global re-plan (XKV, PyramidKV, a profile or the
  // uniform cap): rows per KV head per layer, slack included. Device stores partition their
  // arena by it (best effort: a plan that does not fit is left to the stores' growth).
  virtual void follow_allocation(const std::vector<uint64_t>& /*caps*/) noexcept {}
  // Budget planning of row stores: the bytes of one layer-token (a row in every KV head) plus
  // `extra_per_row` per row, and how many layer-tokens `bytes` hold. Exact for ExactRows; an
  // estimate for KiviRows (residual windows, ragged blocks), whose plans the cache checks exactly.
  virtual uint64_t layer_token_bytes(uint64_t extra_per_row) const;
  virtual uint64_t layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const;
  virtual bool token_bytes_estimated() const { return false; }
  // The exact tier's f16 rows of one head (ExactRows), which snapshots write as typed row tables;
  // null for every other store. restore_exact() adopts them for one layer (validated by the
  // caller's geometry: one ExactStore per KV head).
  virtual const ExactStore* exact_rows(uint32_t /*layer*/, uint32_t /*kv_head*/) const {
    return nullptr;
  }
  virtual void restore_exact(uint32_t layer, std::vector<ExactStore> heads);
  // Frees host copies that exact_rows() made of rows kept elsewhere (a device store stages them
  // for a snapshot); the snapshot calls end with it. Host stores have none.
  virtual void release_host_staging() const noexcept {}
  // A device store's exact f16 rows of one head where they are (`rows`: backend memory) with
  // their positions' host mirror, for kernels that read them in place (SmallKV's proxy); false
  // for host stores and stores without plain f16 rows. Valid until the store changes.
  virtual bool device_rows(uint32_t /*layer*/, uint32_t /*kv_head*/, backend::F16Rows& /*rows*/,
                           const int32_t*& /*host_positions*/) const {
    return false;
  }

  // --- Truncation (Cache::truncate, kvsdk_cache_truncate): removing every row of `layer` whose
  // position is >= `position`, so that the store holds exactly what it would hold had those rows
  // never been appended: the remaining rows, codes, codebooks, merges, thresholds and statistics
  // bit for bit. truncate_refusal() says whether the store can: empty when it can (or when the
  // layer holds no such row), else why not, which the cache reports with KVSDK_E_STATE, changing
  // nothing. It changes nothing itself. truncate() then removes the rows (no-throw, no
  // allocation). The cache calls truncate() for every layer with the same position, and only
  // after truncate_refusal() returned empty for every layer, so a store of layer pairs may cut a
  // pair on the call of either layer. What the cache itself keeps (H2O's scores, observation
  // windows, the row counts) and the evictions of the selection stage are the cache's to check.
  // Every store states its own rule (docs/truncation.md): a store that cannot undo anything
  // returns a reason whenever the layer holds such a row.
  virtual std::string truncate_refusal(uint32_t layer, int32_t position) const = 0;
  virtual void truncate(uint32_t layer, int32_t position) noexcept = 0;

  // The log-sum-exp of each query row's scaled scores over one KV head's rows as attention sees
  // them (causal as attend(); -inf when the row sees none): with attend()'s output, what merges
  // the attention of two stores (a shared prefix and a conversation's own rows) exactly. A second
  // pass over the keys through read(), in `scratch` (reused: no allocation once grown).
  struct LseScratch {
    std::vector<float> k, v;
    std::vector<int32_t> pos;
  };
  void attention_lse(uint32_t layer, uint32_t kv_head, const float* q_rows,
                     const int32_t* row_positions, size_t n_rows, float* lse,
                     LseScratch& scratch) const;

  // Snapshot: every store of a covered layer as tier records, and the inverse. restore() is
  // called on a fresh representation with the records of one layer, in the order save() gave.
  virtual std::vector<TierRecord> save(uint32_t layer) const = 0;
  virtual void restore(uint32_t layer, const std::vector<TierRecord>& records) = 0;

  const Geometry& geometry() const { return geometry_; }
  const kvsdk_policy& policy() const { return policy_; }

  // The kernel table this store runs (backends/backend_ops.h): the context's backend, which the
  // cache sets at creation; the optimized CPU table until then. `threads`: the size of the
  // context's pool (one workspace per thread slot).
  void set_ops(const backend::Ops& ops, size_t threads = 1) {
    ops_ = &ops;
    ws_.clear();
    ws_.resize(threads);
  }
  const backend::Ops& ops() const { return *ops_; }
  // Whether attend() of different KV heads of one layer may run at the same time on different
  // threads of the context's pool (ThreadPool slots): true for stores whose attend reads only
  // their rows and works in workspace().
  virtual bool attend_reentrant() const { return false; }
  // Split-K (Cache::attend): whether attend_range() can attend a head's rows in token ranges
  // (false: whole heads only). Stores that say so are attend_reentrant() too, and their ranges
  // of one head may run at the same time on different pool slots.
  virtual bool attend_splits() const { return false; }
  // The rows [first, first + count) of the head (of head_tokens(layer, kv_head), in the order
  // attend() reads them) into the softmax state `out` over n_rows rows, in workspace(); the
  // states of a head's ranges merge by ops().merge_partials into attend()'s result up to rounding.
  virtual void attend_range(uint32_t layer, uint32_t kv_head, const float* q_rows,
                            const int32_t* row_positions, size_t n_rows, size_t first,
                            size_t count, const backend::PartialState& out) const;

 protected:
  // The backend's working memory for this store's kernels on the calling thread's pool slot,
  // created on first use and then reused.
  backend::Workspace& workspace() const;
  // attend()'s queries as the backend takes them.
  backend::QueryRows query_rows(const float* q_rows, const int32_t* row_positions,
                                size_t n_rows) const {
    return {q_rows, row_positions, n_rows, geometry_.head_dim, geometry_.attn_scale};
  }

  // append_host()'s f32 rows, reused (one thread per cache).
  mutable std::vector<float> host_k_, host_v_;
  // Copies KV head `head`'s rows out of append()'s interleaved k/v [n][n_kv_heads][head_dim]
  // into k_out/v_out [n][head_dim].
  void head_rows(const float* k, const float* v, size_t n, uint32_t head, float* k_out,
                 float* v_out) const;

  Geometry geometry_;
  kvsdk_policy policy_;
  const backend::Ops* ops_ = &backend::cpu_optimized();
  mutable std::vector<backend::WorkspaceHandle> ws_ = std::vector<backend::WorkspaceHandle>(1);
};

// The store of the layers `policy` compresses (method_traits(policy).make_store), or null when
// the policy keeps every layer in the exact tier (full and the eviction presets). Throws
// kvsdk::Error for invalid parameters.
std::unique_ptr<Representation> make_representation(const Geometry& geometry,
                                                    const kvsdk_policy& policy);
// The row store of the layers no representation covers: ExactRows, or KiviRepresentation under a
// KIVI overlay (kivi_overlay(policy)). Defined in src/repr/method_table.cpp.
std::unique_ptr<Representation> make_row_store(const Geometry& geometry,
                                               const kvsdk_policy& policy);
// The same on a device backend's context (CUDA): DeviceRows, or DeviceKivi under a KIVI overlay
// of a method that runs on the device. Throws KVSDK_E_UNSUPPORTED for policies without a device
// path.
std::unique_ptr<Representation> make_device_row_store(const Geometry& geometry,
                                                      const kvsdk_policy& policy, Context& ctx);

}  // namespace kvsdk
