// Importance signals against straightforward references written here: window scores (causal,
// f32 softmax, summed over queries), GQA averaging over the group, H2O accumulation, pooling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/geometry.h"
#include "policy/importance.h"
#include "test_util.h"

using namespace kvsdk;

namespace {

Geometry geom(uint32_t qh, uint32_t kvh, uint32_t dim) {
  Geometry g;
  g.n_layers = 1;
  g.n_q_heads = qh;
  g.n_kv_heads = kvh;
  g.head_dim = dim;
  g.attn_scale = 1.0f / std::sqrt(float(dim));
  return g;
}

// Reference: for each query i and each head of the group, softmax over visible keys (double),
// summed over queries, averaged over the group.
std::vector<double> reference_scores(const std::vector<float>& q, const std::vector<int32_t>& qpos,
                                     const std::vector<float>& k, const std::vector<int32_t>& kpos,
                                     const Geometry& g, uint32_t kv_head) {
  const size_t nq = qpos.size(), nk = kpos.size(), dim = g.head_dim;
  const uint32_t group = g.group_size();
  std::vector<double> out(nk, 0.0);
  for (size_t i = 0; i < nq; ++i) {
    for (uint32_t j = 0; j < group; ++j) {
      const size_t h = kv_head * group + j;
      std::vector<double> logit(nk, -INFINITY);
      double m = -INFINITY;
      for (size_t t = 0; t < nk; ++t) {
        if (kpos[t] > qpos[i]) continue;
        double d = 0;
        for (size_t c = 0; c < dim; ++c) d += double(q[(i * g.n_q_heads + h) * dim + c]) * k[t * dim + c];
        logit[t] = d * g.attn_scale;
        m = std::max(m, logit[t]);
      }
      if (m == -INFINITY) continue;
      double sum = 0;
      for (size_t t = 0; t < nk; ++t) sum += std::isinf(logit[t]) ? 0 : std::exp(logit[t] - m);
      for (size_t t = 0; t < nk; ++t) {
        if (!std::isinf(logit[t])) out[t] += std::exp(logit[t] - m) / sum / group;
      }
    }
  }
  return out;
}

TEST(Importance, WindowScoresMatchReferenceWithGqaAndCausality) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const uint32_t kvh = 1 + rng() % 3, group = 1 + rng() % 4, dim = 4 + rng() % 13;
    const Geometry g = geom(kvh * group, kvh, dim);
    const size_t nk = 1 + rng() % 300, nq = 1 + rng() % 9;
    auto q = kvsdk_test::random_floats(nq * g.q_elems_per_token(), rng(), 2.0f);
    auto k = kvsdk_test::random_floats(nk * dim, rng(), 2.0f);
    std::vector<int32_t> kpos(nk), qpos(nq);
    for (size_t t = 0; t < nk; ++t) kpos[t] = int32_t(t);
    // Queries inside the tail of the sequence: causal inside the window; one sees all.
    for (size_t i = 0; i < nq; ++i) qpos[i] = int32_t(nk) - int32_t(nq) + int32_t(i);
    if (trial % 3 == 0) qpos[0] = std::numeric_limits<int32_t>::max();
    for (uint32_t h = 0; h < kvh; ++h) {
      // The per-KV-head key slice of a [nk][dim] buffer (one head's rows).
      auto load = [&](size_t first, size_t n, float* dst) {
        std::copy_n(k.data() + first * dim, n * dim, dst);
      };
      const policy::QueryBlock qb{q.data(), qpos.data(), nq};
      const std::vector<float> got = policy::window_scores(qb, g, h, load, kpos.data(), nk);
      const std::vector<double> want = reference_scores(q, qpos, k, kpos, g, h);
      ASSERT_EQ(got.size(), nk);
      for (size_t t = 0; t < nk; ++t) ASSERT_NEAR(got[t], want[t], 1e-4) << trial << " " << t;
    }
  }
}

TEST(Importance, H2oAccumulatesAcrossCalls) {
  std::mt19937 rng(3);
  const Geometry g = geom(4, 2, 8);
  const size_t nk = 50;
  auto k = kvsdk_test::random_floats(nk * 8, 11);
  std::vector<int32_t> kpos(nk);
  for (size_t t = 0; t < nk; ++t) kpos[t] = int32_t(t);
  auto load = [&](size_t first, size_t n, float* dst) { std::copy_n(k.data() + first * 8, n * 8, dst); };
  std::vector<float> acc(nk, 0.0f);
  std::vector<double> want(nk, 0.0);
  for (int step = 0; step < 5; ++step) {
    auto q = kvsdk_test::random_floats(g.q_elems_per_token(), 100 + step);
    std::vector<int32_t> qpos{int32_t(10 * step + 5)};
    policy::h2o_accumulate(policy::QueryBlock{q.data(), qpos.data(), 1}, g, 1, load, kpos.data(),
                           nk, acc.data());
    const auto r = reference_scores(q, qpos, k, kpos, g, 1);
    for (size_t t = 0; t < nk; ++t) want[t] += r[t];
  }
  for (size_t t = 0; t < nk; ++t) EXPECT_NEAR(acc[t], want[t], 1e-5);
  // Causality: keys after the last query never gained mass.
  for (size_t t = 46; t < nk; ++t) EXPECT_EQ(acc[t], 0.0f);
}

TEST(Importance, PoolingMatchesReference) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 40;
    const int kernel = 1 + 2 * int(rng() % 5);
    auto in = kvsdk_test::random_floats(n, rng());
    for (int kind : {KVSDK_POOL_MAX, KVSDK_POOL_AVG}) {
      std::vector<float> out(n);
      policy::pool_scores(in.data(), n, kernel, kvsdk_pool_kind(kind), out.data());
      for (size_t t = 0; t < n; ++t) {
        double m = -INFINITY, s = 0;
        for (int d = -kernel / 2; d <= kernel / 2; ++d) {
          const long i = long(t) + d;
          if (i < 0 || i >= long(n)) continue;  // zero padding: adds nothing, never the max
          m = std::max(m, double(in[i]));
          s += in[i];
        }
        const double want = kind == KVSDK_POOL_MAX ? m : s / kernel;
        ASSERT_NEAR(out[t], want, 1e-5);
      }
    }
  }
}

}  // namespace
