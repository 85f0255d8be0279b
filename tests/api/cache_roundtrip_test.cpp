// append -> read returns exactly what was stored (f16 exact tier), for every input dtype.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

// Host buffers of one dtype, filled from f32 values that are exactly representable in f16 (so
// that the exact tier must give them back bit for bit).
struct HostTensor {
  kvsdk_dtype dtype;
  std::vector<unsigned char> bytes;
  std::vector<float> values;  // what the buffer holds, as f32

  HostTensor(kvsdk_dtype dt, const std::vector<float>& src) : dtype(dt) {
    const size_t esz = dt == KVSDK_DTYPE_F32 ? 4 : 2;
    bytes.resize(src.size() * esz);
    values.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      // bf16 has fewer mantissa bits than f16: round through bf16 then f16 stays exact.
      float x = kvsdk::f16_to_f32(kvsdk::f32_to_f16(src[i]));
      if (dt == KVSDK_DTYPE_BF16) {
        const uint16_t b = kvsdk::f32_to_bf16(x);
        x = kvsdk::bf16_to_f32(b);
        std::memcpy(&bytes[i * 2], &b, 2);
      } else if (dt == KVSDK_DTYPE_F16) {
        const uint16_t h = kvsdk::f32_to_f16(x);
        std::memcpy(&bytes[i * 2], &h, 2);
      } else {
        std::memcpy(&bytes[i * 4], &x, 4);
      }
      values[i] = x;
    }
  }
  float at(const std::vector<unsigned char>& buf, size_t i) const {
    if (dtype == KVSDK_DTYPE_F32) {
      float f;
      std::memcpy(&f, &buf[i * 4], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &buf[i * 2], 2);
    return dtype == KVSDK_DTYPE_F16 ? kvsdk::f16_to_f32(h) : kvsdk::bf16_to_f32(h);
  }
};

class RoundTrip : public ::testing::TestWithParam<kvsdk_dtype> {};

TEST_P(RoundTrip, AppendThenReadGivesBackEveryHead) {
  const kvsdk_dtype dt = GetParam();
  const kvsdk_geometry g = make_geometry(3, 8, 2, 32, dt);
  auto ctx = make_context();
  auto cache = make_cache(ctx.get(), g);
  ASSERT_TRUE(cache);
  const size_t esz = dt == KVSDK_DTYPE_F32 ? 4 : 2;
  const size_t row = g.n_kv_heads * g.head_dim;
  // Two appends to layer 1 (prefill then a decode token); layer 0 and 2 get one each.
  HostTensor k1(dt, random_floats(40 * row, 1)), v1(dt, random_floats(40 * row, 2));
  HostTensor k2(dt, random_floats(1 * row, 3)), v2(dt, random_floats(1 * row, 4));
  auto p1 = iota_positions(40), p2 = iota_positions(1, 40);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 1, 40, k1.bytes.data(), v1.bytes.data(), p1.data(),
                               k1.bytes.size()),
            KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 1, 1, k2.bytes.data(), v2.bytes.data(), p2.data(),
                               k2.bytes.size()),
            KVSDK_OK);
  for (uint32_t head = 0; head < g.n_kv_heads; ++head) {
    size_t n = 0;
    ASSERT_EQ(kvsdk_cache_read(cache.get(), 1, head, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
    ASSERT_EQ(n, 41u);
    std::vector<unsigned char> k(n * g.head_dim * esz), v(n * g.head_dim * esz);
    std::vector<int32_t> pos(n);
    ASSERT_EQ(kvsdk_cache_read(cache.get(), 1, head, k.data(), v.data(), pos.data(), n, &n),
              KVSDK_OK);
    for (size_t t = 0; t < n; ++t) {
      EXPECT_EQ(pos[t], int32_t(t));
      const HostTensor& ks = t < 40 ? k1 : k2;
      const HostTensor& vs = t < 40 ? v1 : v2;
      const size_t src_t = t < 40 ? t : 0;
      for (size_t d = 0; d < g.head_dim; ++d) {
        const size_t src = src_t * row + head * g.head_dim + d;
        ASSERT_EQ(ks.at(k, t * g.head_dim + d), ks.values[src]) << "t=" << t << " d=" << d;
        ASSERT_EQ(vs.at(v, t * g.head_dim + d), vs.values[src]);
      }
    }
  }
  size_t n = 99;
  ASSERT_EQ(kvsdk_cache_read(cache.get(), 0, 0, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  EXPECT_EQ(n, 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTrip,
                         ::testing::Values(KVSDK_DTYPE_F32, KVSDK_DTYPE_F16, KVSDK_DTYPE_BF16));

TEST(Read, PositionsOnlyAndCapacityChecks) {
  const kvsdk_geometry g = make_geometry(1, 2, 2, 8);
  auto ctx = make_context();
  auto cache = make_cache(ctx.get(), g);
  auto k = random_floats(5 * 16, 1), v = random_floats(5 * 16, 2);
  std::vector<int32_t> pos = {10, 11, 12, 20, 21};
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, 5, k.data(), v.data(), pos.data(), 5 * 16 * 4),
            KVSDK_OK);
  std::vector<int32_t> out(5, -1);
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(cache.get(), 0, 1, nullptr, nullptr, out.data(), 4, &n),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(out[0], -1);  // untouched on failure
  ASSERT_EQ(kvsdk_cache_read(cache.get(), 0, 1, nullptr, nullptr, out.data(), 5, &n), KVSDK_OK);
  EXPECT_EQ(out, pos);
}

TEST(Stats, CountEveryByte) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 16);
  auto ctx = make_context();
  auto cache = make_cache(ctx.get(), g);
  auto k = random_floats(7 * 32, 1);
  auto pos = iota_positions(7);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 1, 7, k.data(), k.data(), pos.data(), 7 * 32 * 4),
            KVSDK_OK);
  kvsdk_cache_stats s;
  s.struct_size = sizeof(s);
  ASSERT_EQ(kvsdk_cache_stats_get(cache.get(), &s), KVSDK_OK);
  EXPECT_EQ(s.n_layers, 2u);
  EXPECT_EQ(s.tokens, 14u);  // 7 tokens x 2 KV heads
  EXPECT_EQ(s.appended_tokens, 7u);
  EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_EXACT], 7u * 2 * 16 * 2 * 2);
  EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_METADATA], 7u * 2 * 4);
  EXPECT_EQ(s.bytes, 7 * exact_bytes_per_token(g));
  EXPECT_EQ(s.full_bytes, s.bytes);
  EXPECT_EQ(s.context_used_bytes, s.bytes);
  kvsdk_layer_stats ls;
  ls.struct_size = sizeof(ls);
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 1, &ls), KVSDK_OK);
  EXPECT_EQ(ls.tokens_min_head, 7u);
  EXPECT_EQ(ls.tokens_max_head, 7u);
  EXPECT_EQ(ls.bytes, s.bytes);
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 0, &ls), KVSDK_OK);
  EXPECT_EQ(ls.bytes, 0u);
}

TEST(Geometry, CacheReportsItsGeometry) {
  const kvsdk_geometry g = make_geometry(3, 6, 3, 24, KVSDK_DTYPE_BF16);
  auto ctx = make_context();
  auto cache = make_cache(ctx.get(), g);
  kvsdk_geometry out;
  kvsdk_geometry_init(&out);
  ASSERT_EQ(kvsdk_cache_geometry(cache.get(), &out), KVSDK_OK);
  EXPECT_EQ(out.n_layers, 3u);
  EXPECT_EQ(out.n_q_heads, 6u);
  EXPECT_EQ(out.n_kv_heads, 3u);
  EXPECT_EQ(out.head_dim, 24u);
  EXPECT_EQ(out.dtype, KVSDK_DTYPE_BF16);
  EXPECT_FLOAT_EQ(out.attn_scale, 1.0f / std::sqrt(24.0f));
}

}  // namespace
