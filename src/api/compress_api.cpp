// C ABI: compression (observe, compress, per-cache budget, allocation) and the pure XKV planner
// function. Checks every argument, then calls the core inside guard().
#include <cmath>
#include <limits>
#include <vector>

#include "core/cache.h"
#include "kvsdk.h"
#include "policy/allocation.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/positions.h"

using namespace kvsdk;

namespace {

Cache& impl(kvsdk_cache* cache) {
  KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
  return *cache->impl;
}
const Cache& impl(const kvsdk_cache* cache) {
  KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
  return *cache->impl;
}

}  // namespace

namespace kvsdk {

// Shared by kvsdk_plan_allocation and the planner: validates the mode/value pair and runs
// XKV Algorithm 1.
std::vector<uint64_t> plan_xkv(const std::vector<std::vector<float>>& w, int32_t mode,
                               double value) {
  if (mode == KVSDK_ALLOC_TOTAL_TOKENS) {
    KVSDK_REQUIRE(std::isfinite(value) && value >= 0 && value <= 1.8e19,
                  "value (total tokens) is ", value, " (must be a finite count >= 0)");
    return policy::xkv_allocate_total(w, uint64_t(value));
  }
  KVSDK_REQUIRE(mode == KVSDK_ALLOC_TARGET_RETENTION, "mode ", mode, " is not a kvsdk_alloc_mode");
  KVSDK_REQUIRE(std::isfinite(value) && value > 0 && value <= 1, "value (target R_avg) is ", value,
                " (must be in (0, 1])");
  return policy::xkv_allocate_retention(w, value);
}

}  // namespace kvsdk

extern "C" {

KVSDK_API kvsdk_status kvsdk_cache_observe(kvsdk_cache* cache, uint32_t layer, size_t n_queries,
                                           const void* q, const int32_t* q_positions,
                                           size_t q_bytes) {
  return guard("kvsdk_cache_observe", [&] {
    Cache& c = impl(cache);
    KVSDK_REQUIRE(q != nullptr, "q is NULL");
    KVSDK_REQUIRE(n_queries > 0, "n_queries is 0");
    const Geometry& g = c.geometry();
    const size_t row = g.q_elems_per_token() * dtype_size(g.dtype);
    KVSDK_REQUIRE(n_queries <= std::numeric_limits<size_t>::max() / row && q_bytes == n_queries * row,
                  "q_bytes is ", q_bytes, " but ", n_queries, " queries x ", g.n_q_heads,
                  " heads x ", g.head_dim, " x ", dtype_size(g.dtype), " bytes = ", n_queries * row);
    if (q_positions) check_query_positions(q_positions, n_queries, "q_positions");
    c.observe(layer, n_queries, q, q_positions);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_compress(kvsdk_cache* cache) {
  return guard("kvsdk_cache_compress", [&] { impl(cache).compress(); });
}

KVSDK_API kvsdk_status kvsdk_cache_set_budget(kvsdk_cache* cache, uint64_t budget_bytes) {
  return guard("kvsdk_cache_set_budget", [&] { impl(cache).set_budget(budget_bytes); });
}

KVSDK_API kvsdk_status kvsdk_cache_token_capacity(const kvsdk_cache* cache, uint64_t* out_tokens,
                                                  uint64_t* out_token_bytes) {
  return guard("kvsdk_cache_token_capacity", [&] {
    const Cache& c = impl(cache);
    const uint64_t t = c.token_capacity(), b = c.token_bytes();
    if (out_tokens) *out_tokens = t;
    if (out_token_bytes) *out_token_bytes = b;
  });
}

KVSDK_API kvsdk_status kvsdk_cache_allocation(const kvsdk_cache* cache, uint64_t* tokens,
                                              uint32_t n_layers) {
  return guard("kvsdk_cache_allocation", [&] {
    const Cache& c = impl(cache);
    KVSDK_REQUIRE(tokens != nullptr, "tokens is NULL");
    KVSDK_REQUIRE(n_layers == c.geometry().n_layers, "n_layers is ", n_layers,
                  " but the geometry has ", c.geometry().n_layers);
    const std::vector<uint64_t> a = c.allocation();
    std::copy(a.begin(), a.end(), tokens);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_set_allocation(kvsdk_cache* cache, const uint64_t* tokens,
                                                  uint32_t n_layers) {
  return guard("kvsdk_cache_set_allocation", [&] {
    Cache& c = impl(cache);
    if (tokens == nullptr) {
      KVSDK_REQUIRE(n_layers == 0, "tokens is NULL but n_layers is ", n_layers);
      c.set_allocation({});
      return;
    }
    KVSDK_REQUIRE(n_layers == c.geometry().n_layers, "n_layers is ", n_layers,
                  " but the geometry has ", c.geometry().n_layers);
    c.set_allocation(std::vector<uint64_t>(tokens, tokens + n_layers));
  });
}

KVSDK_API kvsdk_status kvsdk_plan_allocation(uint32_t n_layers, const float* const* importance,
                                             const size_t* lengths, int32_t mode, double value,
                                             uint64_t* out_tokens) {
  return guard("kvsdk_plan_allocation", [&] {
    KVSDK_REQUIRE(n_layers == 0 || (importance && lengths && out_tokens),
                  "importance, lengths or out_tokens is NULL");
    std::vector<std::vector<float>> w(n_layers);
    for (uint32_t i = 0; i < n_layers; ++i) {
      KVSDK_REQUIRE(lengths[i] == 0 || importance[i] != nullptr, "importance[", i, "] is NULL");
      w[i].assign(importance[i], importance[i] + lengths[i]);
      for (size_t j = 0; j < lengths[i]; ++j) {
        KVSDK_REQUIRE(std::isfinite(w[i][j]) && w[i][j] >= 0.0f, "importance[", i, "][", j,
                      "] is ", w[i][j], " (must be finite and >= 0)");
      }
    }
    const std::vector<uint64_t> n = plan_xkv(w, mode, value);
    std::copy(n.begin(), n.end(), out_tokens);
  });
}

}  // extern "C"
