// Golden snapshots: files written by an earlier kvsdk (tests/golden/*.kvsnap, made once by
// make_golden.cpp) must load with exactly the rows they were saved with, forever.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/half.h"
#include "golden_content.h"
#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_golden;
using namespace kvsdk_test;

namespace {

struct Expected {
  const char* file;
  int32_t dtype;
  uint32_t applied, dropped;
  // Positions each (layer, head) must hold, and appended tokens per layer.
  std::vector<std::vector<std::vector<int32_t>>> positions;
  std::vector<uint64_t> appended;
};

std::vector<int32_t> range(int32_t a, int32_t b) {
  std::vector<int32_t> r;
  for (int32_t i = a; i < b; ++i) r.push_back(i);
  return r;
}

std::vector<Expected> expectations() {
  const auto base = std::vector<std::vector<std::vector<int32_t>>>{
      {range(0, 5), range(0, 5)}, {range(0, 7), range(0, 7)}};
  return {
      {"v1_0_exact_f32.kvsnap", KVSDK_DTYPE_F32, 0, 0, base, {5, 7}},
      {"v1_0_multiframe_f16.kvsnap", KVSDK_DTYPE_F16, 0, 0, base, {5, 7}},
      {"v1_0_journal_bf16.kvsnap", KVSDK_DTYPE_BF16, 2, 0,
       {{range(0, 7), {0, 3, 4, 5, 6}}, {range(1, 9), range(0, 9)}}, {7, 9}},
      {"v1_0_torn_tail.kvsnap", KVSDK_DTYPE_BF16, 1, 1,
       {{range(0, 7), range(0, 7)}, {range(0, 8), range(0, 8)}}, {7, 8}},
  };
}

float host_value(const std::vector<unsigned char>& buf, size_t i, int32_t dtype) {
  if (dtype == KVSDK_DTYPE_F32) {
    float f;
    std::memcpy(&f, &buf[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &buf[i * 2], 2);
  return dtype == KVSDK_DTYPE_F16 ? kvsdk::f16_to_f32(h) : kvsdk::bf16_to_f32(h);
}

TEST(Golden, EveryGoldenSnapshotLoadsWithItsExactRows) {
  for (const Expected& e : expectations()) {
    SCOPED_TRACE(e.file);
    const std::string path = std::string(KVSDK_GOLDEN_DIR) + "/" + e.file;
    auto ctx = make_context();
    const kvsdk_geometry want = golden_geometry(e.dtype);
    kvsdk_cache* raw = nullptr;
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &want, &info), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr c(raw);
    EXPECT_EQ(info.format_major, 1u);
    EXPECT_EQ(info.format_minor, 0u);
    EXPECT_EQ(info.journal_frames_applied, e.applied);
    EXPECT_EQ(info.journal_frames_dropped, e.dropped);
    kvsdk_policy p;
    kvsdk_policy_init(&p, KVSDK_METHOD_H2O);
    ASSERT_EQ(kvsdk_cache_policy(c.get(), &p), KVSDK_OK);
    EXPECT_EQ(p.method, KVSDK_METHOD_FULL);
    const size_t esz = e.dtype == KVSDK_DTYPE_F32 ? 4 : 2;
    for (uint32_t l = 0; l < want.n_layers; ++l) {
      kvsdk_layer_stats ls{};
      ls.struct_size = sizeof ls;
      ASSERT_EQ(kvsdk_cache_layer_stats_get(c.get(), l, &ls), KVSDK_OK);
      EXPECT_EQ(ls.appended_tokens, e.appended[l]);
      for (uint32_t h = 0; h < want.n_kv_heads; ++h) {
        const std::vector<int32_t>& expect = e.positions[l][h];
        size_t n = 0;
        ASSERT_EQ(kvsdk_cache_read(c.get(), l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
        ASSERT_EQ(n, expect.size()) << "layer " << l << " head " << h;
        std::vector<unsigned char> k(n * want.head_dim * esz), v(k.size());
        std::vector<int32_t> pos(n);
        ASSERT_EQ(kvsdk_cache_read(c.get(), l, h, k.data(), v.data(), pos.data(), n, &n), KVSDK_OK);
        EXPECT_EQ(pos, expect) << "layer " << l << " head " << h;
        for (size_t r = 0; r < n; ++r) {
          for (uint32_t d = 0; d < want.head_dim; ++d) {
            const uint32_t t = uint32_t(expect[r]);
            ASSERT_EQ(host_value(k, r * want.head_dim + d, e.dtype), key_value(l, t, h, d, false));
            ASSERT_EQ(host_value(v, r * want.head_dim + d, e.dtype), key_value(l, t, h, d, true));
          }
        }
      }
    }
  }
}

}  // namespace
