// C ABI: SmallKV's proxy link (kvsdk_cache_set_proxy). The checks live here; the link itself is
// src/repr/smallkv_proxy.h.
#include "core/cache.h"
#include "core/policy.h"
#include "kvsdk.h"
#include "repr/smallkv_repr.h"
#include "util/error.h"

using namespace kvsdk;

extern "C" {

KVSDK_API kvsdk_status kvsdk_cache_set_proxy(kvsdk_cache* cache, kvsdk_cache* proxy) {
  return guard("kvsdk_cache_set_proxy", [&] {
    KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
    Cache& c = *cache->impl;
    if (!method_traits(c.policy()).needs_proxy) {
      fail(KVSDK_E_UNSUPPORTED, "a proxy cache is SmallKV's; policy '", policy_spec(c.policy()),
           "' does not use one");
    }
    auto* repr = dynamic_cast<SmallKvRepresentation*>(c.representation());
    if (repr == nullptr) fail(KVSDK_E_INTERNAL, "a smallkv cache without its representation");
    if (proxy == nullptr) {
      repr->set_proxy(nullptr);
      return;
    }
    KVSDK_REQUIRE(proxy->impl != nullptr, "proxy is not a valid cache");
    KVSDK_REQUIRE(proxy != cache, "a cache cannot be its own proxy");
    Cache& p = *proxy->impl;
    KVSDK_REQUIRE(p.policy().method == KVSDK_METHOD_FULL, "the proxy's policy is '",
                  policy_spec(p.policy()), "'; it must be 'full' (SmallKV needs the proxy's "
                  "attention over its whole cache)");
    if (p.frozen()) {
      fail(KVSDK_E_STATE, "the proxy cache is frozen (a shared prefix); a proxy keeps growing "
           "with the conversation");
    }
    if (p.has_attention_tap()) {
      // Either this cache's current proxy (set again: nothing to do) or another cache's.
      if (repr->proxy_cache() == &p) return;
      fail(KVSDK_E_STATE, "this proxy cache already serves another smallkv cache; a proxy "
           "serves one cache at a time");
    }
    repr->set_proxy(&p);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_set_proxy_wait(kvsdk_cache* cache, uint32_t timeout_ms) {
  return guard("kvsdk_cache_set_proxy_wait", [&] {
    KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
    Cache& c = *cache->impl;
    if (!method_traits(c.policy()).needs_proxy) {
      fail(KVSDK_E_UNSUPPORTED, "waiting for a proxy is SmallKV's; policy '",
           policy_spec(c.policy()), "' does not use one");
    }
    auto* repr = dynamic_cast<SmallKvRepresentation*>(c.representation());
    if (repr == nullptr) fail(KVSDK_E_INTERNAL, "a smallkv cache without its representation");
    repr->set_proxy_wait(timeout_ms);
  });
}

}  // extern "C"
