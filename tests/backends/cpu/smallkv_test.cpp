// SmallKV (docs/papers.md) against naive references: top-k and Jaccard (Eq. 2), argmax-Jaccard head
// matching (Eq. 3), the 2:1:2 budget split, token selection, and the Eq. 6 composition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "reference_attention.h"
#include "smallkv.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

std::set<uint32_t> naive_topk(const std::vector<float>& s, size_t k) {
  std::vector<uint32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return s[a] > s[b]; });
  return std::set<uint32_t>(idx.begin(), idx.begin() + std::min(k, s.size()));
}

TEST(SmallKv, TopkPrefersLowerIndexOnTies) {
  const float s[6] = {1, 3, 3, 0, 3, 2};
  EXPECT_EQ(smallkv_topk(s, 6, 2), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(smallkv_topk(s, 6, 4), (std::vector<uint32_t>{1, 2, 4, 5}));
  EXPECT_EQ(smallkv_topk(s, 6, 10).size(), 6u);
  EXPECT_TRUE(smallkv_topk(s, 6, 0).empty());
}

TEST(SmallKv, HeadMappingIsArgmaxJaccard) {
  const size_t n = 150, k = 20, n_proxy = 6, n_large = 10;
  std::vector<float> proxy = normal_rows(n_proxy * n, 1);
  for (float& x : proxy) x = std::exp(x);  // positive, heavy-tailed like accumulated attention
  // Large heads: noisy copies of a planted proxy head (as same-family models show), plus two
  // unrelated heads.
  std::vector<float> large(n_large * n);
  const std::vector<float> noise = normal_rows(n_large * n, 2, 0.3f);
  const uint32_t planted[n_large] = {3, 0, 5, 5, 1, 2, 4, 0, 99, 99};
  for (size_t i = 0; i < n_large; ++i) {
    for (size_t t = 0; t < n; ++t) {
      large[i * n + t] = planted[i] < n_proxy ? proxy[planted[i] * n + t] * std::exp(noise[i * n + t])
                                              : std::exp(3 * noise[i * n + t]);
    }
  }
  const std::vector<uint32_t> map = smallkv_match_heads(large.data(), n_large, proxy.data(), n_proxy, n, k);
  ASSERT_EQ(map.size(), n_large);
  for (size_t i = 0; i < n_large; ++i) {
    const std::set<uint32_t> a =
        naive_topk(std::vector<float>(&large[i * n], &large[(i + 1) * n]), k);
    double best = -1;
    uint32_t arg = 0;
    for (uint32_t j = 0; j < n_proxy; ++j) {
      const std::set<uint32_t> b =
          naive_topk(std::vector<float>(&proxy[j * n], &proxy[(j + 1) * n]), k);
      std::vector<uint32_t> inter, uni;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(inter));
      std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(uni));
      const double s = double(inter.size()) / double(uni.size());
      EXPECT_DOUBLE_EQ(smallkv_jaccard(&large[i * n], &proxy[j * n], n, k), s);
      if (s > best) {
        best = s;
        arg = j;
      }
    }
    EXPECT_EQ(map[i], arg) << "head " << i;
    if (planted[i] < n_proxy) EXPECT_EQ(map[i], planted[i]) << "head " << i;
  }
}

TEST(SmallKv, BudgetSplitIsTwoOneTwoWithHalfCostMarginals) {
  // The paper's example: a 20% budget gives 10% critical, 5% recent, 10% marginal tokens.
  SmallKvSplit s = smallkv_split_budget(200, 1000);
  EXPECT_EQ(s.critical, 100u);
  EXPECT_EQ(s.recent, 50u);
  EXPECT_EQ(s.marginal, 100u);
  for (size_t n : {10u, 100u, 1000u}) {
    for (size_t budget = 0; budget < n; ++budget) {
      s = smallkv_split_budget(budget, n);
      EXPECT_LE(s.critical + s.recent + s.marginal, n);
      EXPECT_LE(2 * (s.critical + s.recent) + s.marginal, 2 * budget) << budget << "/" << n;
      if (s.critical + s.recent + s.marginal < n) {
        // Not clamped: exactly 2:1:2 (remainder to critical) and the whole budget used.
        EXPECT_EQ(s.marginal, 2 * s.recent);
        EXPECT_EQ(s.critical, 2 * s.recent + budget % 4);
        EXPECT_EQ(2 * (s.critical + s.recent) + s.marginal, 2 * budget);
      }
    }
  }
  s = smallkv_split_budget(50, 40);  // everything fits
  EXPECT_EQ(s.critical, 40u);
  EXPECT_EQ(s.recent + s.marginal, 0u);
}

TEST(SmallKv, SelectionTakesRecentThenTopScoresThenNextScores) {
  const float scores[10] = {5, 1, 9, 2, 8, 3, 7, 0.5f, 100, 100};
  const SmallKvSelection sel = smallkv_select(scores, 10, SmallKvSplit{2, 2, 3});
  // Recent: 8, 9 (their scores do not matter); critical among 0..7: 2 (9), 4 (8); marginal: 6, 0, 5.
  EXPECT_EQ(sel.full, (std::vector<uint32_t>{2, 4, 8, 9}));
  EXPECT_EQ(sel.marginal, (std::vector<uint32_t>{0, 5, 6}));
}

// Eq. 6 computed naively in double: critical tokens get the large model's probability over the
// kept keys scaled by (1 - M), marginal tokens the proxy's probability, others 0.
std::vector<double> naive_eq6(const std::vector<float>& q, const std::vector<int32_t>& qpos,
                              size_t dim, double scale, const std::vector<float>& kf,
                              const std::vector<float>& vf, const std::vector<int32_t>& pf,
                              const std::vector<float>& vm, const std::vector<int32_t>& pm,
                              const std::vector<float>& w) {
  const size_t rows = qpos.size(), nf = pf.size(), nm = pm.size();
  std::vector<double> out(rows * dim, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double M = 0;
    for (size_t j = 0; j < nm; ++j)
      if (pm[j] <= qpos[r]) M += w[r * nm + j];
    std::vector<double> a(nf, 0.0);
    double z = 0, mx = -1e300;
    for (size_t t = 0; t < nf; ++t) {
      if (pf[t] > qpos[r]) continue;
      double d = 0;
      for (size_t x = 0; x < dim; ++x) d += double(q[r * dim + x]) * kf[t * dim + x];
      a[t] = d * scale;
      mx = std::max(mx, a[t]);
    }
    for (size_t t = 0; t < nf; ++t) z += pf[t] <= qpos[r] ? std::exp(a[t] - mx) : 0.0;
    for (size_t t = 0; t < nf; ++t) {
      const double p = pf[t] <= qpos[r] ? std::exp(a[t] - mx) / z * (1 - M) : 0.0;
      for (size_t x = 0; x < dim; ++x) out[r * dim + x] += p * vf[t * dim + x];
    }
    for (size_t j = 0; j < nm; ++j) {
      if (pm[j] > qpos[r]) continue;
      for (size_t x = 0; x < dim; ++x) out[r * dim + x] += double(w[r * nm + j]) * vm[j * dim + x];
    }
  }
  return out;
}

TEST(SmallKv, AttentionCompositionEqualsEq6) {
  const size_t dim = 16, nf = 12, nm = 9, rows = 3;
  const std::vector<float> q = normal_rows(rows * dim, 1, 0.5f);
  const std::vector<float> kf = normal_rows(nf * dim, 2), vf = normal_rows(nf * dim, 3);
  const std::vector<float> vm = normal_rows(nm * dim, 4);
  std::vector<int32_t> pf(nf), pm(nm);
  for (size_t i = 0; i < nf; ++i) pf[i] = int32_t(2 * i);
  for (size_t i = 0; i < nm; ++i) pm[i] = int32_t(2 * i + 1);
  const std::vector<int32_t> qpos = {INT32_MAX, 9, 30};
  // Proxy probabilities of the marginal tokens (a slice of a distribution: sums below 1).
  std::vector<float> w = normal_rows(rows * nm, 5);
  for (float& x : w) x = 0.04f * std::exp(x) / 1.6f;
  std::vector<float> out(rows * dim);
  smallkv_attend(q.data(), qpos.data(), rows, dim, 0.25f, kf.data(), vf.data(), pf.data(), nf,
                 vm.data(), pm.data(), nm, w.data(), out.data());
  const std::vector<double> want = naive_eq6(q, qpos, dim, 0.25, kf, vf, pf, vm, pm, w);
  EXPECT_LT(relative_error(out, want), 2e-6);

  // Without marginal tokens it is plain attention over the kept tokens.
  smallkv_attend(q.data(), qpos.data(), rows, dim, 0.25f, kf.data(), vf.data(), pf.data(), nf,
                 nullptr, nullptr, 0, nullptr, out.data());
  EXPECT_LT(relative_error(out, reference_attention(q, qpos, kf, vf, pf, dim, 0.25)), 2e-6);
}

}  // namespace

namespace {

TEST(SmallKv, NanScoresRankLast) {
  const float nan = std::nanf("");
  const float s[5] = {nan, 2, nan, 1, 3};
  EXPECT_EQ(smallkv_topk(s, 5, 3), (std::vector<uint32_t>{1, 3, 4}));
  const SmallKvSelection sel = smallkv_select(s, 5, SmallKvSplit{1, 1, 1});
  EXPECT_EQ(sel.full, (std::vector<uint32_t>{1, 4}));  // 4 is recent; 1 ranks first among 0..3
  EXPECT_EQ(sel.marginal, (std::vector<uint32_t>{3}));
}

}  // namespace

namespace {

// Eq. 1 and the proxy's weights against the double reference attention's probabilities.
TEST(SmallKv, AccumulatedAttentionAndProxyWeights) {
  const size_t dim = 8, n = 30, nq = 5;
  const std::vector<float> q = normal_rows(nq * dim, 11), k = normal_rows(n * dim, 12);
  std::vector<int32_t> pos(n), qpos(nq);
  for (size_t t = 0; t < n; ++t) pos[t] = int32_t(n - 1 - t);  // rows not in position order
  for (size_t r = 0; r < nq; ++r) qpos[r] = int32_t(25 + r);
  // Probabilities via the reference attention with one-hot values (output[0] = p_t).
  std::vector<double> probs(nq * n);
  for (size_t r = 0; r < nq; ++r) {
    const std::vector<float> qr(&q[r * dim], &q[(r + 1) * dim]);
    for (size_t t = 0; t < n; ++t) {
      std::vector<float> onehot(n * dim, 0.0f);
      onehot[t * dim] = 1.0f;
      probs[r * n + t] = reference_attention(qr, {qpos[r]}, k, onehot, pos, dim, 0.5)[0];
    }
  }
  std::vector<float> acc(n);
  smallkv_accumulated_attention(q.data(), qpos.data(), nq, k.data(), pos.data(), n, dim, 0.5f, acc.data());
  for (size_t t = 0; t < n; ++t) {
    double want = 0;
    for (size_t r = 0; r < nq; ++r) want += probs[r * n + t];
    EXPECT_NEAR(acc[t], want, 1e-6) << t;
    if (pos[t] > qpos.back()) EXPECT_EQ(acc[t], 0.0f);
  }
  const std::vector<int32_t> wanted = {0, 7, 29, 100, 12};
  std::vector<float> w(nq * wanted.size());
  smallkv_proxy_weights(q.data(), qpos.data(), nq, k.data(), pos.data(), n, dim, 0.5f,
                        wanted.data(), wanted.size(), w.data());
  for (size_t r = 0; r < nq; ++r) {
    for (size_t j = 0; j < wanted.size(); ++j) {
      const double want = wanted[j] >= int32_t(n) ? 0.0 : probs[r * n + (n - 1 - size_t(wanted[j]))];
      EXPECT_NEAR(w[r * wanted.size() + j], want, 1e-6) << r << "," << j;
    }
  }
}

}  // namespace
