// C ABI: caches (create/destroy, append, attend, read, stats). Checks every argument, then calls
// the C++ core inside guard() so that errors become statuses.
#include <cstring>
#include <limits>
#include <memory>

#include "core/cache.h"
#include "core/geometry.h"
#include "core/policy.h"
#include "kvsdk.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/options.h"
#include "util/positions.h"
#include "util/struct_versions.h"

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

// Bytes of `rows` rows of `elems` elements of `dtype`, or fail when that overflows size_t.
size_t tensor_bytes(size_t rows, size_t elems, kvsdk_dtype dtype, const char* what) {
  const size_t row_bytes = elems * dtype_size(dtype);
  KVSDK_REQUIRE(rows <= std::numeric_limits<size_t>::max() / row_bytes, what, ": ", rows,
                " rows overflow the address space");
  return rows * row_bytes;
}

}  // namespace

extern "C" {

KVSDK_API kvsdk_status kvsdk_geometry_init_sized(kvsdk_geometry* geometry, size_t struct_size) {
  return guard("kvsdk_geometry_init_sized", [&] {
    init_versioned(geometry, struct_size, geometry_defaults(), kGeometrySizeV1, "geometry");
  });
}

// The legacy *_init symbols are frozen at the first version's size: an app built before the
// *_init_sized functions existed may have a struct that small (include/kvsdk.h, ABI rules).
KVSDK_API kvsdk_status(kvsdk_geometry_init)(kvsdk_geometry* geometry) {
  return guard("kvsdk_geometry_init", [&] {
    init_versioned(geometry, kGeometrySizeV1, geometry_defaults(), kGeometrySizeV1, "geometry");
  });
}

KVSDK_API kvsdk_status kvsdk_cache_create(kvsdk_cache** out, kvsdk_context* ctx,
                                          const kvsdk_geometry* geometry,
                                          const kvsdk_policy* policy) {
  return guard("kvsdk_cache_create", [&] {
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    KVSDK_REQUIRE(ctx != nullptr, "ctx is NULL");
    const Geometry g = Geometry::from_c(geometry);
    const kvsdk_policy p = policy ? policy_from_c(policy) : policy_defaults(KVSDK_METHOD_FULL);
    require_policy_implemented(p);
    auto handle = std::make_unique<kvsdk_cache>();
    handle->impl = std::make_unique<Cache>(ctx->impl, g, p);
    *out = handle.release();
  });
}

KVSDK_API void kvsdk_cache_destroy(kvsdk_cache* cache) { delete cache; }

KVSDK_API kvsdk_status kvsdk_cache_fork(kvsdk_cache** out, const kvsdk_cache* cache) {
  return guard("kvsdk_cache_fork", [&] {
    const Cache& c = impl(cache);
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    auto handle = std::make_unique<kvsdk_cache>();
    handle->impl = c.fork();
    *out = handle.release();
  });
}

KVSDK_API kvsdk_status kvsdk_cache_freeze(kvsdk_cache* cache) {
  return guard("kvsdk_cache_freeze", [&] { impl(cache).freeze(); });
}

KVSDK_API kvsdk_status kvsdk_cache_create_on_prefix(kvsdk_cache** out, kvsdk_cache* prefix,
                                                    const kvsdk_policy* policy) {
  return guard("kvsdk_cache_create_on_prefix", [&] {
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    KVSDK_REQUIRE(prefix != nullptr && prefix->impl, "prefix is NULL");
    const kvsdk_policy p = policy ? policy_from_c(policy) : policy_defaults(KVSDK_METHOD_FULL);
    require_policy_implemented(p);
    auto handle = std::make_unique<kvsdk_cache>();
    handle->impl = Cache::on_prefix(prefix->impl, p);
    *out = handle.release();
  });
}

KVSDK_API kvsdk_status kvsdk_cache_truncate(kvsdk_cache* cache, int32_t position) {
  return guard("kvsdk_cache_truncate", [&] { impl(cache).truncate(position); });
}

KVSDK_API kvsdk_status kvsdk_cache_geometry(const kvsdk_cache* cache, kvsdk_geometry* out) {
  return guard("kvsdk_cache_geometry", [&] {
    const Cache& c = impl(cache);
    write_versioned(out, c.geometry().to_c(), kGeometrySizeV1, "out");
  });
}

KVSDK_API kvsdk_status kvsdk_cache_append(kvsdk_cache* cache, uint32_t layer, size_t n_tokens,
                                          const void* k, const void* v, const int32_t* positions,
                                          size_t kv_bytes) {
  return guard("kvsdk_cache_append", [&] {
    Cache& c = impl(cache);
    KVSDK_REQUIRE(k != nullptr && v != nullptr, "k or v is NULL");
    KVSDK_REQUIRE(positions != nullptr, "positions is NULL");
    KVSDK_REQUIRE(n_tokens > 0, "n_tokens is 0");
    const Geometry& g = c.geometry();
    const size_t expected = tensor_bytes(n_tokens, g.kv_elems_per_token(), g.dtype, "k/v");
    KVSDK_REQUIRE(kv_bytes == expected, "kv_bytes is ", kv_bytes, " but ", n_tokens,
                  " tokens x ", g.n_kv_heads, " KV heads x ", g.head_dim, " x ",
                  dtype_size(g.dtype), " bytes = ", expected);
    c.append(layer, n_tokens, k, v, positions);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_attend(kvsdk_cache* cache, uint32_t layer, size_t n_queries,
                                          const void* q, const int32_t* q_positions,
                                          size_t q_bytes, void* out, size_t out_bytes) {
  return guard("kvsdk_cache_attend", [&] {
    Cache& c = impl(cache);
    KVSDK_REQUIRE(q != nullptr, "q is NULL");
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    KVSDK_REQUIRE(n_queries > 0, "n_queries is 0");
    const Geometry& g = c.geometry();
    const size_t expected = tensor_bytes(n_queries, g.q_elems_per_token(), g.dtype, "q");
    KVSDK_REQUIRE(q_bytes == expected, "q_bytes is ", q_bytes, " but ", n_queries,
                  " queries x ", g.n_q_heads, " heads x ", g.head_dim, " x ", dtype_size(g.dtype),
                  " bytes = ", expected);
    KVSDK_REQUIRE(out_bytes == expected, "out_bytes is ", out_bytes, ", expected ", expected);
    if (q_positions) check_query_positions(q_positions, n_queries, "q_positions");
    c.attend(layer, n_queries, q, q_positions, out);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_read(const kvsdk_cache* cache, uint32_t layer,
                                        uint32_t kv_head, void* k, void* v, int32_t* positions,
                                        size_t capacity_tokens, size_t* n_tokens) {
  return guard("kvsdk_cache_read", [&] {
    const Cache& c = impl(cache);
    KVSDK_REQUIRE(n_tokens != nullptr, "n_tokens is NULL");
    *n_tokens = c.read(layer, kv_head, k, v, positions, capacity_tokens);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_stats_init_sized(kvsdk_cache_stats* stats,
                                                    size_t struct_size) {
  return guard("kvsdk_cache_stats_init_sized", [&] {
    init_versioned(stats, struct_size, kvsdk_cache_stats{}, kCacheStatsSizeV1, "stats");
  });
}

KVSDK_API kvsdk_status(kvsdk_cache_stats_init)(kvsdk_cache_stats* stats) {
  return guard("kvsdk_cache_stats_init", [&] {
    init_versioned(stats, kCacheStatsSizeV1, kvsdk_cache_stats{}, kCacheStatsSizeV1, "stats");
  });
}

KVSDK_API kvsdk_status kvsdk_layer_stats_init_sized(kvsdk_layer_stats* stats,
                                                    size_t struct_size) {
  return guard("kvsdk_layer_stats_init_sized", [&] {
    init_versioned(stats, struct_size, kvsdk_layer_stats{}, kLayerStatsSizeV1, "stats");
  });
}

KVSDK_API kvsdk_status(kvsdk_layer_stats_init)(kvsdk_layer_stats* stats) {
  return guard("kvsdk_layer_stats_init", [&] {
    init_versioned(stats, kLayerStatsSizeV1, kvsdk_layer_stats{}, kLayerStatsSizeV1, "stats");
  });
}

KVSDK_API kvsdk_status kvsdk_cache_stats_get(const kvsdk_cache* cache, kvsdk_cache_stats* out) {
  return guard("kvsdk_cache_stats_get", [&] {
    const Cache& c = impl(cache);
    write_versioned(out, c.stats(), kCacheStatsSizeV1, "out");
  });
}

KVSDK_API kvsdk_status kvsdk_cache_layer_stats_get(const kvsdk_cache* cache, uint32_t layer,
                                                   kvsdk_layer_stats* out) {
  return guard("kvsdk_cache_layer_stats_get", [&] {
    const Cache& c = impl(cache);
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    write_versioned(out, c.layer_stats(layer), kLayerStatsSizeV1, "out");
  });
}

}  // extern "C"
