// The cache orchestrator: policy, budget and layers. Rows live in stores (core/representation.h):
// the representation of the layers a method compresses, and the exact tier's row store for the
// others. Nothing here depends on which method or store holds a layer; what a method does comes
// from its traits (core/method_traits.h).
#include "core/cache.h"

#include <algorithm>
#include <limits>

#include "core/pending_plan.h"
#include "core/policy.h"
#include "repr/device_rows.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/positions.h"

namespace kvsdk {

Cache::Cache(std::shared_ptr<Context> ctx, const Geometry& geometry, const kvsdk_policy& policy)
    : ctx_(std::move(ctx)),
      geometry_(geometry),
      // KVSDK_QUANT_RESIDUAL_AUTO resolved once, so that the stores and snapshots hold a value.
      policy_(resolve_auto_weight_bits(resolve_auto_residual(policy, geometry.head_dim))),
      traits_(method_traits(policy_)),
      layers_(geometry.n_layers),
      max_position_(geometry.n_layers, -1),
      exact_floor_(geometry.n_layers, 0) {
  for (LayerPolicyState& l : layers_) {
    if (traits_.scores_rows()) l.scores.resize(geometry_.n_kv_heads);
  }
  if (ctx_->ops().device_memory) {
    // Device backends (CUDA): every layer in the context's device arena, for the policies that
    // have a device path (the row store refuses the others); a method's device store holds the
    // layers it compresses.
    if (traits_.make_device_store) repr_ = traits_.make_device_store(geometry_, policy_, *ctx_);
    rows_ = make_device_row_store(geometry_, policy_, *ctx_);
  } else {
    repr_ = make_representation(geometry_, policy_);
    rows_ = make_row_store(geometry_, policy_);
  }
  scratch_.sums.set_ops(ctx_->host_ops());
  if (repr_) repr_->set_ops(ctx_->ops(), ctx_->pool().size());
  rows_->set_ops(ctx_->ops(), ctx_->pool().size());
}

Cache::~Cache() { ctx_->release(charged_); }

void Cache::check_layer(uint32_t layer) const {
  if (layer >= geometry_.n_layers) {
    fail(KVSDK_E_OUT_OF_RANGE, "layer ", layer, " is out of range (the geometry has ",
         geometry_.n_layers, " layers)");
  }
}

bool Cache::covered(uint32_t layer) const { return repr_ && repr_->covers(layer); }

const Representation& Cache::store(uint32_t layer) const {
  return covered(layer) ? *repr_ : *rows_;
}

Representation& Cache::store(uint32_t layer) { return covered(layer) ? *repr_ : *rows_; }

bool Cache::selects(uint32_t layer) const { return traits_.evicts() && !covered(layer); }

const ExactStore& Cache::exact_rows(uint32_t layer, uint32_t kv_head) const {
  static const ExactStore kNone;
  const ExactStore* s = store(layer).exact_rows(layer, kv_head);
  return s ? *s : kNone;
}

std::vector<int32_t> Cache::row_positions(uint32_t layer, uint32_t kv_head) const {
  const size_t n = rows_->head_tokens(layer, kv_head);
  const int32_t* p = n ? rows_->row_positions(layer, kv_head) : nullptr;
  return p ? std::vector<int32_t>(p, p + n) : std::vector<int32_t>{};
}

LayerState Cache::layer_image(uint32_t l) const {
  check_layer(l);
  LayerState out;
  static_cast<LayerPolicyState&>(out) = layers_[l];
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) out.heads.push_back(exact_rows(l, h));
  return out;
}

void Cache::append(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                   const int32_t* positions) {
  check_mutable("append");
  check_layer(layer);
  check_positions(positions, n_tokens, "positions");  // before anything changes
  // (An upper bound: a refused append leaves it raised, which only makes truncation stricter.)
  note_positions(layer, positions, n_tokens);
  if (selects(layer)) {
    append_compressing(layer, n_tokens, k, v, positions);
  } else {
    append_stored(layer, n_tokens, k, v, positions);
  }
}

std::vector<TierRecord> Cache::tier_records(uint32_t layer) const {
  check_layer(layer);
  return store(layer).save(layer);
}

uint64_t Cache::stored_bytes() const {
  // An append to one layer may change another one's bytes (MiniCache merges a pair when its
  // second layer arrives, releasing the rows of the first that waited), so changes are measured
  // over every layer.
  uint64_t b = 0;
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) b += store(l).layer_bytes(l);
  return b;
}

void Cache::append_stored(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                          const int32_t* positions) {
  // Everything that can fail comes before anything changes: an upper bound of the growth is
  // reserved from the budget. When it does not fit, an evicting store (SmallKV) plans an eviction
  // aside; it is committed only once the rest of the bound is reserved, so a refused append keeps
  // every row. The exact change is charged afterwards and the rest returned.
  Representation& s = store(layer);
  const uint64_t bound = s.append_bound(layer, n_tokens);
  BudgetReservation r = reservation();
  if (bound > 0 && !r.reserve(bound)) {
    const uint64_t target = target_bytes();
    const uint64_t want = charged_ + bound - std::min(target, charged_ + bound);
    PlannedEviction plan(s);
    const uint64_t freed = s.plan_eviction(want, layer, n_tokens, positions);
    // The evicted bytes stay charged to the context and go to the append.
    bool reserved = freed >= bound || r.reserve(bound - freed);
    if (!reserved && traits_.evicts() && target >= bound) {
      // SpindleKV (its codebooks free nothing): make room by evicting in the exact (deep) layers.
      compress_to(target - bound, /*slack=*/true);
      reserved = r.reserve(bound);
    }
    if (!reserved) {
      const bool own = cache_budget_ && charged_ + bound > cache_budget_;
      fail(KVSDK_E_BUDGET, "appending ", n_tokens, " tokens to layer ", layer, " needs up to ",
           bound, " more bytes but ",
           own ? "the cache's own budget of " + std::to_string(cache_budget_) + " bytes has " +
                     std::to_string(cache_budget_ - std::min(charged_, cache_budget_)) + " free"
               : "the context has " + std::to_string(ctx_->available()) + " of its " +
                     std::to_string(ctx_->budget()) + " budget bytes free",
           " (policy '", policy_spec(policy_), "'",
           freed || traits_.evicts() ? ", even evicting what it can; nothing was evicted"
                                     : " does not evict this layer",
           ")");
    }
    if (freed > 0) {
      const uint64_t full = stored_bytes();
      note_eviction();
      plan.commit();
      r.take_from_charge(full - stored_bytes());  // == freed
    }
  }
  const uint64_t before = stored_bytes();
  try {
    s.append_host(layer, n_tokens, k, v, positions);
  } catch (...) {
    // Only allocation can fail here (never after an eviction: its plan reserved what the append
    // needs); what the stores hold is what is charged.
    r.settle(before, stored_bytes());
    throw;
  }
  const uint64_t over = r.settle(before, stored_bytes());
  layers_[layer].appended_tokens += n_tokens;
  if (over > 0) {
    fail(KVSDK_E_INTERNAL, "a store of policy '", policy_spec(policy_), "' grew ", over,
         " bytes over its bound ", bound);
  }
}

void Cache::pack_queries(uint32_t kv_head, size_t n_queries, const void* q,
                         const int32_t* q_positions, float* q_rows, int32_t* row_pos) const {
  const uint32_t dim = geometry_.head_dim, group = geometry_.group_size();
  for (size_t i = 0; i < n_queries; ++i) {
    for (uint32_t j = 0; j < group; ++j) {
      const size_t r = i * group + j;
      const size_t h = size_t(kv_head) * group + j;
      load_f32(geometry_.dtype, q, i * geometry_.q_elems_per_token() + h * dim, dim,
               q_rows + r * dim);
      row_pos[r] = q_positions ? q_positions[i] : std::numeric_limits<int32_t>::max();
    }
  }
}

void Cache::prefetch(uint32_t layer, size_t n_queries, const void* q,
                     const int32_t* q_positions) {
  check_mutable("prefetch");
  check_layer(layer);
  Representation& s = store(layer);
  if (!traits_.prefetches) {
    fail(KVSDK_E_UNSUPPORTED, "prefetch (speculative queries) is SpeCache's; policy '",
         policy_spec(policy_), "' does not use it");
  }
  const uint32_t n_kv = geometry_.n_kv_heads;
  const size_t n_rows = n_queries * geometry_.group_size();
  const size_t head_elems = n_rows * geometry_.head_dim;
  std::vector<float>& q_rows = at_least(scratch_.q_rows, n_kv * head_elems);
  std::vector<int32_t>& row_pos = at_least(scratch_.row_pos, n_rows);
  // Fetched rows are budgeted (SpeCache): reserve every head's growth bound before fetching,
  // then charge the exact change and return the rest.
  uint64_t bound = 0;
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) bound += s.prefetch_bound(layer, g);
  BudgetReservation r = reservation();
  if (bound > 0 && !r.reserve(bound)) {
    fail(KVSDK_E_BUDGET, "prefetching into layer ", layer, " may need ", bound,
         " more bytes than the budget allows (policy '", policy_spec(policy_), "')");
  }
  const uint64_t before = s.layer_bytes(layer);
  try {
    for (uint32_t g = 0; g < n_kv; ++g) {
      pack_queries(g, n_queries, q, q_positions, q_rows.data() + g * head_elems, row_pos.data());
    }
    const auto head = [&](size_t g) {
      s.prefetch(layer, uint32_t(g), q_rows.data() + g * head_elems, row_pos.data(), n_rows);
    };
    // Heads on the pool as attend() runs them (each head's selection does not depend on the
    // thread, so the fetched rows are the same for every n_threads). A failure in one head
    // leaves the others' new fetches in place, as the serial loop leaves the heads before it
    // (kvsdk_cache_prefetch's documented limitation).
    if (s.prefetch_reentrant() && ctx_->pool().size() > 1 &&
        s.head_tokens(layer, 0) * n_rows >= kParallelAttendWork) {
      ctx_->pool().run(n_kv, head);
    } else {
      for (uint32_t g = 0; g < n_kv; ++g) head(g);
    }
  } catch (...) {
    r.settle(before, s.layer_bytes(layer));
    throw;
  }
  const uint64_t over = r.settle(before, s.layer_bytes(layer));
  if (over > 0) {
    fail(KVSDK_E_INTERNAL, "prefetch grew layer ", layer, " ", over, " bytes over its bound");
  }
}

void Cache::attend(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions,
                   void* out) const {
  check_layer(layer);
  // A frozen cache's stores may be attended by its conversations on other threads at the same
  // time (merge_prefix holds the same lock).
  std::unique_lock<std::mutex> shared;
  if (frozen_) shared = std::unique_lock<std::mutex>(prefix_lock_);
  const uint32_t dim = geometry_.head_dim;
  const uint32_t group = geometry_.group_size();
  const uint32_t n_kv = geometry_.n_kv_heads;
  const size_t n_rows = n_queries * group, head_elems = n_rows * dim;
  // Work on private buffers; `out` is written only once everything succeeded. Every KV head's
  // query rows are packed first (the attention tap sees them too), so heads can run in parallel.
  std::vector<float>& q_rows = at_least(scratch_.q_rows, n_kv * head_elems);
  std::vector<float>& out_rows = at_least(scratch_.out_rows, n_kv * head_elems);
  std::vector<float>& result =
      at_least(scratch_.result, n_queries * geometry_.q_elems_per_token());
  std::vector<int32_t>& row_pos = at_least(scratch_.row_pos, n_rows);
  const Representation& s = store(layer);
  // State that attention updates (SmallKV's importance state, SpeCache's hit rate) is staged per
  // KV head and applied together at the end, so that a failure at any head changes nothing.
  struct Transaction {
    const Representation* store;
    ~Transaction() {
      if (store) store->abort_attend();
    }
  } tx{&s};
  s.begin_attend();
  for (uint32_t g = 0; g < n_kv; ++g) {
    pack_queries(g, n_queries, q, q_positions, q_rows.data() + g * head_elems, row_pos.data());
  }
  const auto head = [&](size_t g) {
    s.attend(layer, uint32_t(g), q_rows.data() + g * head_elems, row_pos.data(), n_rows,
             out_rows.data() + g * head_elems);
  };
  // Heads in parallel on the context's pool when the store allows it and the work outweighs a
  // wake-up of the workers (~tens of microseconds). Each head's result does not depend on the
  // thread that computes it, so outputs are the same for every n_threads.
  // Long heads of a store that attends token ranges are split over the pool instead (split-K).
  if (!attend_split(s, layer, n_rows, q_rows.data(), row_pos.data(), out_rows.data())) {
    if (s.attend_reentrant() && ctx_->pool().size() > 1 &&
        s.head_tokens(layer, 0) * n_rows >= kParallelAttendWork) {
      ctx_->pool().run(n_kv, head);
    } else {
      s.attend_heads(layer, n_kv, q_rows.data(), row_pos.data(), n_rows, out_rows.data());
    }
  }
  if (prefix_) merge_prefix(layer, q_rows.data(), row_pos.data(), n_rows, out_rows.data());
  for (uint32_t g = 0; g < n_kv; ++g) {
    for (size_t i = 0; i < n_queries; ++i) {
      for (uint32_t j = 0; j < group; ++j) {
        const size_t h = size_t(g) * group + j;
        std::copy_n(out_rows.data() + g * head_elems + (i * group + j) * dim, dim,
                    result.data() + i * geometry_.q_elems_per_token() + h * dim);
      }
    }
  }
  if (attention_tap_) attention_tap_(layer, n_kv, q_rows.data(), row_pos.data(), n_rows);
  tx.store = nullptr;
  s.commit_attend();
  store_f32(geometry_.dtype, result.data(), n_queries * geometry_.q_elems_per_token(), out, 0);
}

size_t Cache::head_tokens(uint32_t layer, uint32_t kv_head) const {
  check_layer(layer);
  if (kv_head >= geometry_.n_kv_heads) {
    fail(KVSDK_E_OUT_OF_RANGE, "kv_head ", kv_head, " is out of range (the geometry has ",
         geometry_.n_kv_heads, " KV heads)");
  }
  return store(layer).head_tokens(layer, kv_head);
}

size_t Cache::read(uint32_t layer, uint32_t kv_head, void* k, void* v, int32_t* positions,
                   size_t capacity) const {
  const size_t n = head_tokens(layer, kv_head);
  if (!k && !v && !positions) return n;
  KVSDK_REQUIRE(capacity >= n, "capacity_tokens is ", capacity, " but layer ", layer, " head ",
                kv_head, " holds ", n, " tokens");
  // Rows as attention sees them (dequantized / reconstructed), in the host dtype.
  store(layer).read_host(layer, kv_head, k, v, positions);
  return n;
}

void Cache::layer_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) by_tier[i] = 0;
  store(layer).add_bytes(layer, by_tier);
  const LayerPolicyState& L = layers_[layer];
  for (const std::vector<float>& sc : L.scores) by_tier[KVSDK_TIER_METADATA] += sc.size() * 4;
  by_tier[KVSDK_TIER_METADATA] += L.window_q.size() * 4 + L.window_pos.size() * 4;
}

kvsdk_layer_stats Cache::layer_stats(uint32_t layer) const {
  check_layer(layer);
  kvsdk_layer_stats s{};
  s.struct_size = sizeof(s);
  s.layer = layer;
  s.tokens_min_head = std::numeric_limits<uint64_t>::max();
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const uint64_t n = head_tokens(layer, h);
    s.tokens += n;
    s.tokens_min_head = std::min<uint64_t>(s.tokens_min_head, n);
    s.tokens_max_head = std::max<uint64_t>(s.tokens_max_head, n);
  }
  s.appended_tokens = layers_[layer].appended_tokens;
  layer_bytes(layer, s.bytes_by_tier);
  for (uint64_t b : s.bytes_by_tier) s.bytes += b;
  return s;
}

kvsdk_cache_stats Cache::stats() const {
  kvsdk_cache_stats s{};
  s.struct_size = sizeof(s);
  s.n_layers = geometry_.n_layers;
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    const kvsdk_layer_stats ls = layer_stats(l);
    s.tokens += ls.tokens;
    s.appended_tokens += ls.appended_tokens;
    s.bytes += ls.bytes;
    for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) s.bytes_by_tier[i] += ls.bytes_by_tier[i];
    s.full_bytes +=
        ls.appended_tokens * geometry_.n_kv_heads * ExactStore::bytes_per_token(geometry_.head_dim);
  }
  s.backing_bytes = repr_ ? repr_->backing_bytes() : 0;
  s.budget_bytes = ctx_->budget();
  s.context_used_bytes = ctx_->used();
  if (ctx_->arena()) {
    s.device_arena_bytes = ctx_->budget();
    s.device_reserved_bytes =
        rows_->device_reserved_bytes() + (repr_ ? repr_->device_reserved_bytes() : 0);
  }
  return s;
}

}  // namespace kvsdk
