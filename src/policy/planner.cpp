#include "policy/planner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "policy/allocation.h"
#include "policy/importance.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/positions.h"

namespace kvsdk {
std::vector<uint64_t> plan_xkv(const std::vector<std::vector<float>>& w, int32_t mode,
                               double value);  // src/api/compress_api.cpp
}

namespace kvsdk::policy {

std::vector<uint64_t> plan_xkv_checked(const std::vector<std::vector<float>>& w, int32_t mode,
                                       double value) {
  return plan_xkv(w, mode, value);
}

void Planner::feed_layer(uint32_t layer, size_t n_tokens, const void* k, const int32_t* positions,
                         size_t n_queries, const void* q, const int32_t* q_positions) {
  if (layer >= g_.n_layers) {
    fail(KVSDK_E_OUT_OF_RANGE, "layer ", layer, " is out of range (the geometry has ", g_.n_layers,
         " layers)");
  }
  check_positions(positions, n_tokens, "positions");
  if (q_positions) check_query_positions(q_positions, n_queries, "q_positions");
  std::vector<float> qf(n_queries * g_.q_elems_per_token());
  load_f32(g_.dtype, q, 0, qf.size(), qf.data());
  std::vector<int32_t> qp(n_queries, std::numeric_limits<int32_t>::max());
  if (q_positions) std::copy_n(q_positions, n_queries, qp.begin());
  const QueryBlock window{qf.data(), qp.data(), n_queries};
  const size_t prot = std::min<size_t>(size_t(p_.obs_window), n_tokens);
  std::vector<float> w(n_tokens - prot, 0.0f), pooled(n_tokens);
  const size_t row = g_.kv_elems_per_token(), dim = g_.head_dim;
  for (uint32_t h = 0; h < g_.n_kv_heads; ++h) {
    auto load = [&](size_t first, size_t count, float* dst) {
      for (size_t t = first; t < first + count; ++t, dst += dim) {
        load_f32(g_.dtype, k, t * row + size_t(h) * dim, dim, dst);
      }
    };
    const std::vector<float> raw = window_scores(window, g_, h, load, positions, n_tokens);
    pool_scores(raw.data(), n_tokens - prot, p_.pool_kernel, kvsdk_pool_kind(p_.pool_kind),
                pooled.data());
    for (size_t t = 0; t < w.size(); ++t) w[t] += pooled[t] / float(g_.n_kv_heads);
  }
  w_[layer].swap(w);
  prot_[layer] = prot;
  fed_[layer] = true;
}

std::vector<uint64_t> Planner::finish(int32_t mode, double value) const {
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    if (!fed_[l]) fail(KVSDK_E_STATE, "layer ", l, " was not fed to the planner");
  }
  const uint64_t total_prot = std::accumulate(prot_.begin(), prot_.end(), uint64_t(0));
  if (mode == KVSDK_ALLOC_TOTAL_TOKENS) {
    KVSDK_REQUIRE(value >= 0 && value <= 1.8e19, "value (total tokens) is ", value);
    if (value <= double(total_prot)) return allocate_uniform(prot_, uint64_t(value));
    value -= double(total_prot);  // the windows are kept; the greedy places the rest
  }
  std::vector<uint64_t> n = plan_xkv(w_, mode, value);
  for (uint32_t l = 0; l < g_.n_layers; ++l) n[l] += prot_[l];
  return n;
}

}  // namespace kvsdk::policy
