// Policy presets: defaults, parsing, validation, and methods not implemented yet.
#include <gtest/gtest.h>

#include <cstring>
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
