// The struct_size rule of kvsdk.h for output structs, every struct's *_init, and when
// kvsdk_last_error() has a message (issue 16, "an ABI that older apps keep working with").
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// An app's struct from a newer kvsdk.h: today's layout followed by fields this library does not
// know. The library must write today's fields and never touch the tail.
template <class T>
struct Grown {
  T known;
  unsigned char tail[24];
};

class StructVersions : public ::testing::Test {
 protected:
  void SetUp() override {
    g = make_geometry(2, 4, 2, 8);
    ctx = make_context();
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_SNAPKV), KVSDK_OK);
    p.evict_slack = 0.125f;
    cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache) << kvsdk_last_error();
    std::vector<float> k = random_floats(5 * 16, 1);
    std::vector<int32_t> pos = iota_positions(5);
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_EQ(kvsdk_cache_append(cache.get(), l, 5, k.data(), k.data(), pos.data(), 5 * 16 * 4),
                KVSDK_OK);
    }
  }
  kvsdk_geometry g;
  ContextPtr ctx;
  CachePtr cache;
};

TEST_F(StructVersions, InitSetsSizeAndZeroes) {
  kvsdk_cache_stats s;
  std::memset(&s, 0xab, sizeof(s));
  ASSERT_EQ(kvsdk_cache_stats_init(&s), KVSDK_OK);
  EXPECT_EQ(s.struct_size, sizeof(s));
  EXPECT_EQ(s.tokens, 0u);
  EXPECT_EQ(s.context_used_bytes, 0u);
  kvsdk_layer_stats ls;
  std::memset(&ls, 0xab, sizeof(ls));
  ASSERT_EQ(kvsdk_layer_stats_init(&ls), KVSDK_OK);
  EXPECT_EQ(ls.struct_size, sizeof(ls));
  EXPECT_EQ(ls.bytes_by_tier[KVSDK_TIER_SLOTS - 1], 0u);
  kvsdk_load_info li;
  std::memset(&li, 0xab, sizeof(li));
  ASSERT_EQ(kvsdk_load_info_init(&li), KVSDK_OK);
  EXPECT_EQ(li.struct_size, sizeof(li));
  EXPECT_EQ(li.journal_frames_dropped, 0u);
  EXPECT_EQ(kvsdk_cache_stats_init(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_layer_stats_init(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_load_info_init(nullptr), KVSDK_E_INVALID_ARG);
}

TEST_F(StructVersions, NewerOutputStructsGetTheKnownFieldsAndKeepTheirTail) {
  kvsdk_cache_stats want;
  ASSERT_EQ(kvsdk_cache_stats_init(&want), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_stats_get(cache.get(), &want), KVSDK_OK);

  Grown<kvsdk_cache_stats> s;
  std::memset(&s, 0x5a, sizeof(s));
  s.known.struct_size = sizeof(s);
  ASSERT_EQ(kvsdk_cache_stats_get(cache.get(), &s.known), KVSDK_OK);
  EXPECT_EQ(s.known.struct_size, sizeof(kvsdk_cache_stats));  // the bytes written
  EXPECT_EQ(s.known.tokens, want.tokens);
  EXPECT_EQ(s.known.context_used_bytes, want.context_used_bytes);
  for (unsigned char c : s.tail) ASSERT_EQ(c, 0x5a);

  Grown<kvsdk_layer_stats> ls;
  std::memset(&ls, 0x5a, sizeof(ls));
  ls.known.struct_size = sizeof(ls);
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 1, &ls.known), KVSDK_OK);
  EXPECT_EQ(ls.known.struct_size, sizeof(kvsdk_layer_stats));
  EXPECT_EQ(ls.known.layer, 1u);
  EXPECT_EQ(ls.known.tokens, 2u * 5u);
  for (unsigned char c : ls.tail) ASSERT_EQ(c, 0x5a);

  Grown<kvsdk_geometry> gg;
  std::memset(&gg, 0x5a, sizeof(gg));
  gg.known.struct_size = sizeof(gg);
  ASSERT_EQ(kvsdk_cache_geometry(cache.get(), &gg.known), KVSDK_OK);
  EXPECT_EQ(gg.known.struct_size, sizeof(kvsdk_geometry));
  EXPECT_EQ(gg.known.head_dim, 8u);
  for (unsigned char c : gg.tail) ASSERT_EQ(c, 0x5a);

  Grown<kvsdk_policy> pp;
  std::memset(&pp, 0x5a, sizeof(pp));
  pp.known.struct_size = sizeof(pp);
  ASSERT_EQ(kvsdk_cache_policy(cache.get(), &pp.known), KVSDK_OK);
  EXPECT_EQ(pp.known.struct_size, sizeof(kvsdk_policy));
  EXPECT_EQ(pp.known.method, KVSDK_METHOD_SNAPKV);
  EXPECT_EQ(pp.known.evict_slack, 0.125f);
  for (unsigned char c : pp.tail) ASSERT_EQ(c, 0x5a);
}

TEST_F(StructVersions, OlderPolicyStructGetsOnlyItsFields) {
  // kvsdk_policy gained evict_slack after its first version: an app built before that passes
  // the smaller size, and nothing past it may be written.
  const size_t v1 = offsetof(kvsdk_policy, evict_slack);
  kvsdk_policy p;
  std::memset(&p, 0x5a, sizeof(p));
  p.struct_size = uint32_t(v1);
  ASSERT_EQ(kvsdk_cache_policy(cache.get(), &p), KVSDK_OK);
  EXPECT_EQ(p.struct_size, v1);
  EXPECT_EQ(p.method, KVSDK_METHOD_SNAPKV);
  const unsigned char* raw = reinterpret_cast<const unsigned char*>(&p);
  for (size_t i = v1; i < sizeof(p); ++i) ASSERT_EQ(raw[i], 0x5a) << "byte " << i;
}

TEST_F(StructVersions, BelowTheFirstVersionIsRefusedAndNothingIsWritten) {
  kvsdk_cache_stats s;
  std::memset(&s, 0x5a, sizeof(s));
  s.struct_size = 8;
  EXPECT_EQ(kvsdk_cache_stats_get(cache.get(), &s), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(s.struct_size, 8u);
  EXPECT_EQ(s.n_layers, 0x5a5a5a5au);
  kvsdk_layer_stats ls;
  std::memset(&ls, 0x5a, sizeof(ls));
  ls.struct_size = offsetof(kvsdk_layer_stats, bytes_by_tier);  // the first version has them
  EXPECT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 0, &ls), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(ls.layer, 0x5a5a5a5au);
  kvsdk_geometry gg;
  std::memset(&gg, 0x5a, sizeof(gg));
  gg.struct_size = 4;
  EXPECT_EQ(kvsdk_cache_geometry(cache.get(), &gg), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(gg.n_layers, 0x5a5a5a5au);
}

TEST_F(StructVersions, LoadInfoFollowsTheSameRule) {
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  std::vector<unsigned char> buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, buf.data(), buf.size(), &size),
            KVSDK_OK);
  Grown<kvsdk_load_info> info;
  std::memset(&info, 0x5a, sizeof(info));
  info.known.struct_size = sizeof(info);
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, ctx.get(), buf.data(), size, nullptr,
                                         &info.known),
            KVSDK_OK)
      << kvsdk_last_error();
  kvsdk_cache_destroy(loaded);
  EXPECT_EQ(info.known.struct_size, sizeof(kvsdk_load_info));
  EXPECT_EQ(info.known.format_major, 6u);  // (exact rows: format 6, byte-shuffled frames)
  for (unsigned char c : info.tail) ASSERT_EQ(c, 0x5a);

  kvsdk_load_info small;
  std::memset(&small, 0x5a, sizeof(small));
  small.struct_size = 8;
  loaded = nullptr;
  EXPECT_EQ(kvsdk_cache_load_from_buffer(&loaded, ctx.get(), buf.data(), size, nullptr, &small),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(loaded, nullptr);
  EXPECT_EQ(small.format_minor, 0x5a5a5a5au);
}

TEST_F(StructVersions, LastErrorIsClearedBySuccessfulCallsOnly) {
  kvsdk_cache_stats s;
  ASSERT_EQ(kvsdk_cache_stats_init(&s), KVSDK_OK);
  EXPECT_STREQ(kvsdk_last_error(), "");
  EXPECT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 99, nullptr), KVSDK_E_INVALID_ARG);
  const std::string failure = kvsdk_last_error();
  EXPECT_NE(failure, "");
  // Calls without a status leave the message as it is.
  kvsdk_cache_destroy(nullptr);
  (void)kvsdk_version();
  (void)kvsdk_status_str(KVSDK_E_BUDGET);
  EXPECT_EQ(failure, kvsdk_last_error());
  // Any call that returns KVSDK_OK clears it, on this thread.
  ASSERT_EQ(kvsdk_cache_stats_get(cache.get(), &s), KVSDK_OK);
  EXPECT_STREQ(kvsdk_last_error(), "");
  EXPECT_EQ(kvsdk_cache_stats_get(cache.get(), nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()), "");
  kvsdk_geometry gi;
  ASSERT_EQ(kvsdk_geometry_init(&gi), KVSDK_OK);
  EXPECT_STREQ(kvsdk_last_error(), "");
}

}  // namespace
