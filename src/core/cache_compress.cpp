// The compression half of the cache orchestrator: observe (importance signals), compress
// (allocation across layers, then per-KV-head selection), automatic compression on append, and
// the byte-budget -> tokens-per-layer conversion. The algorithms themselves live in src/policy.
//
// Budget invariant: charged_ always equals the bytes of every tier and all metadata; a change is
// planned completely (selections computed, memory reserved) before anything is mutated, and the
// budget is charged before bytes grow, so the context never holds more than its budget, not even
// between two steps of one call.
#include <algorithm>
#include <limits>
#include <numeric>

#include "core/cache.h"
#include "core/pending_plan.h"
#include "core/policy.h"
#include "util/growth.h"
#include "core/representation.h"
#include "policy/allocation.h"
#include "policy/importance.h"
#include "policy/selection.h"
#include "util/dtype.h"
#include "util/error.h"

namespace kvsdk {

namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

}  // namespace

uint64_t Cache::score_bytes_per_row() const { return traits_.scores_rows() ? sizeof(float) : 0; }

uint64_t Cache::token_bytes() const {
  // Per KV head: the row store's row (f16 key + value and the int32 position, or a fully
  // quantized KIVI row: an estimate) and H2O's f32 accumulated score.
  return rows_->layer_token_bytes(score_bytes_per_row());
}

uint64_t Cache::capacity_for(uint64_t bytes) const {
  // Exact for exact rows; for KIVI rows an estimate (apply_caps checks the real bytes and fit_caps
  // shrinks the caps when it was too optimistic).
  return rows_->layer_token_capacity(bytes, score_bytes_per_row());
}

uint64_t Cache::fixed_bytes() const {
  uint64_t b = 0;
  for (const LayerPolicyState& L : layers_) b += L.window_q.size() * 4 + L.window_pos.size() * 4;
  // Layers a representation covers are not evicted here (their exact stores are empty, so their
  // length and cap are 0): their bytes are fixed, and the token capacity is what they leave.
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    if (covered(l)) b += repr_->layer_bytes(l);
  }
  return b;
}

uint64_t Cache::target_bytes() const {
  uint64_t t = cache_budget_ ? cache_budget_ : kUnlimited;
  if (ctx_->budget() != 0) t = std::min(t, charged_ + ctx_->available());
  return t;
}

uint64_t Cache::token_capacity() const {
  const uint64_t target = target_bytes();
  if (target == kUnlimited) return kUnlimited;
  const uint64_t fixed = fixed_bytes();
  return target > fixed ? capacity_for(target - fixed) : 0;
}

uint64_t Cache::protected_rows(uint32_t /*layer*/, uint64_t length) const {
  // SnapKV keeps the observation window itself: the newest obs_window rows (whatever number of
  // window queries the budget let the layer hold).
  return std::min<uint64_t>(uint64_t(policy_.obs_window), length);
}

uint64_t Cache::layer_length(uint32_t layer, const Append* in) const {
  // Rows the selection stage chooses from: the row store's (none where a representation holds
  // the layer), then an append's.
  return rows_->head_tokens(layer, 0) + (in && in->layer == layer ? in->rows.n : 0);
}

std::vector<uint64_t> Cache::allocation() const {
  std::vector<uint64_t> a(geometry_.n_layers);
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) a[l] = head_tokens(l, 0);  // any tier
  return a;
}

PolicyRuntime Cache::policy_runtime() const {
  return PolicyRuntime{cache_budget_, fixed_alloc_, profile_shares_, last_caps_};
}

void Cache::restore_policy_runtime(PolicyRuntime rt) {
  cache_budget_ = rt.cache_budget;
  fixed_alloc_ = std::move(rt.fixed_alloc);
  profile_shares_ = std::move(rt.profile_shares);
  last_caps_ = std::move(rt.last_caps);
}

// Scores of every candidate row (stored rows, then the incoming ones) per KV head.
Cache::HeadScores Cache::layer_scores(uint32_t layer, const Append* in) const {
  const LayerPolicyState& L = layers_[layer];
  const uint32_t dim = geometry_.head_dim;
  const size_t held = rows_->head_tokens(layer, 0);
  const size_t n = layer_length(layer, in);
  HeadScores out;
  if (traits_.scores_rows()) {
    out.resize(geometry_.n_kv_heads);
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      out[h] = L.scores[h];
      out[h].resize(n, 0.0f);  // incoming tokens have not been attended to yet
    }
    return out;
  }
  if (!traits_.uses_window() || L.window_pos.empty() || n == 0) return out;  // recency only
  const policy::QueryBlock window{L.window_q.data(), L.window_pos.data(), L.window_pos.size()};
  const size_t prot = size_t(protected_rows(layer, n));
  out.resize(geometry_.n_kv_heads);
  std::vector<int32_t> pos(n);
  std::vector<float> raw(n);
  policy::ScoreScratch scratch;  // one allocation of the kernel's logits for every head
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    std::copy_n(rows_->row_positions(layer, h), held, pos.begin());
    if (n > held) std::copy_n(in->rows.positions, in->rows.n, pos.begin() + held);
    const size_t row = geometry_.kv_elems_per_token();
    auto load = [&](size_t first, size_t count, float* dst) {
      // Held rows as attention sees them (dequantized under a KIVI overlay), then incoming rows.
      const size_t from_held = first < held ? std::min(count, held - first) : 0;
      if (from_held) rows_->load_keys(layer, h, first, from_held, dst);
      dst += from_held * dim;
      for (size_t t = first + from_held; t < first + count; ++t, dst += dim) {
        load_f32(geometry_.dtype, in->rows.k, (t - held) * row + size_t(h) * dim, dim, dst);
      }
    };
    policy::window_scores(window, geometry_, h, load, pos.data(), n, raw.data(), scratch);
    // Pool the context part (everything before the observation window); the window itself is
    // always kept, so its scores are never compared.
    out[h].assign(n, 0.0f);
    policy::pool_scores(raw.data(), n - prot, policy_.pool_kernel,
                        kvsdk_pool_kind(policy_.pool_kind), out[h].data());
  }
  return out;
}

// XKV importance vector w_i of one layer (XKV Eq. (3), Fig. 8): the pooled window attention of
// the context part, averaged over KV heads. Without an observed window every token weighs 1.
std::vector<float> Cache::importance_vector(uint32_t layer, const HeadScores& scores,
                                            uint64_t length) const {
  const size_t prot = size_t(protected_rows(layer, length));
  std::vector<float> w(length - prot, scores.empty() ? 1.0f : 0.0f);
  for (const std::vector<float>& hs : scores) {
    for (size_t t = 0; t < w.size(); ++t) w[t] += hs[t] / float(scores.size());
  }
  return w;
}

std::vector<uint64_t> Cache::plan_caps(uint64_t capacity, const Append* in,
                                       std::vector<HeadScores>& scores,
                                       std::vector<bool>& scored) const {
  const uint32_t n_layers = geometry_.n_layers;
  std::vector<uint64_t> lengths(n_layers), prot(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) {
    lengths[l] = layer_length(l, in);
    prot[l] = protected_rows(l, lengths[l]);
  }
  if (!fixed_alloc_.empty()) return fixed_alloc_;
  if (!profile_shares_.empty()) return policy::allocate_by_shares(profile_shares_, capacity);
  switch (traits_.allocation) {
    case Allocation::kPyramid:
      return policy::allocate_pyramid(lengths, prot, capacity, policy_.schedule_alpha,
                                      policy_.schedule_beta);
    case Allocation::kPyramidUncovered: {
      // SpindleKV §3.3, Eq. (5) and (6) over the deep (evicting) layers only: layer 0 of the
      // schedule is the boundary layer. Codebook layers keep their (empty) exact length.
      std::vector<uint64_t> deep_len, deep_prot;
      for (uint32_t l = 0; l < n_layers; ++l) {
        if (!covered(l)) deep_len.push_back(lengths[l]), deep_prot.push_back(prot[l]);
      }
      const std::vector<uint64_t> deep = policy::allocate_pyramid(
          deep_len, deep_prot, capacity, policy_.schedule_alpha, policy_.schedule_beta);
      std::vector<uint64_t> caps(lengths);
      for (uint32_t l = 0, i = 0; l < n_layers; ++l) {
        if (!covered(l)) caps[l] = deep[i++];
      }
      return caps;
    }
    case Allocation::kXkv: {
      const uint64_t total_prot = std::accumulate(prot.begin(), prot.end(), uint64_t(0));
      if (capacity <= total_prot) return policy::allocate_uniform(prot, capacity);
      std::vector<std::vector<float>> w(n_layers);
      for (uint32_t l = 0; l < n_layers; ++l) {
        if (!scored[l]) scores[l] = layer_scores(l, in), scored[l] = true;
        w[l] = importance_vector(l, scores[l], lengths[l]);
      }
      std::vector<uint64_t> caps = policy::xkv_allocate_total(w, capacity - total_prot);
      for (uint32_t l = 0; l < n_layers; ++l) caps[l] += prot[l];
      return caps;
    }
    case Allocation::kUniform:
      break;
  }
  return policy::allocate_uniform(lengths, capacity);
}

bool Cache::apply_caps(const std::vector<uint64_t>& caps, const Append* in,
                       std::vector<HeadScores>& scores, std::vector<bool>& scored,
                       uint64_t target, uint64_t* needed) {
  const uint32_t n_layers = geometry_.n_layers;
  const uint32_t n_heads = geometry_.n_kv_heads;
  // 1. Select: which rows every head keeps (nothing changes yet).
  std::vector<std::vector<std::vector<uint32_t>>> keep(n_layers);
  uint64_t new_tokens = 0;
  for (uint32_t l = 0; l < n_layers; ++l) {
    const uint64_t n = layer_length(l, in);
    const uint64_t k = std::min(n, caps[l]);
    new_tokens += k;
    const bool incoming_here = in && in->layer == l;
    if (k == n && !incoming_here) continue;  // untouched layer
    if (k < n && !scored[l]) scores[l] = layer_scores(l, in), scored[l] = true;
    keep[l].resize(n_heads);
    for (uint32_t h = 0; h < n_heads; ++h) {
      const float* sc = scores[l].empty() ? nullptr : scores[l][h].data();
      size_t sinks = 0, recent = size_t(k);
      switch (traits_.selection) {
        case Selection::kSinksAndRecent:
          sinks = size_t(policy_.sink_tokens);
          break;
        case Selection::kHeavyHitters: {
          sinks = std::min<size_t>(size_t(policy_.sink_tokens), size_t(k));
          const size_t heavy = size_t(double(policy_.heavy_ratio) * double(k - sinks));
          recent = size_t(k) - sinks - heavy;
          break;
        }
        case Selection::kObservationWindow:  // the rows of the observation window stay
          if (sc) recent = size_t(protected_rows(l, n));
          break;
        case Selection::kNone:
          break;
      }
      keep[l][h] = policy::select_keep(size_t(n), size_t(k), sinks, recent, sc);
    }
  }
  // 2. Plan the row store's change aside and count its bytes exactly.
  PlannedKeep plan(*rows_);
  uint64_t new_bytes = fixed_bytes() + new_tokens * n_heads * score_bytes_per_row();
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (keep[l].empty()) {
      new_bytes += rows_->layer_bytes(l);
      continue;
    }
    new_bytes += rows_->plan_keep(l, keep[l], in && in->layer == l ? &in->rows : nullptr);
  }
  if (rows_->token_bytes_estimated()) {
    if (needed) *needed = new_bytes;
    if (new_bytes > target) return false;
  }
  // 3. Charge: bytes grow only after the budget accepted them.
  BudgetReservation r = reservation();
  if (new_bytes > charged_ && !r.reserve(new_bytes - charged_)) {
    fail(KVSDK_E_BUDGET, "the compressed cache needs ", new_bytes, " bytes but only ",
         target_bytes(), " are available to it (budget too small for the policy's minimum)");
  }
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (keep[l].empty() || layers_[l].scores.empty()) continue;
    for (uint32_t h = 0; h < n_heads; ++h) layers_[l].scores[h].reserve(keep[l][h].size());
  }
  // 4. Mutate (no allocation from here on): the row store keeps the selected rows, and H2O's
  // scores follow them (kept incoming rows start at 0: nothing attended to them yet).
  plan.commit();
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (keep[l].empty() || layers_[l].scores.empty()) continue;
    for (uint32_t h = 0; h < n_heads; ++h) {
      std::vector<float>& sc = layers_[l].scores[h];
      const size_t held = sc.size();
      size_t j = 0;
      for (uint32_t i : keep[l][h]) {
        if (i < held) sc[j++] = sc[i];
      }
      sc.resize(j);
      sc.resize(keep[l][h].size(), 0.0f);
    }
  }
  if (in) layers_[in->layer].appended_tokens += in->rows.n;
  r.settle(charged_, new_bytes);
  return true;
}

void Cache::fit_caps(std::vector<uint64_t>& caps, const Append* in,
                     std::vector<HeadScores>& scores, std::vector<bool>& scored, uint64_t target) {
  // Only a row store whose per-token cost is an estimate can miss (KIVI: residual windows, ragged
  // key blocks). Then every layer's cap shrinks in proportion to the overshoot and the eviction is
  // planned again; each round drops at least 5% of the rows (and at least one), so this ends, at
  // worst with no rows, which fits whenever the fixed bytes do.
  for (;;) {
    uint64_t needed = 0;
    if (apply_caps(caps, in, scores, scored, target, &needed)) return;
    const uint64_t fixed = fixed_bytes();
    const double room = target > fixed ? double(target - fixed) : 0.0;
    const double ratio = std::min(0.95, needed > fixed ? room / double(needed - fixed) : 0.0);
    bool any = false;
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      const uint64_t c = std::min(caps[l], layer_length(l, in));
      uint64_t next = uint64_t(double(c) * ratio);
      if (c > 0 && next >= c) next = c - 1;
      any = any || c > 0;
      caps[l] = next;
    }
    if (!any) {
      fail(KVSDK_E_BUDGET, "the compressed cache needs ", needed, " bytes but only ", target,
           " are available to it (budget too small for the policy's minimum)");
    }
  }
}

bool Cache::append_unselected(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                              const int32_t* positions) {
  // The rows go straight into the row store (no selection, no copy of the layer): the growth
  // bound and H2O's scores of the new rows are reserved first; false (nothing changed) when the
  // budget refuses them.
  Representation& s = *rows_;
  LayerPolicyState& L = layers_[layer];
  const uint64_t bound =
      s.append_bound(layer, n_tokens) + uint64_t(n_tokens) * L.scores.size() * sizeof(float);
  BudgetReservation r = reservation();
  if (bound > 0 && !r.reserve(bound)) return false;
  for (std::vector<float>& sc : L.scores) reserve_for_growth(sc, sc.size() + n_tokens);
  const auto bytes = [&] {
    uint64_t t[KVSDK_TIER_SLOTS];
    layer_bytes(layer, t);
    uint64_t b = 0;
    for (uint64_t x : t) b += x;
    return b;
  };
  const uint64_t before = bytes();
  try {
    s.append_host(layer, n_tokens, k, v, positions);
  } catch (...) {
    r.settle(before, bytes());
    throw;
  }
  for (std::vector<float>& sc : L.scores) sc.resize(sc.size() + n_tokens, 0.0f);  // reserved
  const uint64_t over = r.settle(before, bytes());
  L.appended_tokens += n_tokens;
  if (over > 0) {
    fail(KVSDK_E_INTERNAL, "the row store of policy '", policy_spec(policy_), "' grew ", over,
         " bytes over its bound");
  }
  return true;
}

void Cache::append_compressing(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                               const int32_t* positions) {
  const Append in{layer, Incoming{k, v, positions, n_tokens}};
  const uint32_t n_layers = geometry_.n_layers;
  uint64_t total = 0;
  for (uint32_t l = 0; l < n_layers; ++l) total += layer_length(l, &in);
  const uint64_t target = target_bytes();
  const uint64_t fixed = fixed_bytes();
  // While the append fits the budget's token capacity (and no host allocation holds layers to
  // their shares), nothing is selected: the rows are appended as they come, so a decode step
  // costs O(1) instead of planning the whole layer.
  const bool shares = !fixed_alloc_.empty() || (!profile_shares_.empty() && target != kUnlimited);
  if (!shares && (target == kUnlimited ||
                  (fixed <= target && total <= capacity_for(target - fixed)))) {
    if (append_unselected(layer, n_tokens, k, v, positions)) return;
  }
  std::vector<HeadScores> scores(n_layers);
  std::vector<bool> scored(n_layers, false);
  std::vector<uint64_t> lengths(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) lengths[l] = layer_length(l, &in);
  std::vector<uint64_t> caps = lengths;
  if (target != kUnlimited && fixed > target) {
    fail(KVSDK_E_BUDGET, "the observation windows and compressed layers alone (", fixed,
         " bytes) exceed the ", target, " bytes available");
  }
  const uint64_t capacity = target == kUnlimited ? kUnlimited : capacity_for(target - fixed);
  if (!fixed_alloc_.empty() || (!profile_shares_.empty() && capacity != kUnlimited)) {
    // A known allocation (planner or profile): hold each layer to its own share right away, so
    // that prefill never holds more than one layer's incoming tokens beyond the budget plan.
    const std::vector<uint64_t> plan = plan_caps(capacity, &in, scores, scored);
    caps[layer] = std::min(lengths[layer], plan[layer]);
    const uint64_t sum = std::accumulate(caps.begin(), caps.end(), uint64_t(0));
    if (capacity != kUnlimited && sum > capacity) caps = plan;  // other layers over their share
  } else if (capacity != kUnlimited && total > capacity) {
    const uint64_t excess = total - capacity;
    if (!last_caps_.empty() && lengths[layer] >= excess &&
        lengths[layer] - excess >= last_caps_[layer]) {
      caps[layer] = lengths[layer] - excess;  // this layer alone is over its share: evict locally
    } else {
      caps = plan_caps(capacity, &in, scores, scored);  // re-plan every layer
      fit_caps(caps, &in, scores, scored, target);
      last_caps_.swap(caps);  // no allocation once the cache changed
      return;
    }
  }
  fit_caps(caps, &in, scores, scored, target);
}

void Cache::compress_to(uint64_t target) {
  if (!traits_.evicts()) {
    if (repr_ && charged_ > target) {
      // An evicting representation (SmallKV) plans aside; the plan is committed only when it
      // meets the target, so a refusal keeps every row.
      const uint64_t freed = repr_->plan_eviction(charged_ - target, Representation::kNoAppend, 0);
      if (charged_ - std::min(charged_, freed) <= target) {
        BudgetReservation r = reservation();
        const uint64_t before = stored_bytes();
        repr_->commit_eviction();
        r.settle(before, stored_bytes());  // returns what the eviction freed
      } else {
        repr_->drop_eviction();
      }
    }
    if (charged_ > target) {
      fail(KVSDK_E_BUDGET, "policy '", policy_spec(policy_), "' cannot evict further; the cache ",
           "holds ", charged_, " bytes, more than the ", target, " allowed");
    }
    return;
  }
  const uint64_t fixed = fixed_bytes();
  if (fixed > target) {
    fail(KVSDK_E_BUDGET, "the observation windows and compressed layers alone (", fixed,
         " bytes) exceed the ", target, " bytes allowed");
  }
  const uint32_t n_layers = geometry_.n_layers;
  std::vector<HeadScores> scores(n_layers);
  std::vector<bool> scored(n_layers, false);
  std::vector<uint64_t> caps = plan_caps(capacity_for(target - fixed), nullptr, scores, scored);
  fit_caps(caps, nullptr, scores, scored, target);
  last_caps_.swap(caps);  // no allocation once the cache changed
}

void Cache::compress() {
  const uint64_t target = target_bytes();
  if (target == kUnlimited && fixed_alloc_.empty()) return;  // no budget: nothing to enforce
  compress_to(target);
}

void Cache::set_budget(uint64_t bytes) {
  const uint64_t old = cache_budget_;
  cache_budget_ = bytes;
  try {
    if (bytes != 0 && charged_ > bytes) compress_to(target_bytes());
  } catch (...) {
    cache_budget_ = old;
    throw;
  }
}

void Cache::set_allocation(const std::vector<uint64_t>& tokens) {
  if (!tokens.empty()) {
    KVSDK_REQUIRE(tokens.size() == geometry_.n_layers, "the allocation has ", tokens.size(),
                  " layers but the geometry has ", geometry_.n_layers);
    const uint64_t cap = token_capacity();
    uint64_t sum = 0;
    for (uint64_t t : tokens) {
      KVSDK_REQUIRE(t <= (uint64_t(1) << 40), "allocation entry ", t, " is implausibly large");
      sum += t;
    }
    if (cap != kUnlimited && sum > cap) {
      fail(KVSDK_E_BUDGET, "the allocation needs ", sum, " layer-tokens but the budget holds ",
           cap);
    }
    if (!traits_.evicts()) {
      fail(KVSDK_E_UNSUPPORTED, "policy '", policy_spec(policy_), "' has no per-layer "
           "allocation; an allocation needs an eviction preset");
    }
  }
  std::vector<uint64_t> next = tokens;  // (allocated before anything changes; swaps never fail)
  fixed_alloc_.swap(next);
  if (tokens.empty()) return;
  try {
    compress_to(target_bytes());
  } catch (...) {
    fixed_alloc_.swap(next);
    throw;
  }
}

void Cache::set_profile_shares(const std::vector<double>& shares) {
  if (!shares.empty()) {
    KVSDK_REQUIRE(shares.size() == geometry_.n_layers, "the profile has ", shares.size(),
                  " layers but the geometry has ", geometry_.n_layers);
    if (!traits_.evicts()) {
      fail(KVSDK_E_UNSUPPORTED, "policy '", policy_spec(policy_),
           "' has no per-layer allocation; a profile needs an eviction preset");
    }
  }
  std::vector<double> next = shares;  // (allocated before anything changes; swaps never fail)
  profile_shares_.swap(next);
  try {
    if (!shares.empty() && target_bytes() != kUnlimited) compress_to(target_bytes());
  } catch (...) {
    profile_shares_.swap(next);
    throw;
  }
}

void Cache::observe(uint32_t layer, size_t n_queries, const void* q, const int32_t* q_positions) {
  check_layer(layer);
  const bool h2o = traits_.scores_rows();
  if (!h2o && !traits_.uses_window()) return;  // no attention signal (full, streaming_llm, ...)
  if (!selects(layer)) return;  // SpindleKV's codebook layers never evict: no window to keep
  const size_t qe = geometry_.q_elems_per_token();
  std::vector<float> rows(n_queries * qe);
  load_f32(geometry_.dtype, q, 0, rows.size(), rows.data());
  std::vector<int32_t> pos(n_queries, std::numeric_limits<int32_t>::max());
  if (q_positions) std::copy_n(q_positions, n_queries, pos.begin());
  LayerPolicyState& L = layers_[layer];
  if (h2o) {
    const policy::QueryBlock qb{rows.data(), pos.data(), n_queries};
    const uint32_t dim = geometry_.head_dim;
    // Compute every head first so that a failure (allocation) leaves all scores unchanged.
    std::vector<std::vector<float>> updated(L.scores);
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      auto load = [&](size_t first, size_t count, float* dst) {
        rows_->load_keys(layer, h, first, count, dst);  // dequantized under a KIVI overlay
      };
      policy::h2o_accumulate(qb, geometry_, h, load, rows_->row_positions(layer, h),
                             rows_->head_tokens(layer, h), updated[h].data());
    }
    L.scores.swap(updated);
    return;
  }
  // Window methods: the rolling window keeps the newest obs_window observed queries, but never
  // more than an eighth of the budget over all layers (small models under tight budgets would
  // otherwise spend the budget on queries instead of tokens).
  const uint64_t row_bytes = uint64_t(qe) * 4 + 4;
  size_t w = size_t(policy_.obs_window);
  const uint64_t target_now = target_bytes();
  if (target_now != std::numeric_limits<uint64_t>::max()) {
    const uint64_t share = target_now / 8 / (uint64_t(geometry_.n_layers) * row_bytes);
    w = size_t(std::max<uint64_t>(1, std::min<uint64_t>(w, share)));
  }
  const size_t old_n = L.window_pos.size();
  const size_t new_n = std::min(w, old_n + n_queries);  // may shrink when the budget did
  std::vector<float> wq;
  std::vector<int32_t> wp;
  wq.reserve(new_n * qe);
  wp.reserve(new_n);
  const size_t drop = old_n + n_queries - new_n;  // oldest rows of (old window + new queries)
  for (size_t i = drop; i < old_n + n_queries; ++i) {
    if (i < old_n) {
      wq.insert(wq.end(), L.window_q.begin() + i * qe, L.window_q.begin() + (i + 1) * qe);
      wp.push_back(L.window_pos[i]);
    } else {
      wq.insert(wq.end(), rows.begin() + (i - old_n) * qe, rows.begin() + (i - old_n + 1) * qe);
      wp.push_back(pos[i - old_n]);
    }
  }
  BudgetReservation r = reservation();
  if (new_n > old_n) {
    const uint64_t delta = (new_n - old_n) * row_bytes;
    if (!r.reserve(delta)) {
      // Make room by evicting tokens, then charge the larger window.
      const uint64_t target = target_bytes();
      if (target < delta) fail(KVSDK_E_BUDGET, "the observation window does not fit the budget");
      compress_to(target - delta);
      if (!r.reserve(delta)) {
        fail(KVSDK_E_BUDGET, "the observation window (", delta, " more bytes) does not fit the ",
             "budget even after compression");
      }
    }
  }
  const uint64_t before = (old_n) * row_bytes;
  L.window_q.swap(wq);
  L.window_pos.swap(wp);
  r.settle(before, new_n * row_bytes);
}

}  // namespace kvsdk
