// C ABI: allocation profiles and the mini-prefill planner.
#include <memory>
#include <vector>

#include "core/cache.h"
#include "core/geometry.h"
#include "core/policy.h"
#include "kvsdk.h"
#include "policy/allocation_profile.h"
#include "policy/planner.h"
#include "util/dtype.h"
#include "util/error.h"

using namespace kvsdk;

struct kvsdk_profile {
  policy::AllocationProfile impl;
};
struct kvsdk_planner {
  std::unique_ptr<policy::Planner> impl;
};

namespace {

kvsdk_profile& prof(kvsdk_profile* p) {
  KVSDK_REQUIRE(p != nullptr, "profile is NULL");
  return *p;
}
const kvsdk_profile& prof(const kvsdk_profile* p) {
  KVSDK_REQUIRE(p != nullptr, "profile is NULL");
  return *p;
}

}  // namespace

extern "C" {

KVSDK_API kvsdk_status kvsdk_profile_create(kvsdk_profile** out, uint32_t n_layers) {
  return guard("kvsdk_profile_create", [&] {
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    KVSDK_REQUIRE(n_layers >= 1 && n_layers <= kMaxLayers, "n_layers is ", n_layers,
                  " (must be 1..", kMaxLayers, ")");
    *out = new kvsdk_profile{policy::AllocationProfile(n_layers)};
  });
}

KVSDK_API void kvsdk_profile_destroy(kvsdk_profile* profile) { delete profile; }

KVSDK_API kvsdk_status kvsdk_profile_record(kvsdk_profile* profile, const uint64_t* tokens,
                                            uint32_t n_layers) {
  return guard("kvsdk_profile_record", [&] {
    kvsdk_profile& p = prof(profile);
    KVSDK_REQUIRE(tokens != nullptr, "tokens is NULL");
    KVSDK_REQUIRE(n_layers == p.impl.n_layers(), "n_layers is ", n_layers, " but the profile has ",
                  p.impl.n_layers());
    p.impl.record(std::vector<uint64_t>(tokens, tokens + n_layers));
  });
}

KVSDK_API kvsdk_status kvsdk_profile_shares(const kvsdk_profile* profile, double* shares,
                                            uint32_t n_layers, uint32_t* out_samples) {
  return guard("kvsdk_profile_shares", [&] {
    const kvsdk_profile& p = prof(profile);
    KVSDK_REQUIRE(n_layers == p.impl.n_layers(), "n_layers is ", n_layers, " but the profile has ",
                  p.impl.n_layers());
    const std::vector<double> s = p.impl.shares();
    if (shares) std::copy(s.begin(), s.end(), shares);
    if (out_samples) *out_samples = p.impl.samples();
  });
}

KVSDK_API kvsdk_status kvsdk_profile_save(const kvsdk_profile* profile, const char* path) {
  return guard("kvsdk_profile_save", [&] {
    const kvsdk_profile& p = prof(profile);
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    p.impl.save(path);
  });
}

KVSDK_API kvsdk_status kvsdk_profile_load(kvsdk_profile** out, const char* path) {
  return guard("kvsdk_profile_load", [&] {
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    auto p = std::make_unique<kvsdk_profile>(kvsdk_profile{policy::AllocationProfile::load(path)});
    *out = p.release();
  });
}

KVSDK_API kvsdk_status kvsdk_cache_apply_profile(kvsdk_cache* cache, const kvsdk_profile* profile) {
  return guard("kvsdk_cache_apply_profile", [&] {
    KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
    if (profile == nullptr) {
      cache->impl->set_profile_shares({});
      return;
    }
    KVSDK_REQUIRE(profile->impl.n_layers() == cache->impl->geometry().n_layers, "the profile has ",
                  profile->impl.n_layers(), " layers but the geometry has ",
                  cache->impl->geometry().n_layers);
    cache->impl->set_profile_shares(profile->impl.shares());
  });
}

KVSDK_API kvsdk_status kvsdk_planner_create(kvsdk_planner** out, const kvsdk_geometry* geometry,
                                            const kvsdk_policy* policy) {
  return guard("kvsdk_planner_create", [&] {
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    const Geometry g = Geometry::from_c(geometry);
    KVSDK_REQUIRE(policy != nullptr, "policy is NULL");
    const kvsdk_policy p = policy_from_c(policy);
    auto h = std::make_unique<kvsdk_planner>();
    h->impl = std::make_unique<policy::Planner>(g, p);
    *out = h.release();
  });
}

KVSDK_API void kvsdk_planner_destroy(kvsdk_planner* planner) { delete planner; }

KVSDK_API kvsdk_status kvsdk_planner_feed_layer(kvsdk_planner* planner, uint32_t layer,
                                                size_t n_tokens, const void* k,
                                                const int32_t* positions, size_t k_bytes,
                                                size_t n_queries, const void* q,
                                                const int32_t* q_positions, size_t q_bytes) {
  return guard("kvsdk_planner_feed_layer", [&] {
    KVSDK_REQUIRE(planner != nullptr && planner->impl, "planner is NULL");
    KVSDK_REQUIRE(k && positions && q, "k, positions or q is NULL");
    KVSDK_REQUIRE(n_tokens > 0 && n_queries > 0, "n_tokens or n_queries is 0");
    const Geometry& g = planner->impl->geometry();
    const size_t krow = g.kv_elems_per_token() * dtype_size(g.dtype);
    const size_t qrow = g.q_elems_per_token() * dtype_size(g.dtype);
    KVSDK_REQUIRE(n_tokens <= SIZE_MAX / krow && k_bytes == n_tokens * krow, "k_bytes is ", k_bytes,
                  ", expected ", n_tokens * krow);
    KVSDK_REQUIRE(n_queries <= SIZE_MAX / qrow && q_bytes == n_queries * qrow, "q_bytes is ",
                  q_bytes, ", expected ", n_queries * qrow);
    planner->impl->feed_layer(layer, n_tokens, k, positions, n_queries, q, q_positions);
  });
}

KVSDK_API kvsdk_status kvsdk_planner_finish(kvsdk_planner* planner, int32_t mode, double value,
                                            uint64_t* out_tokens, uint32_t n_layers) {
  return guard("kvsdk_planner_finish", [&] {
    KVSDK_REQUIRE(planner != nullptr && planner->impl, "planner is NULL");
    KVSDK_REQUIRE(out_tokens != nullptr, "out_tokens is NULL");
    KVSDK_REQUIRE(n_layers == planner->impl->geometry().n_layers, "n_layers is ", n_layers,
                  " but the geometry has ", planner->impl->geometry().n_layers);
    const std::vector<uint64_t> n = planner->impl->finish(mode, value);
    std::copy(n.begin(), n.end(), out_tokens);
  });
}

}  // extern "C"
