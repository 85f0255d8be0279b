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
#include "core/representation.h"
#include "util/growth.h"
#include "policy/allocation.h"
#include "policy/importance.h"
#include "policy/selection.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/positions.h"

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

uint64_t Cache::slack_rows(uint64_t cap) const {
  return uint64_t(double(policy_.evict_slack) * double(cap));
}

namespace {

// Lets one layer's scoring run where the row store keeps the rows (a device store scores its keys
// there: Representation::column_sums_here), for the guard's lifetime.
struct RowsScoring {
  RowsScoring(ScoreScratch& s, const Representation& rows, uint32_t layer) : scratch(s) {
    scratch.rows_store = &rows;
    scratch.rows_layer = layer;
  }
  ~RowsScoring() { scratch.rows_store = nullptr; }
  RowsScoring(const RowsScoring&) = delete;
  RowsScoring& operator=(const RowsScoring&) = delete;
  ScoreScratch& scratch;
};

}  // namespace

void Cache::begin_pass() {
  if (select_.scores.size() != geometry_.n_layers) select_.scores.resize(geometry_.n_layers);
  for (HeadScores& h : select_.scores) h.computed = false;
}

// Scores of every candidate row (stored rows, then the incoming ones) per KV head, into reused
// buffers.
void Cache::score_layer(uint32_t layer, const Append* in) {
  HeadScores& out = select_.scores[layer];
  if (out.computed) return;
  const LayerPolicyState& L = layers_[layer];
  const uint32_t dim = geometry_.head_dim;
  const size_t held = rows_->head_tokens(layer, 0);
  const size_t n = layer_length(layer, in);
  out.computed = true;
  out.recency_only = true;
  if (traits_.scores_rows()) {
    out.heads.resize(geometry_.n_kv_heads);
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      reserve_for_growth(out.heads[h], n);
      out.heads[h].assign(L.scores[h].begin(), L.scores[h].end());
      out.heads[h].resize(n, 0.0f);  // incoming tokens have not been attended to yet
    }
    out.recency_only = false;
    return;
  }
  if (!traits_.uses_window() || L.window_pos.empty() || n == 0) return;  // recency only
  const policy::QueryBlock window{L.window_q.data(), L.window_pos.data(), L.window_pos.size()};
  const size_t prot = size_t(protected_rows(layer, n));
  out.heads.resize(geometry_.n_kv_heads);
  int32_t* pos = at_least(select_.pos, n).data();
  float* raw = at_least(select_.raw, n).data();
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    std::copy_n(rows_->row_positions(layer, h), held, pos);
    if (n > held) std::copy_n(in->rows.positions, in->rows.n, pos + held);
    // Held rows as attention sees them (dequantized under a KIVI overlay), then incoming rows.
    // The loader captures one pointer, so std::function keeps it inline (no allocation).
    struct Source {
      const Representation* rows;
      const Append* in;
      const Geometry* g;
      uint32_t layer, head;
      size_t held;
    } src{rows_.get(), in, &geometry_, layer, h, held};
    auto load = [&src](size_t first, size_t count, float* dst) {
      const size_t d = src.g->head_dim, row = src.g->kv_elems_per_token();
      const size_t from_held = first < src.held ? std::min(count, src.held - first) : 0;
      if (from_held) src.rows->load_keys(src.layer, src.head, first, from_held, dst);
      dst += from_held * d;
      for (size_t t = first + from_held; t < first + count; ++t, dst += d) {
        load_f32(src.g->dtype, src.in->rows.k, (t - src.held) * row + size_t(src.head) * d, d,
                 dst);
      }
    };
    const RowsScoring on_rows(scratch_.sums, *rows_, layer);
    policy::window_scores(window, geometry_, h, load, pos, n, raw, scratch_.sums);
    // Pool the context part (everything before the observation window); the window itself is
    // always kept, so its scores are never compared.
    reserve_for_growth(out.heads[h], n);
    out.heads[h].assign(n, 0.0f);
    ctx_->host_ops().pool(raw, n - prot, policy_.pool_kernel, kvsdk_pool_kind(policy_.pool_kind),
                     out.heads[h].data());
  }
  (void)dim;
  out.recency_only = false;
}

// XKV importance vector w_i of one layer (XKV Eq. (3), Fig. 8): the pooled window attention of
// the context part, averaged over KV heads. Without an observed window every token weighs 1.
std::vector<float> Cache::importance_vector(uint32_t layer, const HeadScores& scores,
                                            uint64_t length) const {
  const size_t prot = size_t(protected_rows(layer, length));
  std::vector<float> w(length - prot, scores.empty() ? 1.0f : 0.0f);
  if (scores.empty()) return w;
  for (const std::vector<float>& hs : scores.heads) {
    for (size_t t = 0; t < w.size(); ++t) w[t] += hs[t] / float(scores.heads.size());
  }
  return w;
}

void Cache::plan_caps(uint64_t capacity, const Append* in, std::vector<uint64_t>& caps) {
  const uint32_t n_layers = geometry_.n_layers;
  std::vector<uint64_t>& lengths = select_.lengths;
  std::vector<uint64_t>& prot = select_.prot;
  lengths.resize(n_layers);
  prot.resize(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) {
    lengths[l] = layer_length(l, in);
    prot[l] = protected_rows(l, lengths[l]);
  }
  if (!fixed_alloc_.empty()) {
    caps.assign(fixed_alloc_.begin(), fixed_alloc_.end());
    return;
  }
  if (!profile_shares_.empty()) {
    caps = policy::allocate_by_shares(profile_shares_, capacity);
    return;
  }
  switch (traits_.allocation) {
    case Allocation::kPyramid:
      caps = policy::allocate_pyramid(lengths, prot, capacity, policy_.schedule_alpha,
                                      policy_.schedule_beta);
      return;
    case Allocation::kPyramidUncovered: {
      // SpindleKV §3.3, Eq. (5) and (6) over the deep (evicting) layers only: layer 0 of the
      // schedule is the boundary layer. Codebook layers keep their (empty) exact length.
      std::vector<uint64_t> deep_len, deep_prot;
      for (uint32_t l = 0; l < n_layers; ++l) {
        if (!covered(l)) deep_len.push_back(lengths[l]), deep_prot.push_back(prot[l]);
      }
      const std::vector<uint64_t> deep = policy::allocate_pyramid(
          deep_len, deep_prot, capacity, policy_.schedule_alpha, policy_.schedule_beta);
      caps.assign(lengths.begin(), lengths.end());
      for (uint32_t l = 0, i = 0; l < n_layers; ++l) {
        if (!covered(l)) caps[l] = deep[i++];
      }
      return;
    }
    case Allocation::kXkv: {
      const uint64_t total_prot = std::accumulate(prot.begin(), prot.end(), uint64_t(0));
      if (capacity <= total_prot) {
        caps = policy::allocate_uniform(prot, capacity);
        return;
      }
      std::vector<std::vector<float>> w(n_layers);
      for (uint32_t l = 0; l < n_layers; ++l) {
        score_layer(l, in);
        w[l] = importance_vector(l, select_.scores[l], lengths[l]);
      }
      caps = policy::xkv_allocate_total(w, capacity - total_prot);
      for (uint32_t l = 0; l < n_layers; ++l) caps[l] += prot[l];
      return;
    }
    case Allocation::kUniform:
      break;
  }
  caps = policy::allocate_uniform(lengths, capacity);
}

bool Cache::apply_caps(const std::vector<uint64_t>& caps, const Append* in, uint64_t target,
                       uint64_t* needed) {
  const uint32_t n_layers = geometry_.n_layers;
  const uint32_t n_heads = geometry_.n_kv_heads;
  // 1. Select: which rows every head keeps (nothing changes yet), into reused buffers.
  std::vector<std::vector<std::vector<uint32_t>>>& keep = select_.keep;
  if (keep.size() != n_layers) keep.resize(n_layers);
  std::vector<char>& planned = select_.planned;
  planned.assign(n_layers, 0);
  uint64_t new_tokens = 0;
  bool evicts = false;
  for (uint32_t l = 0; l < n_layers; ++l) {
    const uint64_t n = layer_length(l, in);
    const uint64_t k = std::min(n, caps[l]);
    new_tokens += k;
    const bool incoming_here = in && in->layer == l;
    if (k == n && !incoming_here) continue;  // untouched layer
    if (k < n) score_layer(l, in), evicts = true;
    const HeadScores& scores = select_.scores[l];
    planned[l] = 1;
    keep[l].resize(n_heads);
    for (uint32_t h = 0; h < n_heads; ++h) {
      const float* sc =
          scores.computed && !scores.recency_only ? scores.heads[h].data() : nullptr;
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
      ctx_->host_ops().select_keep(size_t(n), size_t(k), sinks, recent, sc, scratch_.sums.workspace(),
                              keep[l][h]);
    }
  }
  // 2. Plan the row store's change aside and count its bytes exactly.
  PlannedKeep plan(*rows_);
  uint64_t new_bytes = fixed_bytes() + new_tokens * n_heads * score_bytes_per_row();
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (!planned[l]) {
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
    if (!planned[l] || layers_[l].scores.empty()) continue;
    for (uint32_t h = 0; h < n_heads; ++h) layers_[l].scores[h].reserve(keep[l][h].size());
  }
  // 4. Mutate (no allocation from here on): the row store keeps the selected rows, and H2O's
  // scores follow them (kept incoming rows start at 0: nothing attended to them yet).
  note_eviction();
  plan.commit();
  selection_passes_ += evicts;
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (!planned[l] || layers_[l].scores.empty()) continue;
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

void Cache::fit_caps(std::vector<uint64_t>& caps, const Append* in, uint64_t target) {
  // Only a row store whose per-token cost is an estimate can miss (KIVI: residual windows, ragged
  // key blocks). Then every layer's cap shrinks in proportion to the overshoot and the eviction is
  // planned again; each round drops at least 5% of the rows (and at least one), so this ends, at
  // worst with no rows, which fits whenever the fixed bytes do.
  for (;;) {
    uint64_t needed = 0;
    if (apply_caps(caps, in, target, &needed)) return;
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
  const uint64_t length = layer_length(layer, &in);
  const bool fits =
      target == kUnlimited || (fixed <= target && total <= capacity_for(target - fixed));
  // While the append fits the budget's token capacity (and, under a host allocation, the layer's
  // share of it), nothing is selected: the rows are appended as they come, so a decode step
  // costs O(1) instead of planning the whole layer. After an eviction with a slack
  // (policy.evict_slack) the following appends take this path until the slack is used up.
  const bool shares = !fixed_alloc_.empty() || (!profile_shares_.empty() && target != kUnlimited);
  const bool within_share = fixed_alloc_.empty() ? !shares : length <= fixed_alloc_[layer];
  // With a slack, a nearly full cache (less free room than the slack of the whole capacity) holds
  // every layer to its share of the last allocation: a layer past its share evicts down to its
  // share minus the slack by itself, so layers do not drift past their shares and force global
  // re-plans, and each layer selects once per slack's worth of its own appends.
  bool over_share = false;
  if (fits && within_share && !shares && policy_.evict_slack > 0.0f && !last_caps_.empty() &&
      target != kUnlimited && length > last_caps_[layer]) {
    const uint64_t cap = capacity_for(target - fixed);
    over_share = total > cap - slack_rows(cap);
  }
  if (fits && within_share && !over_share) {
    if (append_unselected(layer, n_tokens, k, v, positions)) return;
  }
  begin_pass();
  std::vector<uint64_t>& caps = select_.caps;
  caps.resize(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) caps[l] = layer_length(l, &in);
  if (target != kUnlimited && fixed > target) {
    fail(KVSDK_E_BUDGET, "the observation windows and compressed layers alone (", fixed,
         " bytes) exceed the ", target, " bytes available");
  }
  const uint64_t capacity = target == kUnlimited ? kUnlimited : capacity_for(target - fixed);
  // A layer that must evict goes down to its cap minus the slack (none by default for explicit
  // compression; policy.evict_slack here), so that the next appends fit without selecting.
  const auto with_slack = [this](uint64_t cap, uint64_t len) {
    return cap < len ? cap - slack_rows(cap) : cap;
  };
  if (!fixed_alloc_.empty() || (!profile_shares_.empty() && capacity != kUnlimited)) {
    // A known allocation (planner or profile): hold each layer to its own share right away, so
    // that prefill never holds more than one layer's incoming tokens beyond the budget plan.
    std::vector<uint64_t>& plan = select_.plan;
    plan_caps(capacity, &in, plan);
    caps[layer] = with_slack(std::min(length, plan[layer]), length);
    const uint64_t sum = std::accumulate(caps.begin(), caps.end(), uint64_t(0));
    if (capacity != kUnlimited && sum > capacity) {
      for (uint32_t l = 0; l < n_layers; ++l) {
        caps[l] = with_slack(plan[l], layer_length(l, &in));  // other layers over their share
      }
    }
  } else if (over_share && total <= capacity) {
    caps[layer] = with_slack(last_caps_[layer], length);  // past its share: evict locally
  } else if (capacity != kUnlimited && total > capacity) {
    const uint64_t excess = total - capacity;
    if (!last_caps_.empty() && length >= excess && length - excess >= last_caps_[layer]) {
      caps[layer] = with_slack(length - excess, length);  // this layer alone is over its share
    } else {
      plan_caps(capacity, &in, caps);  // re-plan every layer
      std::vector<uint64_t>& slack = select_.slack;
      slack.resize(n_layers);
      for (uint32_t l = 0; l < n_layers; ++l) {
        const uint64_t len = layer_length(l, &in);
        slack[l] = caps[l] < len ? slack_rows(caps[l]) : 0;
        caps[l] -= slack[l];
      }
      fit_caps(caps, &in, target);
      // The allocation the layers hold to is their share, slack included.
      for (uint32_t l = 0; l < n_layers; ++l) caps[l] += slack[l];
      last_caps_.swap(caps);  // no allocation once the cache changed
      rows_->follow_allocation(last_caps_);
      return;
    }
  }
  fit_caps(caps, &in, target);
}

void Cache::compress_to(uint64_t target, bool slack) {
  if (!traits_.evicts()) {
    if (repr_ && charged_ > target) {
      // An evicting representation (SmallKV) plans aside; the plan is committed only when it
      // meets the target, so a refusal keeps every row.
      const uint64_t freed = repr_->plan_eviction(charged_ - target, Representation::kNoAppend, 0,
                                                  nullptr);
      if (charged_ - std::min(charged_, freed) <= target) {
        BudgetReservation r = reservation();
        const uint64_t before = stored_bytes();
        note_eviction();
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
  begin_pass();
  std::vector<uint64_t>& caps = select_.caps;
  plan_caps(capacity_for(target - fixed), nullptr, caps);
  std::vector<uint64_t>& extra = select_.slack;
  extra.assign(n_layers, 0);
  if (slack) {
    for (uint32_t l = 0; l < n_layers; ++l) {
      if (caps[l] < select_.lengths[l]) extra[l] = slack_rows(caps[l]);
      caps[l] -= extra[l];
    }
  }
  fit_caps(caps, nullptr, target);
  for (uint32_t l = 0; l < n_layers; ++l) caps[l] += extra[l];
  last_caps_.swap(caps);  // no allocation once the cache changed
  rows_->follow_allocation(last_caps_);
}

void Cache::compress() {
  check_mutable("compress");
  const uint64_t target = target_bytes();
  if (target == kUnlimited && fixed_alloc_.empty()) return;  // no budget: nothing to enforce
  compress_to(target);
}

void Cache::set_budget(uint64_t bytes) {
  check_mutable("set_budget");
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
  check_mutable("set_allocation");
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
  check_mutable("set_profile_shares");
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
  check_mutable("observe");
  check_layer(layer);
  const bool h2o = traits_.scores_rows();
  if (!h2o && !traits_.uses_window()) return;  // no attention signal (full, streaming_llm, ...)
  if (!selects(layer)) return;  // SpindleKV's codebook layers never evict: no window to keep
  const size_t qe = geometry_.q_elems_per_token();
  // The queries as f32 in reused scratch (observe runs on every decode step).
  float* rows = at_least(scratch_.obs_q, n_queries * qe).data();
  load_f32(geometry_.dtype, q, 0, n_queries * qe, rows);
  int32_t* pos = at_least(scratch_.obs_pos, n_queries).data();
  for (size_t i = 0; i < n_queries; ++i) {
    pos[i] = q_positions ? q_positions[i] : std::numeric_limits<int32_t>::max();
  }
  LayerPolicyState& L = layers_[layer];
  if (h2o) {
    const policy::QueryBlock qb{rows, pos, n_queries};
    // Compute every head's addition first (into reused scratch), so that a failure (allocation)
    // leaves all scores unchanged; then add them (no-throw).
    std::vector<std::vector<float>>& added = scratch_.h2o_added;
    if (added.size() != geometry_.n_kv_heads) added.resize(geometry_.n_kv_heads);
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      const Representation* store = rows_.get();
      // (Captures 16 bytes: std::function keeps the loader inline, no allocation.)
      auto load = [store, layer, h](size_t first, size_t count, float* dst) {
        store->load_keys(layer, h, first, count, dst);  // dequantized under a KIVI overlay
      };
      const size_t n = store->head_tokens(layer, h);
      reserve_for_growth(added[h], n);  // (the layer grows by a row per decode step)
      added[h].assign(n, 0.0f);
      const RowsScoring on_rows(scratch_.sums, *store, layer);
      policy::h2o_accumulate(qb, geometry_, h, load, store->row_positions(layer, h), n,
                             added[h].data(), scratch_.sums);
    }
    note_observation(layer, pos, n_queries);
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      float* sc = L.scores[h].data();
      const float* add = added[h].data();
      for (size_t t = 0; t < L.scores[h].size(); ++t) sc[t] += add[t];
    }
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
  const size_t drop = old_n + n_queries - new_n;  // oldest rows of (old window + new queries)
  // Room first (the only allocation, before anything changes; the window's capacity grows
  // geometrically up to obs_window and then slides in place).
  const auto room = [](auto& v, size_t need, size_t most) {
    if (v.capacity() < need) v.reserve(std::min(grown_capacity(v.capacity(), need), most));
  };
  const size_t most = std::max(new_n, size_t(policy_.obs_window));
  room(L.window_q, new_n * qe, most * qe);
  room(L.window_pos, new_n, most);
  BudgetReservation r = reservation();
  if (new_n > old_n) {
    const uint64_t delta = (new_n - old_n) * row_bytes;
    if (!r.reserve(delta)) {
      // Make room by evicting tokens, then charge the larger window.
      const uint64_t target = target_bytes();
      if (target < delta) fail(KVSDK_E_BUDGET, "the observation window does not fit the budget");
      compress_to(target - delta, /*slack=*/true);
      if (!r.reserve(delta)) {
        fail(KVSDK_E_BUDGET, "the observation window (", delta, " more bytes) does not fit the ",
             "budget even after compression");
      }
    }
  }
  // A window that drops queries no longer holds what it would without the newest ones; one that
  // only grew gives them back on truncation.
  // (Queries without a position would never be given back: they count as every token's.)
  const bool unpositioned = std::find(pos, pos + n_queries, kUnpositionedQuery) != pos + n_queries;
  if (drop > 0 || unpositioned) note_observation(layer, pos, n_queries);
  // Slide (no allocation: the capacity is there).
  const uint64_t before = (old_n) * row_bytes;
  if (drop >= old_n) {
    const size_t skip = drop - old_n;  // new queries that fall out as well
    L.window_q.assign(rows + skip * qe, rows + n_queries * qe);
    L.window_pos.assign(pos + skip, pos + n_queries);
  } else {
    std::copy(L.window_q.begin() + long(drop * qe), L.window_q.end(), L.window_q.begin());
    L.window_q.resize((old_n - drop) * qe);
    L.window_q.insert(L.window_q.end(), rows, rows + n_queries * qe);
    std::copy(L.window_pos.begin() + long(drop), L.window_pos.end(), L.window_pos.begin());
    L.window_pos.resize(old_n - drop);
    L.window_pos.insert(L.window_pos.end(), pos, pos + n_queries);
  }
  r.settle(before, new_n * row_bytes);
}

}  // namespace kvsdk
