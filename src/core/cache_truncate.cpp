// Truncation (kvsdk_cache_truncate): removing every token from a position on, exactly or not at
// all. "Exactly" means the cache afterwards holds what a cache that never saw those tokens would
// hold, so continuing gives the same attention outputs and the same snapshot. Two things can make
// that impossible, and each is checked before anything changes:
//  - a store quantized, merged or encoded the tokens together with older ones (each store's
//    truncate_refusal() knows its own rule);
//  - the cache itself decided something while they were held: an eviction (which rows to keep
//    depended on every candidate, in every layer through the allocation stage), or an
//    observation that H2O added to its scores or that slid a window. exact_floor_ records how far
//    back each layer can still go.
#include <algorithm>
#include <string>
#include <vector>

#include "core/cache.h"
#include "core/policy.h"
#include "util/error.h"
#include "util/positions.h"

namespace kvsdk {

void Cache::note_positions(uint32_t layer, const int32_t* positions, size_t n) {
  int32_t& most = max_position_[layer];
  for (size_t i = 0; i < n; ++i) most = std::max(most, positions[i]);
}

void Cache::note_eviction() {
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    exact_floor_[l] = std::max(exact_floor_[l], max_position_[l] + 1);
  }
}

void Cache::note_observation(uint32_t layer, const int32_t* q_positions, size_t n) {
  // A query at position q saw only keys at positions <= q (causal), so only tokens after the
  // newest query can still go; a query without a position saw everything.
  int32_t floor = exact_floor_[layer];
  for (size_t i = 0; i < n; ++i) {
    const int32_t q = q_positions[i] == kUnpositionedQuery ? max_position_[layer] : q_positions[i];
    floor = std::max(floor, q + 1);
  }
  exact_floor_[layer] = floor;
}

void Cache::restored_floor() {
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    int32_t most = -1;
    std::vector<int32_t> pos;
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      pos.resize(store(l).head_tokens(l, h));
      if (pos.empty()) continue;
      store(l).read(l, h, nullptr, nullptr, pos.data());
      most = std::max(most, *std::max_element(pos.begin(), pos.end()));
    }
    for (int32_t q : layers_[l].window_pos) {
      if (q != kUnpositionedQuery) most = std::max(most, q);
    }
    max_position_[l] = most;
    // A snapshot does not say when the policy last evicted or observed: only what comes after
    // the restore can go, for policies that do either (the selection stage, SmallKV). Stores
    // that track their own history restart it the same way (their restore()).
    const bool history = traits_.evicts() || traits_.needs_proxy;
    exact_floor_[l] = history ? most + 1 : 0;
  }
}

void Cache::truncate(int32_t position) {
  check_mutable("truncate");
  if (!valid_position(position)) {
    fail(KVSDK_E_INVALID_ARG, "truncate position ", position,
         " is outside 0 .. KVSDK_MAX_POSITION = ", KVSDK_MAX_POSITION);
  }
  const uint32_t n_layers = geometry_.n_layers;
  // 1. Check every layer; nothing changes on a refusal.
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (max_position_[l] < position) continue;  // nothing to remove
    if (position < exact_floor_[l]) {
      fail(KVSDK_E_STATE, "cannot truncate at position ", position, " exactly: policy '",
           policy_spec(policy_), "' evicted or observed while layer ", l,
           " held tokens from there on; the earliest position it can truncate at is ",
           exact_floor_[l]);
    }
    // Removed queries must be the window's newest (it never slid since they came).
    const std::vector<int32_t>& wp = layers_[l].window_pos;
    const auto newest = std::find_if(wp.rbegin(), wp.rend(),
                                     [position](int32_t q) { return q < position; });
    if (std::any_of(newest, wp.rend(), [position](int32_t q) { return q >= position; })) {
      fail(KVSDK_E_STATE, "cannot truncate at position ", position, " exactly: layer ", l,
           "'s observation window holds a query from there on before older ones");
    }
    const std::string why = store(l).truncate_refusal(l, position);
    if (!why.empty()) {
      fail(KVSDK_E_STATE, "cannot truncate at position ", position, " exactly: ", why);
    }
  }
  // 2. Remove (no allocation, no throw from here on). The counts are taken before any store
  // changes, as a store of layer pairs cuts both layers on either one's call.
  std::vector<size_t> before(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) before[l] = head_tokens(l, 0);
  const auto total_bytes = [this] {
    uint64_t b = 0;
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      uint64_t t[KVSDK_TIER_SLOTS];
      layer_bytes(l, t);
      for (uint64_t x : t) b += x;
    }
    return b;
  };
  BudgetReservation r = reservation();
  const uint64_t bytes_before = total_bytes();
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (max_position_[l] < position) continue;
    LayerPolicyState& L = layers_[l];
    // H2O's scores follow the row store's rows: drop those of the removed rows first.
    for (uint32_t h = 0; h < L.scores.size(); ++h) {
      const int32_t* pos = rows_->row_positions(l, h);
      std::vector<float>& sc = L.scores[h];
      size_t j = 0;
      for (size_t i = 0; i < sc.size(); ++i) {
        if (pos[i] < position) sc[j++] = sc[i];
      }
      sc.resize(j);
    }
    // A window that never slid since those queries came holds them last: give them back.
    size_t w = L.window_pos.size();
    while (w > 0 && L.window_pos[w - 1] >= position) --w;
    L.window_pos.resize(w);
    L.window_q.resize(w * geometry_.q_elems_per_token());
    store(l).truncate(l, position);
    max_position_[l] = position - 1;
  }
  for (uint32_t l = 0; l < n_layers; ++l) {
    layers_[l].appended_tokens -= std::min<uint64_t>(layers_[l].appended_tokens,
                                                     before[l] - head_tokens(l, 0));
  }
  r.settle(bytes_before, total_bytes());  // returns the freed bytes to the context
}

}  // namespace kvsdk
