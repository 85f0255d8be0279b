// API misuse matrix: every bad argument gives a status (never a crash), outputs stay untouched,
// and the cache is unchanged.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

class Misuse : public ::testing::Test {
 protected:
  void SetUp() override {
    g = make_geometry(2, 4, 2, 8);
    ctx = make_context();
    cache = make_cache(ctx.get(), g);
    ASSERT_TRUE(cache);
    k = random_floats(3 * 16, 1);
    pos = iota_positions(3);
    ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, 3, k.data(), k.data(), pos.data(), 3 * 16 * 4),
              KVSDK_OK);
  }
  uint64_t tokens() {
    kvsdk_cache_stats s;
    s.struct_size = sizeof(s);
    EXPECT_EQ(kvsdk_cache_stats_get(cache.get(), &s), KVSDK_OK);
    return s.tokens;
  }
  kvsdk_geometry g;
  ContextPtr ctx;
  CachePtr cache;
  std::vector<float> k;
  std::vector<int32_t> pos;
};

TEST_F(Misuse, NullHandles) {
  float buf[64] = {0};
  int32_t p = 0;
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_append(nullptr, 0, 1, buf, buf, &p, 64), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_attend(nullptr, 0, 1, buf, &p, 128, buf, 128), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_read(nullptr, 0, 0, nullptr, nullptr, nullptr, 0, &n), KVSDK_E_INVALID_ARG);
  kvsdk_cache_stats s;
  s.struct_size = sizeof(s);
  EXPECT_EQ(kvsdk_cache_stats_get(nullptr, &s), KVSDK_E_INVALID_ARG);
  kvsdk_layer_stats ls;
  ls.struct_size = sizeof(ls);
  EXPECT_EQ(kvsdk_cache_layer_stats_get(nullptr, 0, &ls), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_geometry(nullptr, &g), KVSDK_E_INVALID_ARG);
  uint64_t u;
  EXPECT_EQ(kvsdk_context_used_bytes(nullptr, &u), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_context_budget_bytes(nullptr, &u), KVSDK_E_INVALID_ARG);
  kvsdk_cache_destroy(nullptr);
  kvsdk_context_destroy(nullptr);
}

TEST_F(Misuse, NullPointers) {
  int32_t p = 3;
  float buf[64] = {0};
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, nullptr, buf, &p, 64), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, buf, nullptr, &p, 64), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, buf, buf, nullptr, 64), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 0, 1, nullptr, nullptr, 128, buf, 128),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 0, 1, buf, nullptr, 128, nullptr, 128),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_read(cache.get(), 0, 0, nullptr, nullptr, nullptr, 0, nullptr),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_stats_get(cache.get(), nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 0, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_context_create(nullptr, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_context_options_init(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_geometry_init(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_policy_init(nullptr, KVSDK_METHOD_FULL), KVSDK_E_INVALID_ARG);
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_create(nullptr, ctx.get(), &g, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_create(&c, nullptr, &g, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), nullptr, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(tokens(), 6u);
}

TEST_F(Misuse, StructSizes) {
  kvsdk_cache* c = nullptr;
  kvsdk_geometry bad = g;
  bad.struct_size = 0;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &bad, nullptr), KVSDK_E_INVALID_ARG);
  bad.struct_size = sizeof(kvsdk_geometry) - 4;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &bad, nullptr), KVSDK_E_INVALID_ARG);

  // Larger than known: accepted when the unknown tail is zero, rejected otherwise.
  struct Bigger {
    kvsdk_geometry known;
    uint32_t future_field;
  } big{};
  big.known = g;
  big.known.struct_size = sizeof(Bigger);
  ASSERT_EQ(kvsdk_cache_create(&c, ctx.get(), &big.known, nullptr), KVSDK_OK);
  kvsdk_cache_destroy(c);
  c = nullptr;
  big.future_field = 7;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &big.known, nullptr), KVSDK_E_INVALID_ARG);

  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  p.struct_size = 0;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  p.struct_size = 12;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);

  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.struct_size = 3;
  kvsdk_context* x = nullptr;
  EXPECT_EQ(kvsdk_context_create(&x, &o), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(x, nullptr);
  kvsdk_context_options_init(&o);
  o.backend = 7;
  EXPECT_EQ(kvsdk_context_create(&x, &o), KVSDK_E_INVALID_ARG);

  kvsdk_cache_stats s;
  std::memset(&s, 0x5a, sizeof(s));
  s.struct_size = 8;
  EXPECT_EQ(kvsdk_cache_stats_get(cache.get(), &s), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(s.n_layers, 0x5a5a5a5au);  // untouched
  kvsdk_layer_stats ls;
  ls.struct_size = 0;
  EXPECT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 0, &ls), KVSDK_E_INVALID_ARG);
  kvsdk_geometry gout;
  gout.struct_size = 0;
  EXPECT_EQ(kvsdk_cache_geometry(cache.get(), &gout), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
}

TEST_F(Misuse, InvalidGeometry) {
  kvsdk_cache* c = nullptr;
  auto expect_bad = [&](kvsdk_geometry bad) {
    EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &bad, nullptr), KVSDK_E_INVALID_ARG)
        << kvsdk_last_error();
    EXPECT_EQ(c, nullptr);
  };
  kvsdk_geometry bad = g;
  bad.n_layers = 0; expect_bad(bad);
  bad = g; bad.n_kv_heads = 0; expect_bad(bad);
  bad = g; bad.n_q_heads = 3; expect_bad(bad);   // not a multiple of 2 KV heads
  bad = g; bad.n_q_heads = 1; expect_bad(bad);   // fewer than KV heads
  bad = g; bad.head_dim = 0; expect_bad(bad);
  bad = g; bad.head_dim = 7; expect_bad(bad);    // odd with RoPE
  bad = g; bad.head_dim = 4096; expect_bad(bad);
  bad = g; bad.dtype = 9; expect_bad(bad);
  bad = g; bad.rope_style = 5; expect_bad(bad);
  bad = g; bad.rope_theta = -1; expect_bad(bad);
  bad = g; bad.attn_scale = -0.5f; expect_bad(bad);
}

TEST_F(Misuse, LayerAndHeadOutOfRange) {
  float buf[64] = {0};
  int32_t p = 3;
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 2, 1, buf, buf, &p, 64), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), UINT32_MAX, 1, buf, buf, &p, 64), KVSDK_E_OUT_OF_RANGE);
  std::vector<float> out(32, 9.0f);
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 2, 1, buf, nullptr, 128, out.data(), 128),
            KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(out[0], 9.0f);
  EXPECT_EQ(kvsdk_cache_read(cache.get(), 2, 0, nullptr, nullptr, nullptr, 0, &n),
            KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_read(cache.get(), 0, 2, nullptr, nullptr, nullptr, 0, &n),
            KVSDK_E_OUT_OF_RANGE);
  kvsdk_layer_stats ls;
  ls.struct_size = sizeof(ls);
  EXPECT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 2, &ls), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(tokens(), 6u);
}

TEST_F(Misuse, ZeroTokensAndMismatchedSizes) {
  float buf[64] = {0};
  int32_t p[2] = {3, 4};
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 0, buf, buf, p, 0), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, buf, buf, p, 63), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, buf, buf, p, 128), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, SIZE_MAX / 2, buf, buf, p, 64), KVSDK_E_INVALID_ARG);
  int32_t negative = -1;
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 1, buf, buf, &negative, 64), KVSDK_E_INVALID_ARG);
  std::vector<float> out(32, 9.0f);
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 0, 0, buf, nullptr, 0, out.data(), 0),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 0, 1, buf, nullptr, 64, out.data(), 128),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 0, 1, buf, nullptr, 128, out.data(), 127),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(out[0], 9.0f);
  EXPECT_EQ(tokens(), 6u);
  EXPECT_EQ(std::string(kvsdk_status_str(KVSDK_E_INVALID_ARG)), "invalid argument");
  EXPECT_EQ(std::string(kvsdk_status_str(1000)), "unknown status");
}

TEST(Version, RuntimeMatchesHeader) {
  EXPECT_EQ(kvsdk_version(), uint32_t(KVSDK_VERSION_NUMBER));
  const std::string s = std::to_string(KVSDK_VERSION_MAJOR) + "." +
                        std::to_string(KVSDK_VERSION_MINOR) + "." +
                        std::to_string(KVSDK_VERSION_PATCH);
  EXPECT_EQ(s, kvsdk_version_string());
}

TEST(LastError, IsThreadLocal) {
  EXPECT_EQ(kvsdk_cache_append(nullptr, 0, 0, nullptr, nullptr, nullptr, 0), KVSDK_E_INVALID_ARG);
  const std::string here = kvsdk_last_error();
  std::string there = "unset";
  std::thread([&] { there = kvsdk_last_error(); }).join();
  EXPECT_FALSE(here.empty());
  EXPECT_EQ(there, "");
}

}  // namespace
