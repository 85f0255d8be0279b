// What the per-preset API tests (fork, truncate) share: every preset family, a snapshot of a
// cache as bytes (equal caches give equal bytes), a context's used bytes, and test names.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
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

// A gtest parameter name for a preset ("snapkv+kivi2" -> "snapkv_kivi2").
inline std::string preset_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (char& ch : s) {
    if (ch == '+') ch = '_';
  }
  return s;
}

}  // namespace kvsdk_test
