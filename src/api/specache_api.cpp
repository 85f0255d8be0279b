// C ABI: SpeCache's speculative prefetch, fetch statistics and file-backed backing store.
// Checks every argument, then calls the C++ core inside guard() so that errors become statuses.
#include <limits>
#include <string>

#include "core/cache.h"
#include "core/policy.h"
#include "core/representation.h"
#include "kvsdk.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/positions.h"

using namespace kvsdk;

namespace {

Cache& impl(kvsdk_cache* cache) {
  KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
  return *cache->impl;
}

// The SpeCache representation of `c`, or KVSDK_E_UNSUPPORTED naming what the call needs.
const Representation& specache(const Cache& c, const char* what) {
  const Representation* r = c.representation();
  if (!method_traits(c.policy()).prefetches || r == nullptr) {
    fail(KVSDK_E_UNSUPPORTED, what, " is SpeCache's; policy '", policy_spec(c.policy()),
         "' does not use it");
  }
  return *r;
}

}  // namespace

extern "C" {

KVSDK_API kvsdk_status kvsdk_cache_set_backing_file(kvsdk_cache* cache, const char* path) {
  return guard("kvsdk_cache_set_backing_file", [&] {
    Cache& c = impl(cache);
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    specache(c, "a backing file");
    c.representation()->set_backing_file(path);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_prefetch(kvsdk_cache* cache, uint32_t layer, size_t n_queries,
                                            const void* q, const int32_t* q_positions,
                                            size_t q_bytes) {
  return guard("kvsdk_cache_prefetch", [&] {
    Cache& c = impl(cache);
    KVSDK_REQUIRE(q != nullptr, "q is NULL");
    specache(c, "prefetch (speculative queries)");
    KVSDK_REQUIRE(n_queries == 1, "n_queries is ", n_queries,
                  " (SpeCache prefetches with one speculative token per step)");
    const Geometry& g = c.geometry();
    const size_t expected = g.q_elems_per_token() * dtype_size(g.dtype);
    KVSDK_REQUIRE(q_bytes == expected, "q_bytes is ", q_bytes, " but 1 query x ", g.n_q_heads,
                  " heads x ", g.head_dim, " x ", dtype_size(g.dtype), " bytes = ", expected);
    if (q_positions) check_query_positions(q_positions, 1, "q_positions");
    c.prefetch(layer, n_queries, q, q_positions);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_fetch_stats(const kvsdk_cache* cache, double* hit_rate,
                                               uint64_t* samples) {
  return guard("kvsdk_cache_fetch_stats", [&] {
    KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
    KVSDK_REQUIRE(hit_rate != nullptr, "hit_rate is NULL");
    const Representation& r = specache(*cache->impl, "the fetch hit rate");
    const double rate = r.hit_rate();
    const uint64_t n = r.hit_rate_samples();
    *hit_rate = rate;
    if (samples) *samples = n;
  });
}

}  // extern "C"
