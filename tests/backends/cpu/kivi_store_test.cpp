// The per-head KIVI store (residual window, block flushes, byte accounting) and attention over it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "core/error.h"
#include "core/half.h"
#include "kivi_attention.h"
#include "kivi_store.h"
#include "reference_attention.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

TEST(KiviStore, ResidualFlushesInBlocksOfG) {
  const size_t dim = 16;
  const KiviConfig cfg{2, 4, 8};  // G = 4, R = 8
  KiviHeadStore s(dim, cfg);
  const std::vector<float> k = normal_rows(40 * dim, 1), v = normal_rows(40 * dim, 2);
  const std::vector<int32_t> pos = [] {
    std::vector<int32_t> p(40);
    for (int i = 0; i < 40; ++i) p[size_t(i)] = 100 + i;
    return p;
  }();
  for (size_t t = 0; t < 40; ++t) {
    s.append(&k[t * dim], &v[t * dim], &pos[t], 1);
    const size_t n = t + 1;
    // Flush when the residual reaches R + G: at least R tokens stay exact, fewer than R + G.
    const size_t expect_quant = n < 12 ? 0 : ((n - 8) / 4) * 4;
    EXPECT_EQ(s.quantized_tokens(), expect_quant) << "after " << n << " tokens";
    EXPECT_EQ(s.residual_tokens(), n - expect_quant);
    EXPECT_EQ(s.quantized_tokens() % cfg.group, 0u);
  }
  EXPECT_EQ(s.positions(), pos);
  // Residual rows are exact f16; quantized rows are close.
  std::vector<float> kr(40 * dim), vr(40 * dim);
  s.read_rows(0, 40, kr.data(), vr.data());
  const std::vector<float> k16 = f16_rounded(k), v16 = f16_rounded(v);
  for (size_t t = s.quantized_tokens(); t < 40; ++t) {
    for (size_t d = 0; d < dim; ++d) {
      EXPECT_EQ(kr[t * dim + d], k16[t * dim + d]);
      EXPECT_EQ(vr[t * dim + d], v16[t * dim + d]);
    }
  }
}

TEST(KiviStore, ContentsDoNotDependOnAppendSplit) {
  const size_t dim = 32, n = 300;
  const KiviConfig cfg{4, 32, 128};
  const std::vector<float> k = normal_rows(n * dim, 3), v = normal_rows(n * dim, 4);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(i);
  KiviHeadStore one(dim, cfg), many(dim, cfg);
  one.append(k.data(), v.data(), pos.data(), n);
  for (size_t t = 0; t < n; t += 7) {
    const size_t c = std::min<size_t>(7, n - t);
    many.append(&k[t * dim], &v[t * dim], &pos[t], c);
  }
  EXPECT_EQ(one.quantized_tokens(), 160u);
  EXPECT_EQ(one.key_codes(), many.key_codes());
  EXPECT_EQ(one.value_codes(), many.value_codes());
  EXPECT_EQ(one.key_scales(), many.key_scales());
  EXPECT_EQ(one.key_zeros(), many.key_zeros());
  EXPECT_EQ(one.value_scales(), many.value_scales());
  EXPECT_EQ(one.value_zeros(), many.value_zeros());
  EXPECT_EQ(one.residual_keys(), many.residual_keys());
  EXPECT_EQ(one.residual_values(), many.residual_values());
}

TEST(KiviStore, BytesCountEveryBuffer) {
  const size_t dim = 128, n = 1000;
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    const KiviConfig cfg{bits, 32, 128};
    KiviHeadStore s(dim, cfg);
    const std::vector<float> k = normal_rows(n * dim, 5), v = normal_rows(n * dim, 6);
    std::vector<int32_t> pos(n, 0);
    s.append(k.data(), v.data(), pos.data(), n);
    const KiviBytes b = s.bytes();
    const uint64_t nq = s.quantized_tokens(), nr = s.residual_tokens();
    EXPECT_EQ(nq, 864u);  // 1000 - 128 = 872 -> 27 blocks of 32
    EXPECT_EQ(b.codes, 2 * nq * dim * bits / 8);
    EXPECT_EQ(b.scales_zeros, 2 * 2 * (nq / 32) * dim + 2 * 2 * nq * (dim / 32));
    EXPECT_EQ(b.residual, 2 * 2 * nr * dim);
    EXPECT_EQ(b.positions, 4 * n);
    EXPECT_DOUBLE_EQ(double(b.total() - b.residual - 4 * nr),
                     double(nq) * KiviHeadStore::bytes_per_quantized_token(dim, cfg));
  }
  // 2-bit at G = 32, d = 128: 64 code bytes + 16 key-param + 16 value-param + 4 position bytes per
  // token, against 516 for the exact f16 tier: ~5.4x smaller.
  EXPECT_DOUBLE_EQ(KiviHeadStore::bytes_per_quantized_token(128, KiviConfig{2, 32, 128}), 100.0);
}

TEST(KiviStore, RejectsBadConfig) {
  EXPECT_THROW(KiviHeadStore(16, KiviConfig{3, 32, 128}), kvsdk::Error);
  EXPECT_THROW(KiviHeadStore(16, KiviConfig{2, 0, 128}), kvsdk::Error);
  EXPECT_THROW(KiviHeadStore(0, KiviConfig{2, 32, 128}), kvsdk::Error);
}

struct AttnCase {
  uint32_t bits;
  size_t n;
  double max_rel_to_exact;
};

class KiviAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(KiviAttention, MatchesDenseOverDequantizedRowsAndStaysNearExact) {
  const AttnCase c = GetParam();
  const size_t dim = 64, group = 4;  // 4 query heads share the KV head
  const KiviConfig cfg{c.bits, 32, 64};
  KiviHeadStore s(dim, cfg);
  std::vector<float> k = normal_rows(c.n * dim, 7), v = normal_rows(c.n * dim, 8);
  for (size_t t = 0; t < c.n; ++t) k[t * dim + 5] += 6.0f;  // outlier channel, as real keys have
  std::vector<int32_t> pos(c.n);
  for (size_t i = 0; i < c.n; ++i) pos[i] = int32_t(i);
  s.append(k.data(), v.data(), pos.data(), c.n);
  const std::vector<float> q = normal_rows(group * dim, 9, 0.5f);
  // Two rows see everything, two are causal at an earlier position.
  const std::vector<int32_t> qpos = {INT32_MAX, int32_t(c.n - 1), int32_t(c.n / 2), INT32_MAX};
  const float scale = 1.0f / std::sqrt(float(dim));

  OnlineAttention attn(q.data(), qpos.data(), group, dim, scale);
  kivi_attend(s, attn);
  std::vector<float> out(group * dim);
  attn.finish(out.data());

  std::vector<float> kd(c.n * dim), vd(c.n * dim);
  s.read_rows(0, c.n, kd.data(), vd.data());
  const double rel_deq = relative_error(out, reference_attention(q, qpos, kd, vd, pos, dim, scale));
  EXPECT_LT(rel_deq, 2e-6) << "attention over the dequantized rows must match to float rounding";

  const double rel_exact = relative_error(out, reference_attention(q, qpos, k, v, pos, dim, scale));
  EXPECT_LT(rel_exact, c.max_rel_to_exact) << "bits " << c.bits;
  RecordProperty("rel_to_exact", std::to_string(rel_exact));
}

INSTANTIATE_TEST_SUITE_P(Widths, KiviAttention,
                         // Bounds: the output error of attention over i.i.d. Gaussian values is about
                         // the per-element quantization noise (step/sqrt(12) over σ): ~0.005 at 8
                         // bits, ~0.1 at 4, ~0.4 at 2; 1 bit keeps only two levels per group.
                         ::testing::Values(AttnCase{8, 700, 0.01}, AttnCase{4, 700, 0.14},
                                           AttnCase{2, 700, 0.6}, AttnCase{1, 700, 0.95},
                                           AttnCase{2, 50, 1e-3}),  // all in the residual
                         [](const ::testing::TestParamInfo<AttnCase>& i) {
                           return "bits" + std::to_string(i.param.bits) + "n" +
                                  std::to_string(i.param.n);
                         });

}  // namespace

namespace {

// Rows read in arbitrary ranges (across key blocks and into the residual) equal a full read; head
// dims that are not a multiple of G get a shorter last value group.
TEST(KiviStore, PartialReadsAndShortLastValueGroup) {
  const size_t dim = 40, n = 230;  // value groups of 32 + 8 channels
  const KiviConfig cfg{4, 32, 64};
  KiviHeadStore s(dim, cfg);
  const std::vector<float> k = normal_rows(n * dim, 61), v = normal_rows(n * dim, 62);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(i);
  s.append(k.data(), v.data(), pos.data(), n);
  EXPECT_EQ(s.value_scales().size(), s.quantized_tokens() * 2);
  std::vector<float> kall(n * dim), vall(n * dim);
  s.read_rows(0, n, kall.data(), vall.data());
  for (size_t first : {0u, 5u, 31u, 32u, 63u, 150u, 159u, 160u, 229u}) {
    for (size_t count : {1u, 2u, 33u, 70u}) {
      if (first + count > n) continue;
      std::vector<float> kp(count * dim), vp(count * dim);
      s.read_rows(first, count, kp.data(), vp.data());
      EXPECT_TRUE(std::equal(kp.begin(), kp.end(), kall.begin() + first * dim)) << first << "+" << count;
      EXPECT_TRUE(std::equal(vp.begin(), vp.end(), vall.begin() + first * dim)) << first << "+" << count;
    }
  }
  // Every quantized value within half a step of its group (the 8-channel group has its own range);
  // the store quantizes the f16 rows it held in the residual.
  const std::vector<float> v16 = f16_rounded(v);
  for (size_t t = 0; t < s.quantized_tokens(); ++t) {
    for (size_t c = 0; c < dim; ++c) {
      const float step = kvsdk::f16_to_f32(s.value_scales()[t * 2 + c / 32]);
      EXPECT_LE(std::fabs(vall[t * dim + c] - v16[t * dim + c]), 0.5f * step * (1 + 1e-5f) + 1e-6f);
    }
  }
}

}  // namespace
