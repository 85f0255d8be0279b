// Policy presets: defaults, parsing, validation, and methods not implemented yet.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>
#include <string>

#include "kvsdk.h"
#include "test_util.h"

TEST(Policy, InitSetsPaperDefaults) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_SNAPKV), KVSDK_OK);
  EXPECT_EQ(p.struct_size, sizeof(kvsdk_policy));
  EXPECT_EQ(p.method, KVSDK_METHOD_SNAPKV);
  EXPECT_EQ(p.obs_window, 32);
  EXPECT_EQ(p.pool_kernel, 7);
  EXPECT_EQ(p.quant_group, 32);
  EXPECT_EQ(p.quant_residual, 128);
  ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_KIVI), KVSDK_OK);
  EXPECT_EQ(p.quant_bits, 2);
}

TEST(Policy, EveryMethodHasAName) {
  for (int m = 0; m < KVSDK_METHOD_COUNT; ++m) {
    const char* name = kvsdk_method_name(kvsdk_method(m));
    ASSERT_NE(name, nullptr);
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, name), KVSDK_OK) << name;
    EXPECT_EQ(p.method, m);
  }
  EXPECT_EQ(kvsdk_method_name(KVSDK_METHOD_COUNT), nullptr);
}

TEST(Policy, ParsesCompositions) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "xkv+kivi2"), KVSDK_OK);
  EXPECT_EQ(p.method, KVSDK_METHOD_XKV);
  EXPECT_EQ(p.quant_bits, 2);
  ASSERT_EQ(kvsdk_policy_parse(&p, "minicache+kivi4"), KVSDK_OK);
  EXPECT_EQ(p.method, KVSDK_METHOD_MINICACHE);
  EXPECT_EQ(p.quant_bits, 4);
}

TEST(Policy, RejectsBadSpecsAndLeavesOutputUntouched) {
  kvsdk_policy p;
  std::memset(&p, 0xab, sizeof(p));
  kvsdk_policy copy = p;
  for (const char* bad : {"", "fulll", "snapkv+", "snapkv+kivi3", "snapkv+q2", "+kivi2"}) {
    EXPECT_EQ(kvsdk_policy_parse(&p, bad), KVSDK_E_INVALID_ARG) << bad;
    EXPECT_EQ(std::memcmp(&p, &copy, sizeof(p)), 0) << bad;
    EXPECT_STRNE(kvsdk_last_error(), "");
  }
  EXPECT_EQ(kvsdk_policy_parse(nullptr, "full"), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_policy_parse(&p, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_policy_init(&p, 99), KVSDK_E_INVALID_ARG);
}

TEST(Policy, UnimplementedMethodsReturnUnsupported) {
  auto ctx = kvsdk_test::make_context();
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 16);
  for (int m = KVSDK_METHOD_KIVI + 1; m < KVSDK_METHOD_COUNT; ++m) {  // kivi is implemented
    if (m == KVSDK_METHOD_SPINDLEKV || m == KVSDK_METHOD_MINICACHE) continue;  // implemented
    if (m == KVSDK_METHOD_SMALLKV) continue;                          // so is smallkv
    if (m == KVSDK_METHOD_SPECACHE) continue;                            // and specache
    kvsdk_policy p;
    kvsdk_policy_init(&p, kvsdk_method(m));
    kvsdk_cache* cache = nullptr;
    EXPECT_EQ(kvsdk_cache_create(&cache, ctx.get(), &g, &p), KVSDK_E_UNSUPPORTED)
        << kvsdk_method_name(kvsdk_method(m));
    EXPECT_EQ(cache, nullptr);
    EXPECT_NE(std::string(kvsdk_last_error()).find("not implemented"), std::string::npos);
  }
}

TEST(Policy, ValidatesParameters) {
  auto ctx = kvsdk_test::make_context();
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 16);
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  p.quant_bits = 3;
  kvsdk_cache* cache = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&cache, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  p.pool_kernel = 4;
  EXPECT_EQ(kvsdk_cache_create(&cache, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  p.method = 42;
  EXPECT_EQ(kvsdk_cache_create(&cache, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(cache, nullptr);
}

// KVSDK_QUANT_RESIDUAL_AUTO on kvsdk_cache_create: resolved for the head_dim and KIVI width, as
// round(768 / head_dim x 4^(2 - bits)) within 16..128, whatever the context's budget. Other
// negative windows are refused.
TEST(Policy, AutoResidualFollowsHeadDimAndWidth) {
  struct Case {
    const char* spec;
    uint32_t head_dim;
    int32_t want;
  };
  for (const Case& c : {Case{"kivi", 64, 16}, Case{"kivi", 128, 16}, Case{"kivi", 16, 48},
                        Case{"kivi", 8, 96}, Case{"kivi+kivi1", 64, 48},
                        Case{"kivi+kivi1", 128, 24}, Case{"kivi+kivi1", 8, 128},
                        Case{"kivi+kivi4", 8, 16}, Case{"kivi+kivi8", 8, 16},
                        Case{"h2o+kivi2", 32, 24}, Case{"specache+kivi1", 256, 16}}) {
    const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, c.head_dim);
    for (uint64_t budget : {uint64_t(0), uint64_t(1) << 20}) {
      auto ctx = kvsdk_test::make_context(budget);
      kvsdk_policy p;
      ASSERT_EQ(kvsdk_policy_parse(&p, c.spec), KVSDK_OK);
      p.quant_residual = KVSDK_QUANT_RESIDUAL_AUTO;
      kvsdk_cache* cache = nullptr;
      ASSERT_EQ(kvsdk_cache_create(&cache, ctx.get(), &g, &p), KVSDK_OK) << kvsdk_last_error();
      kvsdk_policy got;
      kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
      EXPECT_EQ(kvsdk_cache_policy(cache, &got), KVSDK_OK);
      EXPECT_EQ(got.quant_residual, c.want) << c.spec << ", head_dim " << c.head_dim;
      kvsdk_cache_destroy(cache);
    }
  }
  auto ctx = kvsdk_test::make_context();
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 16);
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "kivi"), KVSDK_OK);
  p.quant_residual = -2;
  kvsdk_cache* cache = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&cache, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()).find("quant_residual"), std::string::npos);
  EXPECT_EQ(cache, nullptr);
}

// kivi_weight_bits: 0 (the default) resolves by quant_bits when the cache is created, 7 and 14
// are kept, other values are refused; a struct from before the field gets 14 (the first
// kernels' arithmetic); a snapshot keeps the width, and a cache that attends with 7-bit weights
// continues bit-identically after a save and load.
TEST(Policy, KiviWeightBitsResolveValidateAndSurviveASnapshot) {
  auto ctx = kvsdk_test::make_context();
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 32);
  std::string error;
  const auto created = [&](const kvsdk_policy& p) {
    kvsdk_cache* cache = nullptr;
    const kvsdk_status s = kvsdk_cache_create(&cache, ctx.get(), &g, &p);
    error = kvsdk_last_error();
    kvsdk_policy got;
    kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
    if (s == KVSDK_OK) EXPECT_EQ(kvsdk_cache_policy(cache, &got), KVSDK_OK);
    kvsdk_cache_destroy(cache);
    return s == KVSDK_OK ? got.kivi_weight_bits : -int32_t(s);
  };
  struct Case {
    const char* spec;
    int32_t set, want;
  };
  for (const Case& c : {Case{"kivi", 0, 7}, Case{"kivi+kivi1", 0, 7}, Case{"xkv+kivi2", 0, 7},
                        Case{"specache", 0, 7}, Case{"kivi+kivi4", 0, 14},
                        Case{"minicache+kivi4", 0, 14}, Case{"kivi+kivi8", 0, 14},
                        Case{"snapkv", 0, 0}, Case{"kivi", 14, 14}, Case{"kivi+kivi4", 7, 7}}) {
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, c.spec), KVSDK_OK);
    EXPECT_EQ(p.kivi_weight_bits, 0) << c.spec;
    p.kivi_weight_bits = c.set;
    EXPECT_EQ(created(p), c.want) << c.spec << " with " << c.set;
  }
  for (int32_t bad : {-1, 1, 8, 15, 16}) {
    kvsdk_policy p;
    kvsdk_policy_init(&p, KVSDK_METHOD_KIVI);
    p.kivi_weight_bits = bad;
    EXPECT_EQ(created(p), -int32_t(KVSDK_E_INVALID_ARG)) << bad;
    EXPECT_NE(error.find("kivi_weight_bits"), std::string::npos) << error;
  }
  kvsdk_policy old;
  kvsdk_policy_init(&old, KVSDK_METHOD_KIVI);
  old.kivi_weight_bits = 7;  // past the older struct: never read
  old.struct_size = uint32_t(offsetof(kvsdk_policy, kivi_weight_bits));
  EXPECT_EQ(created(old), 14);

  // Save and load: the width is in the snapshot, and the loaded cache attends with the same bits.
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_KIVI);
  p.quant_group = 8;
  p.quant_residual = 8;
  auto cache = kvsdk_test::make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache) << kvsdk_last_error();
  const size_t n = 80, row = 2 * 32;
  const std::vector<float> k = kvsdk_test::random_floats(n * row, 1),
                           v = kvsdk_test::random_floats(n * row, 2);
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
  for (uint32_t l = 0; l < 2; ++l) {
    ASSERT_EQ(kvsdk_cache_append(cache.get(), l, n, k.data(), v.data(), pos.data(), n * row * 4),
              KVSDK_OK);
  }
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  std::vector<uint8_t> buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, buf.data(), buf.size(), &size),
            KVSDK_OK);
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&raw, ctx.get(), buf.data(), size, &g, nullptr),
            KVSDK_OK);
  kvsdk_test::CachePtr loaded(raw);
  kvsdk_policy got;
  kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
  ASSERT_EQ(kvsdk_cache_policy(loaded.get(), &got), KVSDK_OK);
  EXPECT_EQ(got.kivi_weight_bits, 7);
  const std::vector<float> q = kvsdk_test::random_floats(4 * 32, 3);
  const int32_t qpos = int32_t(n);
  std::vector<float> a(q.size()), b(q.size());
  ASSERT_EQ(kvsdk_cache_attend(cache.get(), 1, 1, q.data(), &qpos, q.size() * 4, a.data(),
                               a.size() * 4),
            KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_attend(loaded.get(), 1, 1, q.data(), &qpos, q.size() * 4, b.data(),
                               b.size() * 4),
            KVSDK_OK);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  // The same rows with 14-bit weights attend differently (so the width really travelled).
  p.kivi_weight_bits = 14;
  auto wide = kvsdk_test::make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(wide);
  for (uint32_t l = 0; l < 2; ++l) {
    ASSERT_EQ(kvsdk_cache_append(wide.get(), l, n, k.data(), v.data(), pos.data(), n * row * 4),
              KVSDK_OK);
  }
  ASSERT_EQ(kvsdk_cache_attend(wide.get(), 1, 1, q.data(), &qpos, q.size() * 4, b.data(),
                               b.size() * 4),
            KVSDK_OK);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}
