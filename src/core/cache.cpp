#include "core/cache.h"

#include <algorithm>
#include <limits>

#include "attention.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/policy.h"
#include "core/positions.h"
#include "core/quant_overlay.h"
#include "core/representation.h"
#include "kivi_attention.h"

namespace kvsdk {

namespace {

// Rows of f32 scratch per attention chunk: bounds the working set independent of cache length.
constexpr size_t kChunkTokens = 256;

}  // namespace

Cache::Cache(std::shared_ptr<Context> ctx, const Geometry& geometry, const kvsdk_policy& policy)
    : ctx_(std::move(ctx)), geometry_(geometry), policy_(policy), layers_(geometry.n_layers) {
  for (LayerState& l : layers_) {
    l.heads.resize(geometry_.n_kv_heads);
    if (policy_.method == KVSDK_METHOD_H2O) l.scores.resize(geometry_.n_kv_heads);
    if (quant_overlay(policy_)) quant_overlay_init(l, geometry_, policy_);
  }
  repr_ = make_representation(geometry_, policy_);
}

Cache::~Cache() { ctx_->release(charged_); }

void Cache::check_layer(uint32_t layer) const {
  if (layer >= geometry_.n_layers) {
    fail(KVSDK_E_OUT_OF_RANGE, "layer ", layer, " is out of range (the geometry has ",
         geometry_.n_layers, " layers)");
  }
}

void Cache::append(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                   const int32_t* positions) {
  check_layer(layer);
  check_positions(positions, n_tokens, "positions");  // before anything changes
  if (covered(layer)) {
    append_represented(layer, n_tokens, k, v, positions);
    return;
  }
  if (evicts()) {
    append_compressing(layer, n_tokens, k, v, positions);
    return;
  }
  const uint32_t dim = geometry_.head_dim;
  const uint64_t add = uint64_t(n_tokens) * geometry_.n_kv_heads * ExactStore::bytes_per_token(dim);
  // reserve() checks this cache's own budget (kvsdk_cache_set_budget) as well as the context's.
  if (!reserve(add)) {
    if (cache_budget_ && charged_ + add > cache_budget_) {
      fail(KVSDK_E_BUDGET, "appending ", n_tokens, " tokens to layer ", layer, " needs ", add,
           " bytes but the cache's own budget of ", cache_budget_, " bytes has ",
           cache_budget_ - std::min(charged_, cache_budget_), " free (policy '", policy_spec(policy_),
           "' does not compress this layer)");
    }
    fail(KVSDK_E_BUDGET, "appending ", n_tokens, " tokens to layer ", layer, " needs ", add,
         " bytes but the context has ", ctx_->available(), " of its ", ctx_->budget(),
         " budget bytes free (policy '", policy_spec(policy_), "' does not compress this layer)");
  }
  LayerState& L = layers_[layer];
  try {
    // Reserve first so the copy below cannot fail half-way.
    for (ExactStore& h : L.heads) {
      h.positions.reserve(h.size() + n_tokens);
      h.k.reserve((h.size() + n_tokens) * dim);
      h.v.reserve((h.size() + n_tokens) * dim);
    }
  } catch (...) {
    ctx_->release(add);
    throw;
  }
  const size_t row = geometry_.kv_elems_per_token();
  for (uint32_t head = 0; head < geometry_.n_kv_heads; ++head) {
    ExactStore& h = L.heads[head];
    const size_t old = h.size();
    h.positions.insert(h.positions.end(), positions, positions + n_tokens);
    h.k.resize((old + n_tokens) * dim);
    h.v.resize((old + n_tokens) * dim);
    for (size_t t = 0; t < n_tokens; ++t) {
      load_f16(geometry_.dtype, k, t * row + head * dim, dim, h.k.data() + (old + t) * dim);
      load_f16(geometry_.dtype, v, t * row + head * dim, dim, h.v.data() + (old + t) * dim);
    }
  }
  L.appended_tokens += n_tokens;
  charged_ += add;
}

bool Cache::covered(uint32_t layer) const { return repr_ && repr_->covers(layer); }

std::vector<TierRecord> Cache::tier_records(uint32_t layer) const {
  check_layer(layer);
  if (quant_overlay(policy_)) return quant_overlay_records(layers_[layer], layer);
  if (!covered(layer)) return {};
  return repr_->save(layer);
}

namespace {

// Drops a representation's planned eviction unless it was committed.
struct PlannedEviction {
  Representation* repr;
  bool pending = true;
  ~PlannedEviction() {
    if (pending) repr->drop_eviction();
  }
  void commit() noexcept {
    repr->commit_eviction();
    pending = false;
  }
};

}  // namespace

void Cache::append_represented(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                               const int32_t* positions) {
  // Everything that can fail comes before anything changes: the rows in f32, then an upper bound
  // of the growth reserved from the budget. When it does not fit, an evicting representation
  // (SmallKV) plans an eviction aside; it is committed only once the rest of the bound is
  // reserved, so a refused append keeps every row. The exact change is charged afterwards and
  // the rest returned.
  const size_t elems = n_tokens * geometry_.kv_elems_per_token();
  std::vector<float> kf(elems), vf(elems);
  load_f32(geometry_.dtype, k, 0, elems, kf.data());
  load_f32(geometry_.dtype, v, 0, elems, vf.data());
  // The change is measured over every covered layer: an append to one layer may change another
  // one's bytes (MiniCache merges a pair when its second layer arrives, releasing the rows of the
  // first that waited).
  const auto represented_bytes = [&] {
    uint64_t b = 0;
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      if (repr_->covers(l)) b += repr_->layer_bytes(l);
    }
    return b;
  };
  const uint64_t bound = repr_->append_bound(layer, n_tokens);
  uint64_t held = 0;  // bytes the context holds for this append beyond what the cache holds
  if (bound > 0 && !reserve(bound)) {
    const uint64_t target = target_bytes();
    const uint64_t want = charged_ + bound - std::min(target, charged_ + bound);
    PlannedEviction plan{repr_.get()};
    const uint64_t freed = repr_->plan_eviction(want, layer, n_tokens);
    // The evicted bytes stay charged to the context and go to the append.
    bool reserved = freed >= bound || reserve(bound - freed);
    uint64_t extra = reserved ? bound - std::min(bound, freed) : 0;
    if (!reserved && evicts() && target >= bound) {
      // SpindleKV (freed is 0): make room by evicting in the exact (deep) layers.
      compress_to(target - bound);
      reserved = reserve(bound);
      extra = bound;
    }
    if (!reserved) {
      fail(KVSDK_E_BUDGET, "appending ", n_tokens, " tokens to layer ", layer, " may need ",
           bound, " more bytes than the budget allows (policy '", policy_spec(policy_), "'",
           freed || evicts() ? ", even evicting what it can; nothing was evicted"
                                   : " does not evict", ")");
    }
    uint64_t evicted = 0;
    if (freed > 0) {
      const uint64_t full = represented_bytes();
      plan.commit();
      evicted = full - represented_bytes();  // == freed
      charged_ -= evicted;
    }
    held = evicted + extra;
  } else {
    held = bound;
  }
  const uint64_t before = represented_bytes();
  // Settles the charge: the exact change of the representation's bytes, the rest of `held`
  // returned to the context.
  const auto settle = [&](uint64_t after) {
    if (after >= before) {
      const uint64_t grown = after - before;
      ctx_->release(held - std::min(held, grown));
      charged_ += grown;
    } else {  // a merge released rows
      ctx_->release(held + (before - after));
      charged_ -= before - after;
    }
  };
  try {
    repr_->append(layer, n_tokens, kf.data(), vf.data(), positions);
  } catch (...) {
    // Only allocation can fail here (never after an eviction: its plan reserved what the append
    // needs); what the representation holds is what is charged.
    settle(represented_bytes());
    throw;
  }
  const uint64_t after = represented_bytes();
  if (after > before && after - before > held) {
    settle(after);
    fail(KVSDK_E_INTERNAL, "representation grew by ", after - before, " bytes, over its bound ",
         bound);
  }
  settle(after);
  layers_[layer].appended_tokens += n_tokens;
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
  check_layer(layer);
  if (!covered(layer)) {
    fail(KVSDK_E_UNSUPPORTED, "prefetch (speculative queries) is SpeCache's; policy '",
         policy_spec(policy_), "' does not use it");
  }
  const size_t n_rows = n_queries * geometry_.group_size();
  std::vector<float> q_rows(n_rows * geometry_.head_dim);
  std::vector<int32_t> row_pos(n_rows);
  // Fetched rows are budgeted (SpeCache): reserve every head's growth bound before fetching,
  // then charge the exact change and return the rest, as append_represented does.
  uint64_t bound = 0;
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) bound += repr_->prefetch_bound(layer, g);
  if (bound > 0 && !reserve(bound)) {
    fail(KVSDK_E_BUDGET, "prefetching into layer ", layer, " may need ", bound,
         " more bytes than the budget allows (policy '", policy_spec(policy_), "')");
  }
  const uint64_t before = repr_->layer_bytes(layer);
  const auto settle = [&] {
    const uint64_t after = repr_->layer_bytes(layer);
    if (after >= before) {
      ctx_->release(bound - std::min(bound, after - before));
      charged_ += after - before;
    } else {
      ctx_->release(bound + (before - after));
      charged_ -= before - after;
    }
  };
  try {
    for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
      pack_queries(g, n_queries, q, q_positions, q_rows.data(), row_pos.data());
      repr_->prefetch(layer, g, q_rows.data(), row_pos.data(), n_rows);
    }
  } catch (...) {
    settle();
    throw;
  }
  settle();
}

void Cache::attend(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions,
                   void* out) const {
  check_layer(layer);
  const uint32_t dim = geometry_.head_dim;
  const uint32_t group = geometry_.group_size();
  const size_t n_rows = n_queries * group;
  // Work on private buffers; `out` is written only once everything succeeded.
  std::vector<float> q_rows(n_rows * dim), out_rows(n_rows * dim), result(n_queries *
                                                                          geometry_.q_elems_per_token());
  std::vector<int32_t> row_pos(n_rows);
  std::vector<float> kbuf(kChunkTokens * dim), vbuf(kChunkTokens * dim);
  // Every KV head's query rows for the attention tap, which sees them once all heads succeeded.
  std::vector<float> tapped(attention_tap_ ? geometry_.n_kv_heads * n_rows * dim : 0);
  const bool represented = covered(layer);
  // State that attention updates (SmallKV's importance state, SpeCache's hit rate) is staged per
  // KV head and applied together at the end, so that a failure at any head changes nothing.
  struct Transaction {
    const Representation* repr = nullptr;
    ~Transaction() {
      if (repr) repr->abort_attend();
    }
  } tx;
  if (represented) {
    repr_->begin_attend();
    tx.repr = repr_.get();
  }
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
    pack_queries(g, n_queries, q, q_positions, q_rows.data(), row_pos.data());
    if (attention_tap_) {
      std::copy(q_rows.begin(), q_rows.end(), tapped.begin() + long(g * n_rows * dim));
    }
    if (represented) {
      repr_->attend(layer, g, q_rows.data(), row_pos.data(), n_rows, out_rows.data());
    } else {
      cpu::OnlineAttention att(q_rows.data(), row_pos.data(), n_rows, dim, geometry_.attn_scale);
      const ExactStore& s = layers_[layer].heads[g];
      if (!layers_[layer].quant.empty()) {
        cpu::kivi_attend(layers_[layer].quant[g], att);  // KIVI overlay: dequantized in chunks
      }
      for (size_t t0 = 0; t0 < s.size(); t0 += kChunkTokens) {
        const size_t n = std::min(kChunkTokens, s.size() - t0);
        load_f32(KVSDK_DTYPE_F16, s.k.data(), t0 * dim, n * dim, kbuf.data());
        load_f32(KVSDK_DTYPE_F16, s.v.data(), t0 * dim, n * dim, vbuf.data());
        att.add_chunk(kbuf.data(), vbuf.data(), s.positions.data() + t0, n);
      }
      att.finish(out_rows.data());
    }
    for (size_t i = 0; i < n_queries; ++i) {
      for (uint32_t j = 0; j < group; ++j) {
        const size_t h = size_t(g) * group + j;
        std::copy_n(out_rows.data() + (i * group + j) * dim, dim,
                    result.data() + i * geometry_.q_elems_per_token() + h * dim);
      }
    }
  }
  if (attention_tap_) {
    attention_tap_(layer, geometry_.n_kv_heads, tapped.data(), row_pos.data(), n_rows);
  }
  if (represented) {
    tx.repr = nullptr;
    repr_->commit_attend();
  }
  store_f32(geometry_.dtype, result.data(), result.size(), out, 0);
}

size_t Cache::head_tokens(uint32_t layer, uint32_t kv_head) const {
  check_layer(layer);
  if (kv_head >= geometry_.n_kv_heads) {
    fail(KVSDK_E_OUT_OF_RANGE, "kv_head ", kv_head, " is out of range (the geometry has ",
         geometry_.n_kv_heads, " KV heads)");
  }
  if (covered(layer)) return repr_->head_tokens(layer, kv_head);
  return held_rows(layers_[layer], kv_head);
}

size_t Cache::read(uint32_t layer, uint32_t kv_head, void* k, void* v, int32_t* positions,
                   size_t capacity) const {
  const size_t n = head_tokens(layer, kv_head);
  if (!k && !v && !positions) return n;
  KVSDK_REQUIRE(capacity >= n, "capacity_tokens is ", capacity, " but layer ", layer, " head ",
                kv_head, " holds ", n, " tokens");
  const size_t dim = geometry_.head_dim;
  if (covered(layer) || !layers_[layer].quant.empty()) {
    // Rows as attention sees them: dequantized / reconstructed.
    std::vector<float> kf(n * dim), vf(n * dim);
    if (covered(layer)) {
      repr_->read(layer, kv_head, kf.data(), vf.data(), positions);
    } else {
      read_held_rows(layers_[layer], kv_head, uint32_t(dim), kf.data(), vf.data(), positions);
    }
    if (k) store_f32(geometry_.dtype, kf.data(), n * dim, k, 0);
    if (v) store_f32(geometry_.dtype, vf.data(), n * dim, v, 0);
    return n;
  }
  const ExactStore& s = layers_[layer].heads[kv_head];
  if (k) store_f16(geometry_.dtype, s.k.data(), n * dim, k, 0);
  if (v) store_f16(geometry_.dtype, s.v.data(), n * dim, v, 0);
  if (positions) std::copy_n(s.positions.data(), n, positions);
  return n;
}

void Cache::layer_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) by_tier[i] = 0;
  const LayerState& L = layers_[layer];
  for (const ExactStore& h : L.heads) {
    by_tier[KVSDK_TIER_EXACT] += h.size() * ExactStore::kv_bytes_per_token(geometry_.head_dim);
    by_tier[KVSDK_TIER_METADATA] += h.size() * ExactStore::meta_bytes_per_token();
  }
  if (covered(layer)) repr_->add_bytes(layer, by_tier);
  quant_overlay_add_bytes(L, by_tier);  // KIVI overlay stores (none for other policies)
  for (const std::vector<float>& sc : L.scores) by_tier[KVSDK_TIER_METADATA] += sc.size() * 4;
  by_tier[KVSDK_TIER_METADATA] += L.window_q.size() * 4 + L.window_pos.size() * 4;
}

kvsdk_layer_stats Cache::layer_stats(uint32_t layer) const {
  check_layer(layer);
  kvsdk_layer_stats s{};
  s.struct_size = sizeof(s);
  s.layer = layer;
  const LayerState& L = layers_[layer];
  s.tokens_min_head = std::numeric_limits<uint64_t>::max();
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const uint64_t n = head_tokens(layer, h);
    s.tokens += n;
    s.tokens_min_head = std::min<uint64_t>(s.tokens_min_head, n);
    s.tokens_max_head = std::max<uint64_t>(s.tokens_max_head, n);
  }
  s.appended_tokens = L.appended_tokens;
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
  return s;
}

}  // namespace kvsdk
