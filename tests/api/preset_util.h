// What the per-preset API tests (fork, truncate, parallel frames) share: every preset family, a
// snapshot of a cache as bytes (equal caches give equal bytes), a context's used bytes, one decode
// step of a conversation, and test names.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

namespace kvsdk_test {

inline const char* const kPresets[] = {
    "full",          "streaming_llm", "h2o",       "snapkv",         "pyramidkv",
    "xkv",           "snapkv+kivi2",  "h2o+kivi4", "kivi",           "spindlekv",
    "minicache",     "minicache+kivi4", "specache", "smallkv",
};

inline std::vector<uint8_t> snapshot(kvsdk_cache* c) {
  kvsdk_save_options opt;
  kvsdk_save_options_init(&opt);
  opt.zstd_level = -7;  // only equality matters
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &opt, nullptr, 0, &size), KVSDK_OK)
      << kvsdk_last_error();
  std::vector<uint8_t> out(size);
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &opt, out.data(), size, &size), KVSDK_OK)
      << kvsdk_last_error();
  out.resize(size);
  return out;
}

inline uint64_t used(kvsdk_context* ctx) {
  uint64_t u = 0;
  EXPECT_EQ(kvsdk_context_used_bytes(ctx, &u), KVSDK_OK);
  return u;
}

// A preset's policy with small windows, so that short test runs quantize, evict and fetch:
// KIVI blocks of `quant_group` after a residual of 4, observation windows of 4, 2 sink tokens,
// SpeCache fetching 4 rows, SmallKV matching on 8 tokens.
inline kvsdk_policy small_policy(const char* spec, int32_t quant_group) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK) << spec;
  p.quant_group = quant_group;
  p.quant_residual = 4;
  p.obs_window = 4;
  p.sink_tokens = 2;
  p.fetch_tokens = 4;
  p.match_tokens = 8;
  return p;
}

// Whether a preset evicts rows of its exact tier (the eviction presets and their +kivi overlays).
inline bool evicts(const std::string& spec) {
  for (const char* m : {"streaming_llm", "h2o", "snapkv", "pyramidkv", "xkv"}) {
    if (spec.rfind(m, 0) == 0) return true;
  }
  return false;
}

// One conversation: its cache and, for smallkv, its proxy cache (1 KV head, linked).
struct Chat {
  CachePtr cache, proxy;
};

// A new conversation of `policy` on `ctx`. An evicting preset gets a per-cache budget of
// `evict_budget` bytes, so each conversation evicts by its own budget alone.
inline Chat start_chat(kvsdk_context* ctx, const kvsdk_geometry& g, const kvsdk_policy& policy,
                       const std::string& spec, uint64_t evict_budget,
                       const kvsdk_geometry& proxy_geometry) {
  Chat c;
  c.cache = make_cache(ctx, g, &policy);
  EXPECT_TRUE(c.cache) << kvsdk_last_error();
  if (evicts(spec)) {
    EXPECT_EQ(kvsdk_cache_set_budget(c.cache.get(), evict_budget), KVSDK_OK)
        << kvsdk_last_error();
  }
  if (policy.method == KVSDK_METHOD_SMALLKV) {
    c.proxy = make_cache(ctx, proxy_geometry);
    EXPECT_EQ(kvsdk_cache_set_proxy(c.cache.get(), c.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
  }
  return c;
}

// One decode step of `c` at position `pos` with unit-normal inputs drawn from `rng`: for smallkv
// the proxy (`proxy_g`) appends and attends first, then every layer of the cache (`g`) appends
// one token and attends one query per query head, and with `prefetch` (specache) prefetches the
// next position's queries. Returns every layer's attention output, layer after layer.
inline std::vector<float> decode_step(Chat& c, const kvsdk_geometry& g,
                                      const kvsdk_geometry& proxy_g, bool prefetch, int32_t pos,
                                      std::mt19937& rng) {
  SCOPED_TRACE("position " + std::to_string(pos));
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto noise = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = d(rng);
    return x;
  };
  if (c.proxy) {
    const size_t kv = size_t(proxy_g.n_kv_heads) * proxy_g.head_dim;
    const size_t q_row = size_t(proxy_g.n_q_heads) * proxy_g.head_dim;
    for (uint32_t l = 0; l < proxy_g.n_layers; ++l) {
      const std::vector<float> k = noise(kv), v = noise(kv), q = noise(q_row);
      std::vector<float> o(q_row);
      EXPECT_EQ(kvsdk_cache_append(c.proxy.get(), l, 1, k.data(), v.data(), &pos, kv * 4),
                KVSDK_OK);
      EXPECT_EQ(kvsdk_cache_attend(c.proxy.get(), l, 1, q.data(), &pos, q_row * 4, o.data(),
                                   q_row * 4),
                KVSDK_OK)
          << kvsdk_last_error();
    }
  }
  const size_t kv = size_t(g.n_kv_heads) * g.head_dim, q_row = size_t(g.n_q_heads) * g.head_dim;
  std::vector<float> outs;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const std::vector<float> k = noise(kv), v = noise(kv), q = noise(q_row);
    std::vector<float> o(q_row);
    EXPECT_EQ(kvsdk_cache_append(c.cache.get(), l, 1, k.data(), v.data(), &pos, kv * 4), KVSDK_OK)
        << kvsdk_last_error();
    EXPECT_EQ(kvsdk_cache_attend(c.cache.get(), l, 1, q.data(), &pos, q_row * 4, o.data(),
                                 q_row * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    if (prefetch) {
      const std::vector<float> next = noise(q_row);
      const int32_t p1 = pos + 1;
      EXPECT_EQ(kvsdk_cache_prefetch(c.cache.get(), l, 1, next.data(), &p1, q_row * 4), KVSDK_OK)
          << kvsdk_last_error();
    }
    outs.insert(outs.end(), o.begin(), o.end());
  }
  return outs;
}

// A gtest parameter name for a preset ("snapkv+kivi2" -> "snapkv_kivi2").
inline std::string preset_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (char& ch : s) {
    if (ch == '+') ch = '_';
  }
  return s;
}

}  // namespace kvsdk_test
