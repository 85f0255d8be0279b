// MiniCache cross-layer merge (formulas in backends/cpu/minicache_merge.h) against a
// double-precision SLERP reference: restored magnitudes, bit-exact retained tokens, merged
// directions, decode-time retention, attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention.h"
#include "minicache_merge.h"
#include "reference_attention.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

constexpr double kPi = 3.14159265358979323846;

double norm(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

double ref_distance(const float* a, const float* b, size_t n) {
  double ab = 0;
  for (size_t i = 0; i < n; ++i) ab += double(a[i]) * b[i];
  return std::acos(std::clamp(ab / (norm(a, n) * norm(b, n)), -1.0, 1.0)) / kPi;
}

std::vector<double> ref_slerp(const float* a, const float* b, size_t n, double t) {
  const double na = norm(a, n), nb = norm(b, n);
  double ab = 0;
  for (size_t i = 0; i < n; ++i) ab += double(a[i]) * b[i];
  const double omega = std::acos(std::clamp(ab / (na * nb), -1.0, 1.0));
  std::vector<double> e(n);
  for (size_t i = 0; i < n; ++i) {
    e[i] = std::sin((1 - t) * omega) / std::sin(omega) * a[i] / na +
           std::sin(t * omega) / std::sin(omega) * b[i] / nb;
  }
  return e;
}

// Layer l rows correlated with layer l-1 rows (as adjacent layers are), plus a few unrelated ones.
void layer_pair(size_t n, size_t dim, uint32_t seed, std::vector<float>& prev, std::vector<float>& cur) {
  prev = f16_rounded(normal_rows(n * dim, seed));
  const std::vector<float> noise = normal_rows(n * dim, seed + 1, 0.4f);
  cur.resize(n * dim);
  for (size_t t = 0; t < n; ++t) {
    const bool unrelated = t % 17 == 3;
    for (size_t d = 0; d < dim; ++d) {
      cur[t * dim + d] = unrelated ? noise[t * dim + d] * 2.5f
                                   : 1.7f * prev[t * dim + d] + noise[t * dim + d];
    }
  }
  cur = f16_rounded(cur);
}

TEST(MiniCache, MagnitudesRestoredRetainedExactDirectionsAreSlerp) {
  const size_t n = 300, dim = 64;
  const MiniCacheConfig cfg;  // t = 0.6, γ = 0.05
  std::vector<float> a, b;
  layer_pair(n, dim, 5, a, b);
  MergedLayerPair m(dim, cfg);
  m.append(a.data(), b.data(), n);
  ASSERT_EQ(m.size(), n);

  // Retained: the ceil(0.05 * 300) = 15 tokens of largest Ω/π.
  std::vector<double> dist(n);
  for (size_t t = 0; t < n; ++t) dist[t] = ref_distance(&a[t * dim], &b[t * dim], dim);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return dist[x] > dist[y]; });
  EXPECT_EQ(m.retained(), 15u);
  EXPECT_EQ(m.merged(), n - 15);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(m.is_retained(order[i]), i < 15) << "rank " << i;

  std::vector<float> ra(n * dim), rb(n * dim);
  m.reconstruct(0, 0, n, ra.data());
  m.reconstruct(1, 0, n, rb.data());
  for (size_t t = 0; t < n; ++t) {
    if (m.is_retained(t)) {
      for (size_t d = 0; d < dim; ++d) {  // bit-exact in both layers
        EXPECT_EQ(kvsdk::float_bits(ra[t * dim + d]), kvsdk::float_bits(a[t * dim + d]));
        EXPECT_EQ(kvsdk::float_bits(rb[t * dim + d]), kvsdk::float_bits(b[t * dim + d]));
      }
      continue;
    }
    // ||x|| · e restores each layer's norm (to f32 rounding).
    EXPECT_NEAR(norm(&ra[t * dim], dim), norm(&a[t * dim], dim), 2e-6 * norm(&a[t * dim], dim));
    EXPECT_NEAR(norm(&rb[t * dim], dim), norm(&b[t * dim], dim), 2e-6 * norm(&b[t * dim], dim));
    // The stored direction is the SLERP of the two unit vectors, rounded to f16.
    const std::vector<double> e = ref_slerp(&a[t * dim], &b[t * dim], dim, 0.6);
    const uint16_t* got = m.direction(t);
    for (size_t d = 0; d < dim; ++d) {
      EXPECT_NEAR(kvsdk::f16_to_f32(got[d]), e[d], 1e-3 * std::fabs(e[d]) + 1e-7) << t << "," << d;
    }
    // Both restored rows point along e.
    double dot = 0;
    for (size_t d = 0; d < dim; ++d) dot += e[d] * ra[t * dim + d];
    EXPECT_GT(dot / norm(&ra[t * dim], dim), 0.9999);
  }
  EXPECT_EQ(m.bytes(), 4 * n + 2 * (n - 15) * dim + 8 * (n - 15) + 2 * 2 * 15 * dim + 4);
}

TEST(MiniCache, DecodeTokensMergeUnlessAsDistantAsTheRetainedOnes) {
  const size_t n = 100, dim = 32;
  std::vector<float> a, b;
  layer_pair(n, dim, 9, a, b);
  MergedLayerPair m(dim, MiniCacheConfig{});
  m.append(a.data(), b.data(), n);
  const float threshold = m.threshold();
  EXPECT_GT(threshold, 0.0f);
  std::vector<float> a2, b2;
  layer_pair(40, dim, 77, a2, b2);
  for (size_t t = 0; t < 40; ++t) m.append(&a2[t * dim], &b2[t * dim], 1);
  for (size_t t = 0; t < 40; ++t) {
    const double d = ref_distance(&a2[t * dim], &b2[t * dim], dim);
    if (std::fabs(d - threshold) < 1e-5) continue;  // float vs double at the boundary
    EXPECT_EQ(m.is_retained(n + t), d >= threshold) << t << " distance " << d;
  }
  EXPECT_GT(m.retained(), 5u);  // some decode tokens were unrelated ones
}

TEST(MiniCache, SlerpFallsBackToLinearForParallelDirections) {
  const size_t dim = 4;
  const float a[dim] = {1, 2, 3, 4}, same[dim] = {2, 4, 6, 8}, opposite[dim] = {-1, -2, -3, -4};
  float e[dim];
  minicache_slerp(a, same, dim, 0.6f, e);
  const double na = norm(a, dim);
  for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(e[d], a[d] / na, 1e-6);
  minicache_slerp(a, opposite, dim, 0.6f, e);
  for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(e[d], (0.4 - 0.6) * a[d] / na, 1e-6);
  for (size_t d = 0; d < dim; ++d) EXPECT_TRUE(std::isfinite(e[d]));
  EXPECT_FLOAT_EQ(minicache_angular_distance(a, opposite, dim), 1.0f);
  EXPECT_NEAR(minicache_angular_distance(a, same, dim), 0.0f, 1e-3f);
}

TEST(MiniCache, ZeroRowsAreRetained) {
  const size_t dim = 8;
  std::vector<float> a(2 * dim, 0.0f), b(2 * dim, 1.0f);
  a[dim] = 1.0f;
  MergedLayerPair m(dim, MiniCacheConfig{0.6f, 0.0f});  // γ = 0: only forced retention
  m.append(a.data(), b.data(), 2);
  EXPECT_TRUE(m.is_retained(0));
  EXPECT_FALSE(m.is_retained(1));
  std::vector<float> r(2 * dim);
  m.reconstruct(0, 0, 2, r.data());
  for (size_t d = 0; d < dim; ++d) EXPECT_EQ(r[d], 0.0f);
}

TEST(MiniCache, RejectsBadConfig) {
  EXPECT_THROW(MergedLayerPair(0, MiniCacheConfig{}), kvsdk::Error);
  EXPECT_THROW(MergedLayerPair(8, MiniCacheConfig{1.5f, 0.05f}), kvsdk::Error);
  EXPECT_THROW(MergedLayerPair(8, MiniCacheConfig{0.6f, -0.1f}), kvsdk::Error);
}

TEST(MiniCache, AttentionOverEachLayerMatchesDenseOverRestoredRows) {
  const size_t n = 600, dim = 64;
  std::vector<float> ka, kb, va, vb;
  layer_pair(n, dim, 21, ka, kb);
  layer_pair(n, dim, 31, va, vb);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  MiniCacheHeadPair pair(dim, MiniCacheConfig{});
  pair.append(ka.data(), va.data(), kb.data(), vb.data(), pos.data(), n);
  EXPECT_EQ(pair.bytes(), pair.keys.bytes() + pair.values.bytes() + 4 * n);
  const std::vector<float> q = normal_rows(3 * dim, 4, 0.3f);
  const std::vector<int32_t> qpos = {INT32_MAX, 400, 599};
  for (int layer : {0, 1}) {
    OnlineAttention attn(q.data(), qpos.data(), 3, dim, 0.125f);
    minicache_attend(pair, layer, attn);
    std::vector<float> out(3 * dim), kr(n * dim), vr(n * dim);
    attn.finish(out.data());
    pair.keys.reconstruct(layer, 0, n, kr.data());
    pair.values.reconstruct(layer, 0, n, vr.data());
    EXPECT_LT(relative_error(out, reference_attention(q, qpos, kr, vr, pos, dim, 0.125)), 2e-6);
    // And close to attention over the layer's original rows (merging loses direction only).
    const auto& k0 = layer == 0 ? ka : kb;
    const auto& v0 = layer == 0 ? va : vb;
    EXPECT_LT(relative_error(out, reference_attention(q, qpos, k0, v0, pos, dim, 0.125)), 0.5);
  }
}

}  // namespace

namespace {

TEST(MiniCache, NonFiniteRowsAreRetainedNotMerged) {
  const size_t dim = 4;
  const float nan = std::nanf("");
  std::vector<float> a = {1, 2, 3, 4, nan, 1, 1, 1, 1, 1, 1, 1};
  std::vector<float> b = {1, 2, 3, 5, 1, 1, 1, 1, 1, 1, 1, 1.1f};
  EXPECT_EQ(minicache_angular_distance(&a[4], &b[4], dim), 1.0f);
  MergedLayerPair m(dim, MiniCacheConfig{0.6f, 0.0f});
  m.append(a.data(), b.data(), 3);
  EXPECT_FALSE(m.is_retained(0));
  EXPECT_TRUE(m.is_retained(1));
  EXPECT_FALSE(m.is_retained(2));
}

}  // namespace

namespace {

TEST(MiniCache, RestoredPairContinuesIdentically) {
  const size_t n = 120, dim = 16;
  std::vector<float> a, b;
  layer_pair(n, dim, 13, a, b);
  MergedLayerPair m(dim, MiniCacheConfig{});
  m.append(a.data(), b.data(), 80);
  MergedLayerPair r = MergedLayerPair::restore(dim, MiniCacheConfig{}, m.buffers());
  for (size_t t = 80; t < n; ++t) {
    m.append(&a[t * dim], &b[t * dim], 1);
    r.append(&a[t * dim], &b[t * dim], 1);
  }
  const auto bm = m.buffers(), br = r.buffers();
  EXPECT_EQ(bm.slots, br.slots);
  EXPECT_EQ(bm.directions, br.directions);
  EXPECT_EQ(bm.magnitudes_prev, br.magnitudes_prev);
  EXPECT_EQ(bm.retained_cur, br.retained_cur);
  EXPECT_EQ(bm.threshold, br.threshold);
  EXPECT_EQ(m.bytes(), r.bytes());
  auto bad = m.buffers();
  std::swap(bad.slots[0], bad.slots[1]);
  if (bad.slots[0] != bad.slots[1]) EXPECT_THROW(MergedLayerPair::restore(dim, MiniCacheConfig{}, bad), kvsdk::Error);
  bad = m.buffers();
  bad.directions.pop_back();
  EXPECT_THROW(MergedLayerPair::restore(dim, MiniCacheConfig{}, bad), kvsdk::Error);
  bad = m.buffers();
  bad.slots.push_back(0);
  EXPECT_THROW(MergedLayerPair::restore(dim, MiniCacheConfig{}, bad), kvsdk::Error);
}

}  // namespace
