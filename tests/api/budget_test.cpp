// The budget contract: a cache never holds more bytes than its context allows; an append that
// does not fit fails with KVSDK_E_BUDGET and changes nothing.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

uint64_t used(kvsdk_context* ctx) {
  uint64_t u = 0;
  kvsdk_context_used_bytes(ctx, &u);
  return u;
}

TEST(Budget, AppendBeyondBudgetFailsAndLeavesCacheUnchanged) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 16);
  const uint64_t per_token = exact_bytes_per_token(g);
  auto ctx = make_context(per_token * 10);
  auto cache = make_cache(ctx.get(), g);
  auto k = random_floats(11 * 32, 1);
  auto pos = iota_positions(11);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, 10, k.data(), k.data(), pos.data(), 10 * 32 * 4),
            KVSDK_OK);
  EXPECT_EQ(used(ctx.get()), per_token * 10);
  int32_t p = 10;
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 1, 1, k.data(), k.data(), &p, 32 * 4), KVSDK_E_BUDGET);
  EXPECT_NE(std::string(kvsdk_last_error()).find("budget"), std::string::npos);
  EXPECT_EQ(used(ctx.get()), per_token * 10);
  size_t n = 0;
  ASSERT_EQ(kvsdk_cache_read(cache.get(), 1, 0, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  EXPECT_EQ(n, 0u);
  kvsdk_layer_stats ls;
  ls.struct_size = sizeof(ls);
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 1, &ls), KVSDK_OK);
  EXPECT_EQ(ls.appended_tokens, 0u);
}

TEST(Budget, SharedByCachesAndReturnedOnDestroy) {
  const kvsdk_geometry g = make_geometry(1, 2, 1, 8);
  const uint64_t per_token = exact_bytes_per_token(g);
  auto ctx = make_context(per_token * 6);
  auto a = make_cache(ctx.get(), g);
  auto b = make_cache(ctx.get(), g);
  auto k = random_floats(4 * 8, 2);
  auto pos = iota_positions(4);
  ASSERT_EQ(kvsdk_cache_append(a.get(), 0, 4, k.data(), k.data(), pos.data(), 4 * 8 * 4), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_append(b.get(), 0, 4, k.data(), k.data(), pos.data(), 4 * 8 * 4),
            KVSDK_E_BUDGET);
  ASSERT_EQ(kvsdk_cache_append(b.get(), 0, 2, k.data(), k.data(), pos.data(), 2 * 8 * 4), KVSDK_OK);
  EXPECT_EQ(used(ctx.get()), per_token * 6);
  a.reset();
  EXPECT_EQ(used(ctx.get()), per_token * 2);
  ASSERT_EQ(kvsdk_cache_append(b.get(), 0, 4, k.data(), k.data(), pos.data(), 4 * 8 * 4), KVSDK_OK);
}

TEST(Budget, CachesKeepTheirContextAlive) {
  const kvsdk_geometry g = make_geometry(1, 1, 1, 4);
  kvsdk_context* ctx = nullptr;
  ASSERT_EQ(kvsdk_context_create(&ctx, nullptr), KVSDK_OK);
  auto cache = make_cache(ctx, g);
  kvsdk_context_destroy(ctx);  // the cache still references it
  std::vector<float> k(4, 1.0f);
  int32_t p = 0;
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, k.data(), k.data(), &p, 16), KVSDK_OK);
}

// Property: under a long random sequence of appends of random sizes to random layers of several
// caches sharing a context, the charged bytes never exceed the budget, equal the sum of the
// caches' stats, and every refused append changed nothing.
TEST(Budget, PropertyNeverExceededUnderRandomAppends) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    const kvsdk_geometry g = make_geometry(1 + rng() % 4, 4, 1 + rng() % 2 == 1 ? 2 : 4, 8 << (rng() % 3));
    const uint64_t budget = exact_bytes_per_token(g) * (20 + rng() % 200);
    auto ctx = make_context(budget);
    std::vector<CachePtr> caches;
    for (int i = 0; i < 3; ++i) caches.push_back(make_cache(ctx.get(), g));
    std::vector<int32_t> next_pos(caches.size() * g.n_layers, 0);
    for (int step = 0; step < 200; ++step) {
      const size_t ci = rng() % caches.size();
      const uint32_t layer = rng() % g.n_layers;
      const size_t n = 1 + rng() % 40;
      auto k = random_floats(n * g.n_kv_heads * g.head_dim, rng());
      int32_t& np = next_pos[ci * g.n_layers + layer];
      auto pos = iota_positions(n, np);
      kvsdk_cache_stats before;
      before.struct_size = sizeof(before);
      kvsdk_cache_stats_get(caches[ci].get(), &before);
      const kvsdk_status st = kvsdk_cache_append(caches[ci].get(), layer, n, k.data(), k.data(),
                                                 pos.data(), k.size() * 4);
      kvsdk_cache_stats after;
      after.struct_size = sizeof(after);
      kvsdk_cache_stats_get(caches[ci].get(), &after);
      if (st == KVSDK_OK) {
        np += int32_t(n);
      } else {
        ASSERT_EQ(st, KVSDK_E_BUDGET);
        ASSERT_EQ(after.bytes, before.bytes);
        ASSERT_EQ(after.tokens, before.tokens);
      }
      uint64_t sum = 0;
      for (auto& c : caches) {
        kvsdk_cache_stats s;
        s.struct_size = sizeof(s);
        kvsdk_cache_stats_get(c.get(), &s);
        sum += s.bytes;
      }
      ASSERT_LE(used(ctx.get()), budget);
      ASSERT_EQ(used(ctx.get()), sum);
    }
  }
}

}  // namespace
