// The *_init_sized entry points and the frozen legacy *_init symbols (include/kvsdk.h, ABI rules
// "Initialising a struct" and "Legacy init symbols"; issue 16): every versioned struct, at every
// size an app can have, inside a buffer of canary bytes that must stay untouched past the bytes
// the call reports in struct_size.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/policy.h"
#include "kvsdk.h"
#include "test_util.h"
#include "util/struct_versions.h"

using namespace kvsdk_test;

namespace {

constexpr unsigned char kCanary = 0xA5;
constexpr size_t kBuffer = 512;

struct InitCase {
  const char* name;
  size_t first;    // the struct's first published size
  size_t current;  // this library's sizeof
  std::function<kvsdk_status(void*, size_t)> sized;
  std::function<kvsdk_status(void*)> legacy;
};

// The legacy symbols, called as an app built before *_init_sized calls them: parenthesized names
// bypass the macros.
std::vector<InitCase> cases() {
  return {
      {"context_options", kvsdk::kContextOptionsSizeV1, sizeof(kvsdk_context_options),
       [](void* p, size_t n) {
         return kvsdk_context_options_init_sized(static_cast<kvsdk_context_options*>(p), n);
       },
       [](void* p) {
         return (kvsdk_context_options_init)(static_cast<kvsdk_context_options*>(p));
       }},
      {"geometry", kvsdk::kGeometrySizeV1, sizeof(kvsdk_geometry),
       [](void* p, size_t n) {
         return kvsdk_geometry_init_sized(static_cast<kvsdk_geometry*>(p), n);
       },
       [](void* p) { return (kvsdk_geometry_init)(static_cast<kvsdk_geometry*>(p)); }},
      {"policy", kvsdk::kPolicySizeV1, sizeof(kvsdk_policy),
       [](void* p, size_t n) {
         return kvsdk_policy_init_sized(static_cast<kvsdk_policy*>(p), n, KVSDK_METHOD_SNAPKV);
       },
       [](void* p) {
         return (kvsdk_policy_init)(static_cast<kvsdk_policy*>(p), KVSDK_METHOD_SNAPKV);
       }},
      // kvsdk_policy_parse_sized fills an app's policy as kvsdk_policy_init_sized does.
      {"policy_parse", kvsdk::kPolicySizeV1, sizeof(kvsdk_policy),
       [](void* p, size_t n) {
         return kvsdk_policy_parse_sized(static_cast<kvsdk_policy*>(p), n, "xkv+kivi2");
       },
       [](void* p) { return (kvsdk_policy_parse)(static_cast<kvsdk_policy*>(p), "xkv+kivi2"); }},
      {"cache_stats", kvsdk::kCacheStatsSizeV1, sizeof(kvsdk_cache_stats),
       [](void* p, size_t n) {
         return kvsdk_cache_stats_init_sized(static_cast<kvsdk_cache_stats*>(p), n);
       },
       [](void* p) { return (kvsdk_cache_stats_init)(static_cast<kvsdk_cache_stats*>(p)); }},
      {"layer_stats", kvsdk::kLayerStatsSizeV1, sizeof(kvsdk_layer_stats),
       [](void* p, size_t n) {
         return kvsdk_layer_stats_init_sized(static_cast<kvsdk_layer_stats*>(p), n);
       },
       [](void* p) { return (kvsdk_layer_stats_init)(static_cast<kvsdk_layer_stats*>(p)); }},
      {"save_options", kvsdk::kSaveOptionsSizeV1, sizeof(kvsdk_save_options),
       [](void* p, size_t n) {
         return kvsdk_save_options_init_sized(static_cast<kvsdk_save_options*>(p), n);
       },
       [](void* p) { return (kvsdk_save_options_init)(static_cast<kvsdk_save_options*>(p)); }},
      {"load_info", kvsdk::kLoadInfoSizeV1, sizeof(kvsdk_load_info),
       [](void* p, size_t n) {
         return kvsdk_load_info_init_sized(static_cast<kvsdk_load_info*>(p), n);
       },
       [](void* p) { return (kvsdk_load_info_init)(static_cast<kvsdk_load_info*>(p)); }},
  };
}

struct Buffer {
  alignas(8) unsigned char bytes[kBuffer];
  Buffer() { std::memset(bytes, kCanary, sizeof bytes); }
  uint32_t struct_size() const {
    uint32_t s;
    std::memcpy(&s, bytes, sizeof s);
    return s;
  }
  // The first index from `from` on that is not the canary, or kBuffer.
  size_t first_written(size_t from) const {
    for (size_t i = from; i < kBuffer; ++i) {
      if (bytes[i] != kCanary) return i;
    }
    return kBuffer;
  }
};

TEST(InitSized, EverySizeFromTheFirstVersionUpWritesExactlyWhatItReports) {
  for (const InitCase& c : cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_LT(c.current + 64, kBuffer);
    // First version, every size in between, today's, and a newer app's larger struct.
    std::vector<size_t> sizes;
    for (size_t n = c.first; n <= c.current; ++n) sizes.push_back(n);
    sizes.push_back(c.current + 4);
    sizes.push_back(c.current + 64);
    for (size_t n : sizes) {
      SCOPED_TRACE("struct_size " + std::to_string(n));
      Buffer b;
      ASSERT_EQ(c.sized(b.bytes, n), KVSDK_OK) << kvsdk_last_error();
      const size_t written = n < c.current ? n : c.current;
      EXPECT_EQ(b.struct_size(), written);
      EXPECT_EQ(b.first_written(written), kBuffer) << "a byte past struct_size was written";
    }
  }
}

TEST(InitSized, SizesBelowTheFirstVersionAndNullAreRefusedAndWriteNothing) {
  for (const InitCase& c : cases()) {
    SCOPED_TRACE(c.name);
    for (size_t n : {size_t(0), size_t(4), c.first - 1}) {
      Buffer b;
      EXPECT_EQ(c.sized(b.bytes, n), KVSDK_E_INVALID_ARG);
      EXPECT_EQ(b.first_written(0), kBuffer) << "a refused init wrote";
      EXPECT_NE(std::string(kvsdk_last_error()).find("struct_size"), std::string::npos)
          << kvsdk_last_error();
    }
    EXPECT_EQ(c.sized(nullptr, c.current), KVSDK_E_INVALID_ARG);
    EXPECT_NE(std::string(kvsdk_last_error()).find("NULL"), std::string::npos);
    EXPECT_EQ(c.legacy(nullptr), KVSDK_E_INVALID_ARG);
  }
}

TEST(InitSized, LegacySymbolsWriteTheFirstVersionOnly) {
  for (const InitCase& c : cases()) {
    SCOPED_TRACE(c.name);
    Buffer b;
    ASSERT_EQ(c.legacy(b.bytes), KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(b.struct_size(), c.first);
    EXPECT_EQ(b.first_written(c.first), kBuffer) << "legacy init wrote past the first version";
  }
}

TEST(InitSized, MacrosPassTheCallersSize) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_H2O), KVSDK_OK);
  EXPECT_EQ(p.struct_size, sizeof(kvsdk_policy));
  EXPECT_EQ(p.evict_slack, kvsdk::kDefaultEvictSlack);
  kvsdk_context_options o;
  ASSERT_EQ(kvsdk_context_options_init(&o), KVSDK_OK);
  EXPECT_EQ(o.struct_size, sizeof(kvsdk_context_options));
  // NULL still compiles through the macros (sizeof of the type, not of *p) and is refused.
  EXPECT_EQ(kvsdk_geometry_init(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_policy_init(nullptr, KVSDK_METHOD_FULL), KVSDK_E_INVALID_ARG);
}

TEST(InitSized, BadPolicyMethodWritesNothing) {
  Buffer b;
  kvsdk_policy* p = reinterpret_cast<kvsdk_policy*>(b.bytes);
  EXPECT_EQ(kvsdk_policy_init_sized(p, sizeof(kvsdk_policy), KVSDK_METHOD_COUNT),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(b.first_written(0), kBuffer);
  EXPECT_EQ((kvsdk_policy_init)(p, -1), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(b.first_written(0), kBuffer);
}

TEST(InitSized, PolicyParseFillsWhatFitsAndRefusesBadNamesWritingNothing) {
  // Every size: the parsed values in the bytes that fit, as the full-size parse has them.
  kvsdk_policy full;
  ASSERT_EQ(kvsdk_policy_parse(&full, "xkv+kivi2"), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(full.struct_size, sizeof(kvsdk_policy));
  EXPECT_EQ(full.method, KVSDK_METHOD_XKV);
  EXPECT_EQ(full.quant_bits, 2);
  EXPECT_EQ(full.evict_slack, kvsdk::kDefaultEvictSlack);
  for (size_t n = kvsdk::kPolicySizeV1; n <= sizeof(kvsdk_policy); ++n) {
    SCOPED_TRACE("struct_size " + std::to_string(n));
    Buffer b;
    ASSERT_EQ(kvsdk_policy_parse_sized(reinterpret_cast<kvsdk_policy*>(b.bytes), n, "xkv+kivi2"),
              KVSDK_OK);
    EXPECT_EQ(std::memcmp(b.bytes + sizeof(uint32_t),
                          reinterpret_cast<const unsigned char*>(&full) + sizeof(uint32_t),
                          n - sizeof(uint32_t)),
              0);
  }
  // The legacy symbol: the first version's fields, the same values.
  Buffer legacy;
  ASSERT_EQ((kvsdk_policy_parse)(reinterpret_cast<kvsdk_policy*>(legacy.bytes), "xkv+kivi2"),
            KVSDK_OK);
  EXPECT_EQ(std::memcmp(legacy.bytes + sizeof(uint32_t),
                        reinterpret_cast<const unsigned char*>(&full) + sizeof(uint32_t),
                        kvsdk::kPolicySizeV1 - sizeof(uint32_t)),
            0);
  // A name that does not parse, or a NULL spec, writes nothing at any size, legacy included.
  for (const char* bad : {"nope", "xkv+kivi3", "xkv+foo", "", "+kivi2"}) {
    SCOPED_TRACE(bad);
    Buffer b;
    kvsdk_policy* p = reinterpret_cast<kvsdk_policy*>(b.bytes);
    EXPECT_EQ(kvsdk_policy_parse_sized(p, sizeof(kvsdk_policy), bad), KVSDK_E_INVALID_ARG);
    EXPECT_EQ(b.first_written(0), kBuffer) << "a refused parse wrote";
    EXPECT_NE(std::string(kvsdk_last_error()).find(bad), std::string::npos)
        << kvsdk_last_error();
    EXPECT_EQ((kvsdk_policy_parse)(p, bad), KVSDK_E_INVALID_ARG);
    EXPECT_EQ(b.first_written(0), kBuffer) << "a refused legacy parse wrote";
  }
  Buffer b;
  kvsdk_policy* p = reinterpret_cast<kvsdk_policy*>(b.bytes);
  EXPECT_EQ(kvsdk_policy_parse_sized(p, sizeof(kvsdk_policy), nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ((kvsdk_policy_parse)(p, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(b.first_written(0), kBuffer);
  // The macro passes the caller's size; NULL still compiles through it.
  EXPECT_EQ(kvsdk_policy_parse(nullptr, "full"), KVSDK_E_INVALID_ARG);
}

// A policy from the legacy symbol is a first-version struct: its cache evicts with the slack
// of that version (0), where today's struct gets the default slack.
TEST(InitSized, LegacyPolicyKeepsTheFirstVersionsBehaviour) {
  const kvsdk_geometry g = make_geometry(2, 2, 1, 8);
  auto ctx = make_context();
  for (bool legacy : {true, false}) {
    SCOPED_TRACE(legacy ? "legacy" : "sized");
    kvsdk_policy p;
    std::memset(&p, 0, sizeof p);
    ASSERT_EQ(legacy ? (kvsdk_policy_init)(&p, KVSDK_METHOD_SNAPKV)
                     : kvsdk_policy_init(&p, KVSDK_METHOD_SNAPKV),
              KVSDK_OK);
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache) << kvsdk_last_error();
    kvsdk_policy back;
    ASSERT_EQ(kvsdk_policy_init(&back, KVSDK_METHOD_FULL), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_policy(cache.get(), &back), KVSDK_OK);
    EXPECT_EQ(back.method, KVSDK_METHOD_SNAPKV);
    EXPECT_EQ(back.evict_slack, legacy ? 0.0f : kvsdk::kDefaultEvictSlack);
  }
}

}  // namespace
