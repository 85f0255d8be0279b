// CPU attention against a straightforward double-precision reference: MHA and GQA, every input
// dtype, causal masking by position, and caches longer than one attention chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

struct Case {
  uint32_t q_heads, kv_heads, head_dim;
  size_t prompt, queries;
  kvsdk_dtype dtype;
  bool causal;
};

// Rounds x the way a host buffer of `dt` would hold it.
float as_dtype(float x, kvsdk_dtype dt) {
  if (dt == KVSDK_DTYPE_F16) return kvsdk::f16_to_f32(kvsdk::f32_to_f16(x));
  if (dt == KVSDK_DTYPE_BF16) return kvsdk::bf16_to_f32(kvsdk::f32_to_bf16(x));
  return x;
}

std::vector<unsigned char> encode(const std::vector<float>& v, kvsdk_dtype dt) {
  const size_t esz = dt == KVSDK_DTYPE_F32 ? 4 : 2;
  std::vector<unsigned char> b(v.size() * esz);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == KVSDK_DTYPE_F32) {
      std::memcpy(&b[i * 4], &v[i], 4);
    } else {
      const uint16_t h = dt == KVSDK_DTYPE_F16 ? kvsdk::f32_to_f16(v[i]) : kvsdk::f32_to_bf16(v[i]);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}

std::vector<float> decode(const std::vector<unsigned char>& b, size_t n, kvsdk_dtype dt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (dt == KVSDK_DTYPE_F32) {
      std::memcpy(&v[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      v[i] = dt == KVSDK_DTYPE_F16 ? kvsdk::f16_to_f32(h) : kvsdk::bf16_to_f32(h);
    }
  }
  return v;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* dtype = c.dtype == KVSDK_DTYPE_F32 ? "f32" : c.dtype == KVSDK_DTYPE_F16 ? "f16" : "bf16";
  return "q" + std::to_string(c.q_heads) + "kv" + std::to_string(c.kv_heads) + "d" +
         std::to_string(c.head_dim) + "t" + std::to_string(c.prompt) + "n" +
         std::to_string(c.queries) + dtype + (c.causal ? "causal" : "full");
}

class Attention : public ::testing::TestWithParam<Case> {};

TEST_P(Attention, MatchesDoublePrecisionReference) {
  const Case c = GetParam();
  const kvsdk_geometry g = make_geometry(2, c.q_heads, c.kv_heads, c.head_dim, c.dtype);
  auto ctx = make_context();
  auto cache = make_cache(ctx.get(), g);
  ASSERT_TRUE(cache);
  const size_t kv_row = size_t(c.kv_heads) * c.head_dim, q_row = size_t(c.q_heads) * c.head_dim;
  const size_t n_tok = c.prompt;
  std::vector<float> k = random_floats(n_tok * kv_row, 11), v = random_floats(n_tok * kv_row, 12);
  std::vector<float> q = random_floats(c.queries * q_row, 13, 0.5f);
  // Keys with a few large-magnitude channels, as real models have.
  for (size_t t = 0; t < n_tok; ++t) k[t * kv_row + 1] *= 8.0f;
  auto pos = iota_positions(n_tok);
  const auto kb = encode(k, c.dtype), vb = encode(v, c.dtype), qb = encode(q, c.dtype);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 1, n_tok, kb.data(), vb.data(), pos.data(), kb.size()),
            KVSDK_OK);
  // Queries are the last `queries` tokens when causal; otherwise free queries.
  std::vector<int32_t> qpos(c.queries);
  for (size_t i = 0; i < c.queries; ++i) qpos[i] = int32_t(n_tok - c.queries + i);
  std::vector<unsigned char> ob(qb.size());
  ASSERT_EQ(kvsdk_cache_attend(cache.get(), 1, c.queries, qb.data(), c.causal ? qpos.data() : nullptr,
                               qb.size(), ob.data(), ob.size()),
            KVSDK_OK);
  const std::vector<float> out = decode(ob, c.queries * q_row, c.dtype);

  // Reference: the cache stores f16, so reference keys/values are the f16-rounded inputs.
  const double scale = 1.0 / std::sqrt(double(c.head_dim));
  const uint32_t group = c.q_heads / c.kv_heads;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < c.queries; ++i) {
    for (uint32_t h = 0; h < c.q_heads; ++h) {
      const uint32_t kvh = h / group;
      const size_t visible = c.causal ? size_t(qpos[i]) + 1 : n_tok;
      std::vector<double> s(visible);
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t t = 0; t < visible; ++t) {
        double d = 0;
        for (uint32_t x = 0; x < c.head_dim; ++x) {
          const double qv = as_dtype(q[i * q_row + h * c.head_dim + x], c.dtype);
          const double kv =
              kvsdk::f16_to_f32(kvsdk::f32_to_f16(as_dtype(k[t * kv_row + kvh * c.head_dim + x], c.dtype)));
          d += qv * kv;
        }
        s[t] = d * scale;
        mx = std::max(mx, s[t]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - mx));
      for (uint32_t x = 0; x < c.head_dim; ++x) {
        double o = 0;
        for (size_t t = 0; t < visible; ++t) {
          o += s[t] / z *
               kvsdk::f16_to_f32(kvsdk::f32_to_f16(as_dtype(v[t * kv_row + kvh * c.head_dim + x], c.dtype)));
        }
        // bf16/f16 outputs are rounded on the way out: compare against the rounded reference.
        const double got = out[i * q_row + h * c.head_dim + x];
        const double want = as_dtype(float(o), c.dtype);
        err2 += (got - want) * (got - want);
        ref2 += o * o;
      }
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_LT(rel, c.dtype == KVSDK_DTYPE_F32 ? 1e-5 : 1e-3) << "relative error " << rel;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Attention,
    ::testing::Values(Case{4, 4, 16, 37, 3, KVSDK_DTYPE_F32, true},     // MHA, causal prefill
                      Case{8, 2, 64, 300, 1, KVSDK_DTYPE_F32, false},   // GQA decode, 2 chunks
                      Case{8, 2, 64, 600, 17, KVSDK_DTYPE_F32, true},   // GQA, 3 chunks, causal
                      Case{6, 3, 32, 90, 5, KVSDK_DTYPE_F16, true},
                      Case{6, 1, 32, 90, 5, KVSDK_DTYPE_F16, false},    // multi-query
                      Case{4, 2, 128, 70, 4, KVSDK_DTYPE_BF16, true},
                      Case{4, 2, 8, 1, 1, KVSDK_DTYPE_BF16, false}),
    CaseName);

TEST(AttentionMask, QueryBeforeEveryTokenGetsZeros) {
  const kvsdk_geometry g = make_geometry(1, 2, 1, 4);
  auto ctx = make_context();
  auto cache = make_cache(ctx.get(), g);
  std::vector<float> kv(4, 1.0f);
  int32_t pos = 10;
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 0, 1, kv.data(), kv.data(), &pos, 16), KVSDK_OK);
  std::vector<float> q(8, 1.0f), out(8, 5.0f);
  int32_t qpos = 9;
  ASSERT_EQ(kvsdk_cache_attend(cache.get(), 0, 1, q.data(), &qpos, 32, out.data(), 32), KVSDK_OK);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  qpos = 10;
  ASSERT_EQ(kvsdk_cache_attend(cache.get(), 0, 1, q.data(), &qpos, 32, out.data(), 32), KVSDK_OK);
  for (float x : out) EXPECT_EQ(x, 1.0f);
}

}  // namespace
