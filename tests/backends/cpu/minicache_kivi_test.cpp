// MiniCache + KIVI composition: exact norms, bit-exact retained tokens, directions close to the
// SLERP reference within quantization error, attention over restored rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention.h"
#include "minicache_kivi.h"
#include "reference_attention.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

double norm(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

double cosine(const float* a, const double* b, size_t n) {
  double ab = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    ab += a[i] * b[i];
    bb += b[i] * b[i];
  }
  return ab / (norm(a, n) * std::sqrt(bb));
}

std::vector<double> ref_slerp(const float* a, const float* b, size_t n, double t) {
  const double na = norm(a, n), nb = norm(b, n);
  double ab = 0;
  for (size_t i = 0; i < n; ++i) ab += double(a[i]) * b[i];
  const double om = std::acos(std::clamp(ab / (na * nb), -1.0, 1.0));
  std::vector<double> e(n);
  for (size_t i = 0; i < n; ++i)
    e[i] = std::sin((1 - t) * om) / std::sin(om) * a[i] / na + std::sin(t * om) / std::sin(om) * b[i] / nb;
  return e;
}

std::vector<float> correlated(const std::vector<float>& base, uint32_t seed) {
  const std::vector<float> noise = normal_rows(base.size(), seed, 0.4f);
  std::vector<float> x(base.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.3f * base[i] + noise[i];
  return f16_rounded(x);
}

TEST(MiniCacheKivi, NormsExactRetainedExactDirectionsNearSlerp) {
  const size_t n = 400, dim = 64;
  const std::vector<float> kp = f16_rounded(normal_rows(n * dim, 1)), vp = f16_rounded(normal_rows(n * dim, 2));
  std::vector<float> kc = correlated(kp, 3), vc = correlated(vp, 4);
  for (size_t t = 5; t < n; t += 23)  // some tokens whose layers disagree
    for (size_t d = 0; d < dim; ++d) kc[t * dim + d] = kvsdk::f16_to_f32(kvsdk::f32_to_f16(-kp[t * dim + d] + 0.1f * float(d % 3)));
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  for (uint32_t bits : {8u, 4u}) {
    MiniCacheKiviPair pair(dim, MiniCacheConfig{}, KiviConfig{bits, 32, 64});
    pair.append(kp.data(), vp.data(), kc.data(), vc.data(), pos.data(), n);
    EXPECT_EQ(pair.retained(), 20u);  // ceil(0.05 * 400)
    // The retained tokens are those of largest max(key, value) angular distance.
    std::vector<float> dist(n);
    for (size_t t = 0; t < n; ++t) {
      dist[t] = std::max(minicache_angular_distance(&kp[t * dim], &kc[t * dim], dim),
                         minicache_angular_distance(&vp[t * dim], &vc[t * dim], dim));
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return dist[a] > dist[b]; });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(pair.is_retained(order[i]), i < 20) << i;

    for (int layer : {0, 1}) {
      const auto& k0 = layer == 0 ? kp : kc;
      const auto& v0 = layer == 0 ? vp : vc;
      std::vector<float> k(n * dim), v(n * dim);
      pair.read_rows(layer, 0, n, k.data(), v.data());
      for (size_t t = 0; t < n; ++t) {
        if (pair.is_retained(t)) {
          EXPECT_TRUE(std::equal(&k[t * dim], &k[(t + 1) * dim], &k0[t * dim])) << t;
          EXPECT_TRUE(std::equal(&v[t * dim], &v[(t + 1) * dim], &v0[t * dim])) << t;
          continue;
        }
        EXPECT_NEAR(norm(&k[t * dim], dim), norm(&k0[t * dim], dim), 2e-6 * norm(&k0[t * dim], dim));
        EXPECT_NEAR(norm(&v[t * dim], dim), norm(&v0[t * dim], dim), 2e-6 * norm(&v0[t * dim], dim));
        const double min_cos = bits == 8 ? 0.9999 : 0.98;
        EXPECT_GT(cosine(&k[t * dim], ref_slerp(&kp[t * dim], &kc[t * dim], dim, 0.6).data(), dim), min_cos) << t;
        EXPECT_GT(cosine(&v[t * dim], ref_slerp(&vp[t * dim], &vc[t * dim], dim, 0.6).data(), dim), min_cos) << t;
      }
      // Attention over the pair equals dense attention over its restored rows.
      const std::vector<float> q = normal_rows(2 * dim, 9, 0.3f);
      const std::vector<int32_t> qpos = {INT32_MAX, 200};
      OnlineAttention attn(q.data(), qpos.data(), 2, dim, 0.125f);
      minicache_kivi_attend(pair, layer, attn);
      std::vector<float> out(2 * dim);
      attn.finish(out.data());
      EXPECT_LT(relative_error(out, reference_attention(q, qpos, k, v, pos, dim, 0.125)), 2e-6);
    }
    const MiniCacheKiviBytes b = pair.bytes();
    EXPECT_EQ(b.retained, 4 * 2 * 20 * dim);
    EXPECT_EQ(b.merged, 4 * 4 * (n - 20));
    EXPECT_EQ(b.metadata, 4 * n + 4 * n + 4 * (n - 20) + 4);
    EXPECT_EQ(b.quantized, pair.directions().bytes().total() - pair.directions().bytes().positions);
    if (bits == 4) {
      // Against the f16 pair (K and V) of the same data: the directions shrink ~3x.
      MergedLayerPair fk(dim, MiniCacheConfig{}), fv(dim, MiniCacheConfig{});
      fk.append(kp.data(), kc.data(), n);
      fv.append(vp.data(), vc.data(), n);
      EXPECT_LT(b.total(), (fk.bytes() + fv.bytes() + 4 * n) * 0.6);
    }
  }
}

// buffers() -> restore() gives a pair that reads identically and merges further tokens
// identically (threshold included); inconsistent buffers are refused with KVSDK_E_CORRUPT.
TEST(MiniCacheKivi, RestoredPairContinuesIdentically) {
  const size_t n = 150, dim = 32;
  const std::vector<float> kp = f16_rounded(normal_rows(n * dim, 11)), vp = f16_rounded(normal_rows(n * dim, 12));
  const std::vector<float> kc = correlated(kp, 13), vc = correlated(vp, 14);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  const KiviConfig q{4, 8, 16};
  MiniCacheKiviPair a(dim, MiniCacheConfig{}, q);
  a.append(kp.data(), vp.data(), kc.data(), vc.data(), pos.data(), 100);
  MiniCacheKiviPair b = MiniCacheKiviPair::restore(dim, MiniCacheConfig{}, q, a.buffers());
  const size_t o = 100 * dim;
  a.append(&kp[o], &vp[o], &kc[o], &vc[o], &pos[100], n - 100);
  b.append(&kp[o], &vp[o], &kc[o], &vc[o], &pos[100], n - 100);
  for (int layer : {0, 1}) {
    std::vector<float> ka(n * dim), va(n * dim), kb(n * dim), vb(n * dim);
    a.read_rows(layer, 0, n, ka.data(), va.data());
    b.read_rows(layer, 0, n, kb.data(), vb.data());
    EXPECT_EQ(ka, kb);
    EXPECT_EQ(va, vb);
  }
  EXPECT_EQ(a.bytes().total(), b.bytes().total());
  EXPECT_EQ(a.threshold(), b.threshold());
  auto expect_corrupt = [&](MiniCacheKiviPair::Buffers bad, const char* what) {
    try {
      MiniCacheKiviPair::restore(dim, MiniCacheConfig{}, q, std::move(bad));
      ADD_FAILURE() << what;
    } catch (const kvsdk::Error& e) {
      EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << what;
    }
  };
  MiniCacheKiviPair::Buffers bad = a.buffers();
  bad.slots.pop_back();
  expect_corrupt(bad, "one slot too few");
  bad = a.buffers();
  bad.norm_v_cur.pop_back();
  expect_corrupt(bad, "one norm too few");
  bad = a.buffers();
  bad.retained_k_cur.pop_back();
  expect_corrupt(bad, "short retained rows");
  bad = a.buffers();
  std::swap(bad.slots[0], bad.slots[1]);
  if (bad.slots[0] != bad.slots[1]) expect_corrupt(bad, "slots out of order");
  bad = a.buffers();
  bad.positions[0] += 1000;
  expect_corrupt(bad, "positions disagree with the KIVI store");
  bad = a.buffers();
  bad.directions.positions.pop_back();
  expect_corrupt(bad, "KIVI store damaged");
}

}  // namespace
