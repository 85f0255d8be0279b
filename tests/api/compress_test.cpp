// Compression through the C ABI: the budget is never exceeded under long random sequences of
// append/observe/compress/attend for every eviction preset; evicted caches keep correct positions
// and rows; bad input gets a status and changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

const char* const kPresets[] = {"streaming_llm", "h2o", "snapkv", "pyramidkv", "xkv"};

uint64_t used(kvsdk_context* ctx) {
  uint64_t u = 0;
  kvsdk_context_used_bytes(ctx, &u);
  return u;
}

kvsdk_policy preset(const char* name) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, name), KVSDK_OK);
  p.obs_window = 8;
  p.recent_tokens = 4;
  return p;
}

// Stats agree with the context and with themselves.
void check_consistent(kvsdk_cache* cache, kvsdk_context* ctx, uint64_t budget,
                      const kvsdk_geometry& g) {
  kvsdk_cache_stats s;
  s.struct_size = sizeof(s);
  ASSERT_EQ(kvsdk_cache_stats_get(cache, &s), KVSDK_OK);
  ASSERT_LE(used(ctx), budget);
  ASSERT_EQ(s.bytes, used(ctx));
  uint64_t tier_sum = 0, tokens = 0, bytes = 0;
  for (uint64_t b : s.bytes_by_tier) tier_sum += b;
  ASSERT_EQ(tier_sum, s.bytes);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    kvsdk_layer_stats ls;
    ls.struct_size = sizeof(ls);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(cache, l, &ls), KVSDK_OK);
    ASSERT_EQ(ls.tokens_min_head, ls.tokens_max_head);  // every KV head keeps the same count
    ASSERT_LE(ls.tokens_max_head, ls.appended_tokens);
    tokens += ls.tokens;
    bytes += ls.bytes;
  }
  ASSERT_EQ(tokens, s.tokens);
  ASSERT_EQ(bytes, s.bytes);
}

TEST(Compress, BudgetNeverExceededUnderRandomOperations) {
  const kvsdk_geometry g = make_geometry(3, 4, 2, 8);
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    std::mt19937 rng(std::hash<std::string>()(name) & 0xffff);
    const uint64_t budget = exact_bytes_per_token(g) * 40 + 2 * 8 * 4 * 8 * 4 + 5000;
    auto ctx = make_context(budget);
    const kvsdk_policy p = preset(name);
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache);
    std::vector<int32_t> next_pos(g.n_layers, 0);
    std::map<uint32_t, std::vector<float>> keys_by_layer;
    for (int op = 0; op < 300; ++op) {
      const uint32_t layer = rng() % g.n_layers;
      const int kind = rng() % 10;
      if (kind < 5) {
        const size_t n = 1 + rng() % (kind == 0 ? 60 : 4);
        auto k = random_floats(n * 16, rng());
        auto v = random_floats(n * 16, rng());
        auto pos = iota_positions(n, next_pos[layer]);
        const kvsdk_status st =
            kvsdk_cache_append(cache.get(), layer, n, k.data(), v.data(), pos.data(), n * 16 * 4);
        ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
        next_pos[layer] += int32_t(n);
      } else if (kind < 8) {
        const size_t n = 1 + rng() % 6;
        auto q = random_floats(n * 32, rng(), 3.0f);
        auto qp = iota_positions(n, std::max(0, next_pos[layer] - int32_t(n)));
        ASSERT_EQ(kvsdk_cache_observe(cache.get(), layer, n, q.data(), qp.data(), n * 32 * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      } else if (kind == 8) {
        ASSERT_EQ(kvsdk_cache_compress(cache.get()), KVSDK_OK) << kvsdk_last_error();
      } else {
        auto q = random_floats(32, rng());
        std::vector<float> out(32);
        ASSERT_EQ(kvsdk_cache_attend(cache.get(), layer, 1, q.data(), nullptr, 128, out.data(), 128),
                  KVSDK_OK);
      }
      check_consistent(cache.get(), ctx.get(), budget, g);
      // Survivors keep ascending original positions.
      for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
        size_t n = 0;
        ASSERT_EQ(kvsdk_cache_read(cache.get(), layer, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
        std::vector<int32_t> pos(n);
        ASSERT_EQ(kvsdk_cache_read(cache.get(), layer, h, nullptr, nullptr, pos.data(), n, &n),
                  KVSDK_OK);
        for (size_t i = 1; i < n; ++i) ASSERT_LT(pos[i - 1], pos[i]);
        if (n) ASSERT_LT(pos.back(), next_pos[layer]);
      }
    }
    kvsdk_cache_stats s;
    s.struct_size = sizeof(s);
    kvsdk_cache_stats_get(cache.get(), &s);
    EXPECT_LT(s.tokens, s.appended_tokens * g.n_kv_heads);  // it did evict
  }
}

TEST(Compress, EvictedCacheKeepsRowsWithTheirPositions) {
  const kvsdk_geometry g = make_geometry(1, 2, 1, 4);
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    auto ctx = make_context(0);
    const kvsdk_policy p = preset(name);
    auto cache = make_cache(ctx.get(), g, &p);
    const size_t n = 100;
    auto k = random_floats(n * 4, 1), v = random_floats(n * 4, 2);
    std::vector<int32_t> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = int32_t(3 * i + 1);  // sparse positions
    ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, n, k.data(), v.data(), pos.data(), n * 16), KVSDK_OK);
    auto q = random_floats(8 * 8, 3);
    ASSERT_EQ(kvsdk_cache_observe(cache.get(), 0, 8, q.data(), nullptr, 8 * 32), KVSDK_OK);
    uint64_t unit = 0;
    ASSERT_EQ(kvsdk_cache_token_capacity(cache.get(), nullptr, &unit), KVSDK_OK);
    kvsdk_cache_stats s;
    s.struct_size = sizeof(s);
    kvsdk_cache_stats_get(cache.get(), &s);
    const uint64_t fixed = s.bytes - n * unit;
    ASSERT_EQ(kvsdk_cache_set_budget(cache.get(), fixed + 30 * unit + unit / 2), KVSDK_OK);
    kvsdk_cache_stats_get(cache.get(), &s);
    EXPECT_EQ(s.tokens, 30u);  // byte budget converted exactly into tokens
    std::vector<float> rk(30 * 4), rv(30 * 4);
    std::vector<int32_t> rp(30);
    size_t got = 0;
    ASSERT_EQ(kvsdk_cache_read(cache.get(), 0, 0, rk.data(), rv.data(), rp.data(), 30, &got), KVSDK_OK);
    ASSERT_EQ(got, 30u);
    for (size_t i = 0; i < got; ++i) {
      ASSERT_EQ((rp[i] - 1) % 3, 0);
      const size_t src = size_t(rp[i] - 1) / 3;
      for (size_t c = 0; c < 4; ++c) {
        EXPECT_EQ(rk[i * 4 + c], kvsdk::f16_to_f32(kvsdk::f32_to_f16(k[src * 4 + c])));
        EXPECT_EQ(rv[i * 4 + c], kvsdk::f16_to_f32(kvsdk::f32_to_f16(v[src * 4 + c])));
      }
    }
    if (std::string(name) == "streaming_llm") {
      EXPECT_EQ(rp[0], 1);   // sinks
      EXPECT_EQ(rp[3], 10);
      EXPECT_EQ(rp[4], int32_t(3 * 74 + 1));  // then the newest 26
    }
    if (std::string(name) != "h2o" && std::string(name) != "streaming_llm") {
      EXPECT_EQ(rp[22], int32_t(3 * 92 + 1));  // the observation window (newest 8) stays
    }
  }
}

TEST(Compress, SnapkvKeepsTheTokenTheWindowAttendsTo) {
  const kvsdk_geometry g = make_geometry(1, 1, 1, 4);
  kvsdk_policy p = preset("snapkv");
  p.pool_kernel = 1;
  auto ctx = make_context(0);
  auto cache = make_cache(ctx.get(), g, &p);
  const size_t n = 64;
  std::vector<float> k(n * 4, 0.0f), v(n * 4, 1.0f);
  k[17 * 4] = 10.0f;  // token 17 matches the query direction
  auto pos = iota_positions(n);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, n, k.data(), v.data(), pos.data(), n * 16), KVSDK_OK);
  std::vector<float> q(8 * 4, 0.0f);
  for (int i = 0; i < 8; ++i) q[i * 4] = 1.0f;
  auto qp = iota_positions(8, 56);
  ASSERT_EQ(kvsdk_cache_observe(cache.get(), 0, 8, q.data(), qp.data(), 8 * 16), KVSDK_OK);
  uint64_t unit = 0;
  kvsdk_cache_token_capacity(cache.get(), nullptr, &unit);
  kvsdk_cache_stats s;
  s.struct_size = sizeof(s);
  kvsdk_cache_stats_get(cache.get(), &s);
  ASSERT_EQ(kvsdk_cache_set_budget(cache.get(), s.bytes - (n - 9) * unit), KVSDK_OK);
  std::vector<int32_t> rp(9);
  size_t got = 0;
  ASSERT_EQ(kvsdk_cache_read(cache.get(), 0, 0, nullptr, nullptr, rp.data(), 9, &got), KVSDK_OK);
  ASSERT_EQ(got, 9u);
  EXPECT_EQ(rp[0], 17);
  EXPECT_EQ(rp[1], 56);
}

TEST(Compress, H2oScoresPersistForKeptTokensAcrossCompressions) {
  const kvsdk_geometry g = make_geometry(1, 2, 1, 4);
  kvsdk_policy p = preset("h2o");
  p.sink_tokens = 1;
  auto ctx = make_context(0);
  auto cache = make_cache(ctx.get(), g, &p);
  std::vector<float> k(40 * 4, 0.0f), v(40 * 4, 1.0f);
  k[5 * 4 + 1] = 8.0f;  // token 5 is what the early queries look for
  auto pos = iota_positions(40);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, 40, k.data(), v.data(), pos.data(), 40 * 16), KVSDK_OK);
  std::vector<float> q(4 * 8, 0.0f);
  for (int i = 0; i < 4; ++i) q[i * 8 + 1] = q[i * 8 + 5] = 1.0f;  // both query heads
  ASSERT_EQ(kvsdk_cache_observe(cache.get(), 0, 4, q.data(), nullptr, 4 * 32), KVSDK_OK);
  uint64_t unit = 0;
  kvsdk_cache_token_capacity(cache.get(), nullptr, &unit);
  ASSERT_EQ(unit, 4u * 2 * 2 + 4 + 4);  // f16 K+V, position, f32 score
  ASSERT_EQ(kvsdk_cache_set_budget(cache.get(), 10 * unit), KVSDK_OK);
  // Decode: 30 more tokens that nobody attends to much; each append evicts one row.
  for (int32_t t = 40; t < 70; ++t) {
    std::vector<float> kt(4, 0.1f), vt(4, 1.0f), qt(8, 0.0f);
    ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, 1, kt.data(), vt.data(), &t, 16), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_observe(cache.get(), 0, 1, qt.data(), &t, 32), KVSDK_OK);
  }
  std::vector<int32_t> rp(10);
  size_t got = 0;
  ASSERT_EQ(kvsdk_cache_read(cache.get(), 0, 0, nullptr, nullptr, rp.data(), 10, &got), KVSDK_OK);
  ASSERT_EQ(got, 10u);
  EXPECT_EQ(rp[0], 0);  // sink
  // The heavy hitter kept its accumulated score through 30 evictions.
  EXPECT_NE(std::find(rp.begin(), rp.end(), 5), rp.end());
  for (int32_t t = 6; t < 40; ++t) EXPECT_EQ(std::find(rp.begin(), rp.end(), t), rp.end()) << t;
  EXPECT_EQ(rp[9], 69);
}

TEST(Compress, AppendOverBudgetStoresOnlyWhatFits) {
  // Prefill: observe the window first, then append a whole prompt to a cache whose budget holds
  // a fraction of it: incoming tokens are scored from the caller's buffer and the budget is
  // never exceeded.
  const kvsdk_geometry g = make_geometry(4, 4, 2, 8);
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    const kvsdk_policy p = preset(name);
    const uint64_t budget = 20000;
    auto ctx = make_context(budget);
    auto cache = make_cache(ctx.get(), g, &p);
    const size_t n = 200;
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      auto q = random_floats(8 * 32, 10 + l);
      auto qp = iota_positions(8, int32_t(n) - 8);
      ASSERT_EQ(kvsdk_cache_observe(cache.get(), l, 8, q.data(), qp.data(), 8 * 32 * 4), KVSDK_OK);
      auto k = random_floats(n * 16, 20 + l), v = random_floats(n * 16, 30 + l);
      auto pos = iota_positions(n);
      ASSERT_EQ(kvsdk_cache_append(cache.get(), l, n, k.data(), v.data(), pos.data(), n * 64),
                KVSDK_OK)
          << kvsdk_last_error();
      check_consistent(cache.get(), ctx.get(), budget, g);
    }
    uint64_t cap = 0, unit = 0;
    kvsdk_cache_token_capacity(cache.get(), &cap, &unit);
    kvsdk_cache_stats s;
    s.struct_size = sizeof(s);
    kvsdk_cache_stats_get(cache.get(), &s);
    EXPECT_EQ(s.tokens / g.n_kv_heads, cap + 0) << "the budget is used up to one token";
    EXPECT_LT(budget - s.bytes, unit);
  }
}

TEST(Compress, ProfileAndPlannerHoldEachLayerToItsShare) {
  const kvsdk_geometry g = make_geometry(3, 4, 2, 8);
  kvsdk_policy p = preset("xkv");
  p.evict_slack = 0.0f;  // each layer holds exactly its share (a slack evicts below it)
  const size_t n = 120;
  // Mini-prefill: score every layer without a cache.
  kvsdk_planner* planner = nullptr;
  ASSERT_EQ(kvsdk_planner_create(&planner, &g, &p), KVSDK_OK);
  std::vector<std::vector<float>> K(3), Q(3);
  auto pos = iota_positions(n);
  auto qp = iota_positions(8, int32_t(n) - 8);
  for (uint32_t l = 0; l < 3; ++l) {
    K[l] = random_floats(n * 16, 40 + l);
    Q[l] = random_floats(8 * 32, 50 + l, 2.0f + float(l));
    ASSERT_EQ(kvsdk_planner_feed_layer(planner, l, n, K[l].data(), pos.data(), n * 64, 8,
                                       Q[l].data(), qp.data(), 8 * 128),
              KVSDK_OK);
  }
  const uint64_t budget = 15000;
  auto ctx = make_context(budget);
  auto cache = make_cache(ctx.get(), g, &p);
  // Budget the windows the real prefill will observe, then plan the token capacity left.
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_EQ(kvsdk_cache_observe(cache.get(), l, 8, Q[l].data(), qp.data(), 8 * 128), KVSDK_OK);
  }
  uint64_t cap = 0;
  ASSERT_EQ(kvsdk_cache_token_capacity(cache.get(), &cap, nullptr), KVSDK_OK);
  std::vector<uint64_t> plan(3);
  ASSERT_EQ(kvsdk_planner_finish(planner, KVSDK_ALLOC_TOTAL_TOKENS, double(cap), plan.data(), 3),
            KVSDK_OK);
  kvsdk_planner_destroy(planner);
  EXPECT_EQ(plan[0] + plan[1] + plan[2], cap);
  ASSERT_EQ(kvsdk_cache_set_allocation(cache.get(), plan.data(), 3), KVSDK_OK);
  for (uint32_t l = 0; l < 3; ++l) {
    auto v = random_floats(n * 16, 60 + l);
    ASSERT_EQ(kvsdk_cache_append(cache.get(), l, n, K[l].data(), v.data(), pos.data(), n * 64),
              KVSDK_OK);
    ASSERT_LE(used(ctx.get()), budget);
  }
  std::vector<uint64_t> alloc(3);
  ASSERT_EQ(kvsdk_cache_allocation(cache.get(), alloc.data(), 3), KVSDK_OK);
  EXPECT_EQ(alloc, plan);

  // Profile: record, average, save, load, apply to a fresh cache.
  kvsdk_profile* prof = nullptr;
  ASSERT_EQ(kvsdk_profile_create(&prof, 3), KVSDK_OK);
  ASSERT_EQ(kvsdk_profile_record(prof, alloc.data(), 3), KVSDK_OK);
  const uint64_t other[3] = {10, 20, 30};
  ASSERT_EQ(kvsdk_profile_record(prof, other, 3), KVSDK_OK);
  double shares[3];
  uint32_t samples = 0;
  ASSERT_EQ(kvsdk_profile_shares(prof, shares, 3, &samples), KVSDK_OK);
  EXPECT_EQ(samples, 2u);
  const double total = double(alloc[0] + alloc[1] + alloc[2]);
  EXPECT_NEAR(shares[0], (alloc[0] / total + 10.0 / 60) / 2, 1e-12);
  const std::string path = ::testing::TempDir() + "/kvsdk_profile_test.kvap";
  ASSERT_EQ(kvsdk_profile_save(prof, path.c_str()), KVSDK_OK);
  kvsdk_profile_destroy(prof);
  kvsdk_profile* loaded = nullptr;
  ASSERT_EQ(kvsdk_profile_load(&loaded, path.c_str()), KVSDK_OK);
  double shares2[3];
  ASSERT_EQ(kvsdk_profile_shares(loaded, shares2, 3, &samples), KVSDK_OK);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(shares[i], shares2[i]);
  auto ctx2 = make_context(budget);
  auto cache2 = make_cache(ctx2.get(), g, &p);
  ASSERT_EQ(kvsdk_cache_apply_profile(cache2.get(), loaded), KVSDK_OK);
  for (uint32_t l = 0; l < 3; ++l) {
    auto v = random_floats(n * 16, 70 + l);
    ASSERT_EQ(kvsdk_cache_append(cache2.get(), l, n, K[l].data(), v.data(), pos.data(), n * 64),
              KVSDK_OK);
    ASSERT_LE(used(ctx2.get()), budget);
  }
  kvsdk_profile_destroy(loaded);
  // A corrupt file is rejected.
  FILE* f = fopen(path.c_str(), "r+b");
  ASSERT_TRUE(f);
  fseek(f, 6, SEEK_SET);
  fputc('X', f);
  fclose(f);
  kvsdk_profile* bad = nullptr;
  EXPECT_EQ(kvsdk_profile_load(&bad, path.c_str()), KVSDK_E_CORRUPT);
  EXPECT_EQ(bad, nullptr);
  std::remove(path.c_str());
}

TEST(Compress, BadInputGetsStatusAndChangesNothing) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 8);
  const kvsdk_policy p = preset("snapkv");
  auto ctx = make_context(0);
  auto cache = make_cache(ctx.get(), g, &p);
  auto q = random_floats(32, 1);
  EXPECT_EQ(kvsdk_cache_observe(nullptr, 0, 1, q.data(), nullptr, 128), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_observe(cache.get(), 0, 1, nullptr, nullptr, 128), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_observe(cache.get(), 0, 0, q.data(), nullptr, 0), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_observe(cache.get(), 0, 1, q.data(), nullptr, 127), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_observe(cache.get(), 2, 1, q.data(), nullptr, 128), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_compress(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_set_budget(nullptr, 1), KVSDK_E_INVALID_ARG);
  uint64_t a[2] = {1, 1};
  EXPECT_EQ(kvsdk_cache_set_allocation(cache.get(), a, 3), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_allocation(cache.get(), a, 1), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(used(ctx.get()), 0u);
  // A budget too small for the window metadata fails and keeps the cache and its budget.
  ASSERT_EQ(kvsdk_cache_observe(cache.get(), 0, 1, q.data(), nullptr, 128), KVSDK_OK);
  const uint64_t before = used(ctx.get());
  EXPECT_EQ(kvsdk_cache_set_budget(cache.get(), 10), KVSDK_E_BUDGET);
  EXPECT_EQ(used(ctx.get()), before);
  // 'full' cannot evict.
  auto full = make_cache(ctx.get(), g);
  EXPECT_EQ(kvsdk_cache_set_allocation(full.get(), a, 2), KVSDK_E_UNSUPPORTED);
  auto k = random_floats(16 * 10, 2);
  auto pos = iota_positions(10);
  ASSERT_EQ(kvsdk_cache_append(full.get(), 0, 10, k.data(), k.data(), pos.data(), 640), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_set_budget(full.get(), 100), KVSDK_E_BUDGET);
  // Unimplemented overlays stay unsupported ('full' takes none; eviction presets do).
  kvsdk_policy x;
  ASSERT_EQ(kvsdk_policy_parse(&x, "full+kivi2"), KVSDK_OK);
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &g, &x), KVSDK_E_UNSUPPORTED);
  // Planner and profile misuse.
  kvsdk_planner* pl = nullptr;
  EXPECT_EQ(kvsdk_planner_create(&pl, nullptr, &p), KVSDK_E_INVALID_ARG);
  ASSERT_EQ(kvsdk_planner_create(&pl, &g, &p), KVSDK_OK);
  uint64_t out[2];
  EXPECT_EQ(kvsdk_planner_finish(pl, 0, 10, out, 2), KVSDK_E_STATE);
  EXPECT_EQ(kvsdk_planner_feed_layer(pl, 5, 1, k.data(), pos.data(), 64, 1, q.data(), nullptr, 128),
            KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_planner_feed_layer(pl, 0, 1, k.data(), pos.data(), 63, 1, q.data(), nullptr, 128),
            KVSDK_E_INVALID_ARG);
  kvsdk_planner_destroy(pl);
  kvsdk_profile* prof = nullptr;
  EXPECT_EQ(kvsdk_profile_create(&prof, 0), KVSDK_E_INVALID_ARG);
  ASSERT_EQ(kvsdk_profile_create(&prof, 2), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_apply_profile(cache.get(), prof), KVSDK_E_STATE);
  const uint64_t zeros[2] = {0, 0};
  EXPECT_EQ(kvsdk_profile_record(prof, zeros, 2), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_profile_save(prof, "/nonexistent/x"), KVSDK_E_STATE);
  kvsdk_profile* none = nullptr;
  EXPECT_EQ(kvsdk_profile_load(&none, "/nonexistent/x"), KVSDK_E_IO);
  kvsdk_profile_destroy(prof);
}

}  // namespace

// A 'full' cache never evicts, so its own budget (kvsdk_cache_set_budget) must refuse appends
// past it, as the context budget does; the refusal changes nothing.
TEST(Compress, FullCacheHonoursItsOwnBudget) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 8);
  auto ctx = make_context(0);  // the context itself is unlimited
  auto full = make_cache(ctx.get(), g);
  auto k = random_floats(16 * 10, 3);
  auto pos = iota_positions(10);
  ASSERT_EQ(kvsdk_cache_append(full.get(), 0, 4, k.data(), k.data(), pos.data(), 256), KVSDK_OK);
  const uint64_t held = used(ctx.get());
  ASSERT_EQ(kvsdk_cache_set_budget(full.get(), held + held / 2), KVSDK_OK);
  // Four more tokens would double the bytes: past the cache's budget.
  EXPECT_EQ(kvsdk_cache_append(full.get(), 0, 4, k.data(), k.data(), pos.data() + 4, 256),
            KVSDK_E_BUDGET);
  EXPECT_NE(std::string(kvsdk_last_error()).find("own budget"), std::string::npos) << kvsdk_last_error();
  EXPECT_EQ(used(ctx.get()), held);
  size_t n = 0;
  ASSERT_EQ(kvsdk_cache_read(full.get(), 0, 0, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  EXPECT_EQ(n, 4u);
  // Two fit.
  EXPECT_EQ(kvsdk_cache_append(full.get(), 0, 2, k.data(), k.data(), pos.data() + 4, 128), KVSDK_OK);
  EXPECT_LE(used(ctx.get()), held + held / 2);
}
