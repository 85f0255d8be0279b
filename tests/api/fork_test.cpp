// kvsdk_cache_fork (issue 16): for every preset, a fork continues exactly as the original does
// (the same attention outputs, bit for bit, and the same snapshot after the same calls), the two
// are independent, the fork is charged to the context, and a fork that does not fit changes
// nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "preset_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16;
constexpr uint32_t kPLayers = 2, kPQ = 2;  // SmallKV's proxy: 1 KV head


class Fork : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    policy = small_policy(GetParam(), 4);
    smallkv = policy.method == KVSDK_METHOD_SMALLKV;
    specache = policy.method == KVSDK_METHOD_SPECACHE;
    g = make_geometry(kLayers, kQ, kKv, kDim);
    ctx = make_context();
    ASSERT_TRUE(ctx);
  }

  // Eviction presets get a per-cache budget of about 24 tokens per layer, so that they evict;
  // each cache has its own, so the original and the fork evict alike. (The others hold every
  // token: the test stays below what they need.)
  Chat start() {
    return start_chat(ctx.get(), g, policy, GetParam(), 24 * kLayers * exact_bytes_per_token(g),
                      make_geometry(kPLayers, kPQ, 1, kDim));
  }


  // One step at position `pos` with inputs drawn from `seed`; returns every attention output.
  std::vector<float> step(Chat& c, int32_t pos, uint32_t seed) {
    std::mt19937 rng(seed);
    return decode_step(c, g, make_geometry(kPLayers, kPQ, 1, kDim), specache, pos, rng);
  }

  Chat fork(const Chat& c) {
    Chat f;
    kvsdk_cache* raw = nullptr;
    EXPECT_EQ(kvsdk_cache_fork(&raw, c.cache.get()), KVSDK_OK) << kvsdk_last_error();
    f.cache.reset(raw);
    if (smallkv) {
      raw = nullptr;
      EXPECT_EQ(kvsdk_cache_fork(&raw, c.proxy.get()), KVSDK_OK) << kvsdk_last_error();
      f.proxy.reset(raw);
      EXPECT_EQ(kvsdk_cache_set_proxy(f.cache.get(), f.proxy.get()), KVSDK_OK)
          << kvsdk_last_error();
    }
    return f;
  }

  kvsdk_policy policy{};
  kvsdk_geometry g{};
  ContextPtr ctx;
  bool smallkv = false, specache = false;
};

TEST_P(Fork, ContinuesExactlyAsTheOriginal) {
  Chat a = start();
  for (int32_t t = 0; t < 30; ++t) step(a, t, 100 + t);
  const uint64_t before = used(ctx.get());
  const std::vector<uint8_t> at_fork = snapshot(a.cache.get());
  Chat b = fork(a);
  ASSERT_TRUE(b.cache);
  EXPECT_EQ(snapshot(b.cache.get()), at_fork) << "the fork holds what the original holds";
  kvsdk_cache_stats sa, sb;
  kvsdk_cache_stats_init(&sa);
  kvsdk_cache_stats_init(&sb);
  ASSERT_EQ(kvsdk_cache_stats_get(a.cache.get(), &sa), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_stats_get(b.cache.get(), &sb), KVSDK_OK);
  EXPECT_EQ(sb.bytes, sa.bytes);
  EXPECT_EQ(sb.tokens, sa.tokens);
  EXPECT_EQ(sb.backing_bytes, sa.backing_bytes);
  uint64_t proxy_bytes = 0;  // SmallKV: the proxy's fork is charged too
  if (smallkv) {
    kvsdk_cache_stats sp;
    kvsdk_cache_stats_init(&sp);
    ASSERT_EQ(kvsdk_cache_stats_get(a.proxy.get(), &sp), KVSDK_OK);
    proxy_bytes = sp.bytes;
  }
  EXPECT_EQ(used(ctx.get()), before + sb.bytes + proxy_bytes)
      << "the fork is charged to the context";
  for (int32_t t = 30; t < 50; ++t) {
    ASSERT_EQ(step(a, t, 100 + t), step(b, t, 100 + t)) << "step " << t;
  }
  EXPECT_EQ(snapshot(a.cache.get()), snapshot(b.cache.get()));
}

TEST_P(Fork, ForksAreIndependent) {
  Chat a = start();
  for (int32_t t = 0; t < 20; ++t) step(a, t, 7 + t);
  Chat b = fork(a);
  const std::vector<uint8_t> b_at_fork = snapshot(b.cache.get());
  // The original goes on (another branch), and is then destroyed: the fork must not notice.
  for (int32_t t = 20; t < 30; ++t) step(a, t, 900 + t);
  EXPECT_NE(snapshot(a.cache.get()), b_at_fork);
  EXPECT_EQ(snapshot(b.cache.get()), b_at_fork);
  a.cache.reset();
  a.proxy.reset();
  for (int32_t t = 20; t < 30; ++t) step(b, t, 500 + t);
}

TEST_P(Fork, RefusedWhenTheContextBudgetIsFullAndNothingChanges) {
  // The context holds the original with less than its bytes again to spare.
  ContextPtr small;
  {
    Chat probe = start();
    for (int32_t t = 0; t < 20; ++t) step(probe, t, 3 + t);
    kvsdk_cache_stats s;
    kvsdk_cache_stats_init(&s);
    ASSERT_EQ(kvsdk_cache_stats_get(probe.cache.get(), &s), KVSDK_OK);
    ASSERT_GT(s.bytes, 0u);
    ctx = make_context(used(ctx.get()) + s.bytes - 1);
  }
  Chat a = start();
  for (int32_t t = 0; t < 20; ++t) step(a, t, 3 + t);
  const uint64_t before = used(ctx.get());
  const std::vector<uint8_t> snap = snapshot(a.cache.get());
  kvsdk_cache* out = reinterpret_cast<kvsdk_cache*>(&out);  // must stay untouched
  kvsdk_cache* const sentinel = out;
  EXPECT_EQ(kvsdk_cache_fork(&out, a.cache.get()), KVSDK_E_BUDGET);
  EXPECT_NE(std::string(kvsdk_last_error()).find("budget"), std::string::npos)
      << kvsdk_last_error();
  EXPECT_EQ(out, sentinel);
  EXPECT_EQ(used(ctx.get()), before);
  EXPECT_EQ(snapshot(a.cache.get()), snap);
}

INSTANTIATE_TEST_SUITE_P(Presets, Fork, ::testing::ValuesIn(kPresets), preset_name);

TEST(ForkArgs, NullsAreInvalid) {
  ContextPtr ctx = make_context();
  CachePtr c = make_cache(ctx.get(), make_geometry(1, 2, 1, 8));
  kvsdk_cache* out = nullptr;
  EXPECT_EQ(kvsdk_cache_fork(&out, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(kvsdk_cache_fork(nullptr, c.get()), KVSDK_E_INVALID_ARG);
}

}  // namespace
