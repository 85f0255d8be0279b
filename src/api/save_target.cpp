// Save-time compression: a cache converted to a target policy and budget (save_target.h; the
// contract per source and target is include/kvsdk.h's "Targeted saves").
#include "save_target.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cache.h"
#include "core/method_traits.h"
#include "core/policy.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/options.h"
#include "util/struct_versions.h"

namespace kvsdk {

namespace {

// Tokens appended per call: bounds the scratch rows, and lets a target that compresses as it
// goes (KIVI's blocks) do so chunk by chunk.
constexpr size_t kChunkTokens = 256;

// Every layer of `src` appended to `dst` (empty, same geometry) in stored order. The rows are
// what kvsdk_cache_read returns (exact, dequantized or reconstructed: include/kvsdk.h).
void reappend(const Cache& src, Cache& dst) {
  const Geometry& g = src.geometry();
  const size_t row = size_t(g.head_dim) * dtype_size(g.dtype), heads = g.n_kv_heads;
  std::vector<unsigned char> k, v, kc(kChunkTokens * heads * row), vc(kChunkTokens * heads * row);
  std::vector<int32_t> pos;
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    const size_t n = src.head_tokens(layer, 0);
    // Head-major as read: [kv head][token][dim], one position list per head.
    k.resize(heads * n * row);
    v.resize(heads * n * row);
    pos.resize(heads * n);
    for (uint32_t h = 0; h < heads; ++h) {
      if (src.head_tokens(layer, h) != n) {
        fail(KVSDK_E_UNSUPPORTED, "layer ", layer, " of the source cache was evicted per KV head "
             "(head 0 holds ", n, " rows, head ", h, " ", src.head_tokens(layer, h), "); its rows "
             "cannot be re-appended under another policy (an append takes every KV head of a "
             "token)");
      }
      src.read(layer, h, k.data() + h * n * row, v.data() + h * n * row, pos.data() + h * n, n);
      if (!std::equal(pos.begin(), pos.begin() + n, pos.begin() + h * n)) {
        fail(KVSDK_E_UNSUPPORTED, "layer ", layer, " of the source cache was evicted per KV head "
             "(head ", h, " holds other positions than head 0); its rows cannot be re-appended "
             "under another policy (an append takes every KV head of a token)");
      }
    }
    // Token-major chunks, as append takes them: [token][kv head][dim].
    for (size_t t0 = 0; t0 < n; t0 += kChunkTokens) {
      const size_t m = std::min(kChunkTokens, n - t0);
      for (size_t t = 0; t < m; ++t) {
        for (size_t h = 0; h < heads; ++h) {
          const size_t from = (h * n + t0 + t) * row, to = (t * heads + h) * row;
          std::memcpy(kc.data() + to, k.data() + from, row);
          std::memcpy(vc.data() + to, v.data() + from, row);
        }
      }
      dst.append(layer, m, kc.data(), vc.data(), pos.data() + t0);
    }
  }
}

// Refuses a source whose rows, as read, are not what it holds (include/kvsdk.h's list).
void require_convertible_source(const Cache& src) {
  if (src.prefix()) {
    fail(KVSDK_E_UNSUPPORTED, "the cache continues a shared prefix, whose rows are not its own: "
         "it cannot be saved under another policy");
  }
  if (method_traits(src.policy()).prefetches) {
    fail(KVSDK_E_UNSUPPORTED, "policy '", policy_spec(src.policy()), "' keeps its exact rows in "
         "its backing store, which a conversion does not read: it cannot be saved under another "
         "policy");
  }
  const kvsdk_cache_stats s = src.stats();
  if (s.bytes_by_tier[KVSDK_TIER_VALUE_ONLY] != 0) {
    fail(KVSDK_E_UNSUPPORTED, "the cache holds value-only rows (policy '",
         policy_spec(src.policy()), "' keeps no keys for its marginal tokens): it cannot be "
         "saved under another policy");
  }
}

// A budget that leaves a layer that held rows with none has no conversation left to save:
// refused rather than written as an empty file.
void require_rows_kept(const Cache& src, const Cache& dst, uint64_t budget) {
  const Geometry& g = src.geometry();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    size_t had = 0, kept = 0;
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      had += src.head_tokens(l, h);
      kept += dst.head_tokens(l, h);
    }
    if (had != 0 && kept == 0) {
      fail(KVSDK_E_BUDGET, "target_budget_bytes ", budget, " leaves layer ", l, " no row under "
           "policy '", policy_spec(dst.policy()), "' (it held ", had, " rows over its KV heads)");
    }
  }
}

}  // namespace

SaveTarget save_target_from_c(const kvsdk_save_options* options) {
  SaveTarget t;
  if (!options) return t;
  kvsdk_save_options d{};
  d.struct_size = sizeof(d);
  // Validated again here only for the fields this file reads (save_params_from_c checks the
  // rest); a struct older than target_policy gets NULL and 0.
  const kvsdk_save_options o = read_versioned(options, d, kSaveOptionsSizeV1, "options");
  if (!o.target_policy) {
    KVSDK_REQUIRE(o.target_budget_bytes == 0, "options.target_budget_bytes is ",
                  o.target_budget_bytes, " without options.target_policy (pass the cache's own "
                  "policy to compress it under that)");
    return t;
  }
  t.set = true;
  t.policy = policy_from_c(o.target_policy);
  require_policy_implemented(t.policy);
  if (method_traits(t.policy).needs_proxy) {
    fail(KVSDK_E_UNSUPPORTED, "target policy '", policy_spec(t.policy), "' needs its proxy "
         "cache (kvsdk_cache_set_proxy), which a save does not have: a cache cannot be saved "
         "as it");
  }
  t.budget = o.target_budget_bytes;
  return t;
}

std::unique_ptr<Cache> convert_cache(const Cache& src, const SaveTarget& target) {
  const uint64_t budget = target.budget != 0 ? target.budget : src.budget();
  // A device cache converts on the host, in a context of the same budget: its rows are staged
  // there for the save anyway, and the conversion needs no room in the device arena.
  std::shared_ptr<Context> ctx = src.context_ptr();
  if (ctx->arena()) ctx = std::make_shared<Context>(KVSDK_BACKEND_CPU, 0, ctx->budget(), 1);
  std::unique_ptr<Cache> dst;
  if (target.policy.method == src.policy().method &&
      target.policy.quant_bits == src.policy().quant_bits) {
    // The same store: the cache as it is, compressed by its own policy state.
    dst = src.fork(ctx);
    if (budget != dst->budget()) dst->set_budget(budget);
    require_rows_kept(src, *dst, budget);
    return dst;
  }
  require_convertible_source(src);
  dst = std::make_unique<Cache>(ctx, src.geometry(), target.policy);
  reappend(src, *dst);
  // Set last, then compressed, so that the allocation stage sees every layer's rows at once.
  if (budget != 0) {
    dst->set_budget(budget);
    dst->compress();
  }
  require_rows_kept(src, *dst, budget);
  return dst;
}

}  // namespace kvsdk
