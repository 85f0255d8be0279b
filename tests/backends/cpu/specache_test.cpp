// SpeCache (docs/papers.md): group-averaged top-k selection against a naive reference, attention
// with fetched rows substituted, and k = all tokens equal to exact attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstring>
#include <random>

#include "attention.h"
#include "kivi_attention.h"
#include "reference_attention.h"
#include "smallkv.h"
#include "specache.h"
#include "specache_attention.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

struct Fixture {
  static constexpr size_t dim = 64, group = 4, n = 500;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  KiviHeadStore lowbit;
  SpeCacheBackingStore backing;
  std::vector<float> q;
  explicit Fixture(uint32_t bits) : lowbit(dim, KiviConfig{bits, 32, 64}) {
    k = normal_rows(n * dim, 1);
    v = normal_rows(n * dim, 2);
    for (size_t t = 0; t < n; t += 37) {  // a few keys the queries attend to strongly
      for (size_t d = 0; d < dim; ++d) k[t * dim + d] = 3.0f * float((d * 7 + t) % 5) - 6.0f;
    }
    pos.resize(n);
    std::iota(pos.begin(), pos.end(), 0);
    lowbit.append(k.data(), v.data(), pos.data(), n);
    backing = SpeCacheBackingStore(dim);
    backing.append(k.data(), v.data(), n);
    q = normal_rows(group * dim, 3, 0.5f);
    for (size_t h = 0; h < group; ++h)
      for (size_t d = 0; d < dim; ++d) q[h * dim + d] += 0.2f * (float((d * 7) % 5) - 2.0f);
  }
};

TEST(SpeCache, AllTokensFetchedEqualsExactAttention) {
  for (uint32_t bits : {1u, 2u}) {
    Fixture f(bits);
    std::vector<uint32_t> all(f.n);
    std::iota(all.begin(), all.end(), 0u);
    const std::vector<uint32_t> top = specache_select(f.lowbit, f.q.data(), f.group, INT32_MAX, 0.125f, f.n);
    EXPECT_EQ(top, all);
    const SpeCacheFetched fetched = specache_fetch(f.backing, top);
    const std::vector<int32_t> qpos(f.group, INT32_MAX);
    OnlineAttention attn(f.q.data(), qpos.data(), f.group, f.dim, 0.125f);
    specache_attend(f.lowbit, fetched, attn);
    std::vector<float> out(f.group * f.dim);
    attn.finish(out.data());
    // The backing store holds f16: exact attention is over the f16 rows.
    const auto want = reference_attention(f.q, qpos, f16_rounded(f.k), f16_rounded(f.v), f.pos, f.dim, 0.125);
    EXPECT_LT(relative_error(out, want), 2e-6) << bits;
  }
}

TEST(SpeCache, NothingFetchedIsPlainLowBitAttention) {
  Fixture f(2);
  const std::vector<int32_t> qpos(f.group, 300);
  OnlineAttention a(f.q.data(), qpos.data(), f.group, f.dim, 0.125f);
  OnlineAttention b(f.q.data(), qpos.data(), f.group, f.dim, 0.125f);
  specache_attend(f.lowbit, SpeCacheFetched{}, a);
  kivi_attend(f.lowbit, b);
  std::vector<float> oa(f.group * f.dim), ob(f.group * f.dim);
  a.finish(oa.data());
  b.finish(ob.data());
  EXPECT_EQ(oa, ob);
}

TEST(SpeCache, SelectionIsGroupAveragedTopKOverLowBitKeys) {
  Fixture f(1);
  const int32_t qp = 450;
  const size_t k = 25;
  std::vector<float> avg;
  const std::vector<uint32_t> top = specache_select(f.lowbit, f.q.data(), f.group, qp, 0.125f, k, &avg);
  // Reference: softmax per head (double) over the dequantized keys visible at qp, averaged.
  std::vector<float> kd(f.n * f.dim), vd(f.n * f.dim);
  f.lowbit.read_rows(0, f.n, kd.data(), vd.data());
  std::vector<double> ref(f.n, 0.0);
  for (size_t h = 0; h < f.group; ++h) {
    std::vector<double> s(f.n, 0.0);
    double mx = -1e300, z = 0;
    for (size_t t = 0; t <= size_t(qp); ++t) {
      double d = 0;
      for (size_t x = 0; x < f.dim; ++x) d += double(f.q[h * f.dim + x]) * kd[t * f.dim + x];
      s[t] = d * 0.125;
      mx = std::max(mx, s[t]);
    }
    for (size_t t = 0; t <= size_t(qp); ++t) z += (s[t] = std::exp(s[t] - mx));
    for (size_t t = 0; t <= size_t(qp); ++t) ref[t] += s[t] / z / double(f.group);
  }
  for (size_t t = 0; t < f.n; ++t) EXPECT_NEAR(avg[t], ref[t], 1e-6) << t;
  std::vector<uint32_t> order(f.n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return ref[a] > ref[b]; });
  std::vector<uint32_t> want(order.begin(), order.begin() + k);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(top, want);
  for (uint32_t t : top) EXPECT_LE(f.pos[t], qp);
  const double hit = specache_hit_rate(avg, top);
  EXPECT_GT(hit, double(k) / double(qp + 1));  // better than a uniform guess
  EXPECT_LE(hit, 1.0 + 1e-9);
}

TEST(SpeCache, FetchedRowsReplaceTheirLowBitRows) {
  Fixture f(2);
  const std::vector<uint32_t> fetched_tokens = {0, 5, 255, 256, 257, 499};
  const SpeCacheFetched fetched = specache_fetch(f.backing, fetched_tokens);
  EXPECT_EQ(fetched.bytes(), 4 * 6 + 2 * 2 * 6 * f.dim);
  const std::vector<int32_t> qpos = {INT32_MAX, 256, 499, 10};
  OnlineAttention attn(f.q.data(), qpos.data(), f.group, f.dim, 0.125f);
  specache_attend(f.lowbit, fetched, attn);
  std::vector<float> out(f.group * f.dim);
  attn.finish(out.data());
  std::vector<float> kr(f.n * f.dim), vr(f.n * f.dim);
  f.lowbit.read_rows(0, f.n, kr.data(), vr.data());
  for (uint32_t t : fetched_tokens) {
    for (size_t d = 0; d < f.dim; ++d) {
      kr[t * f.dim + d] = kvsdk::f16_to_f32(f.backing.key_row(t)[d]);
      vr[t * f.dim + d] = kvsdk::f16_to_f32(f.backing.value_row(t)[d]);
    }
  }
  EXPECT_LT(relative_error(out, reference_attention(f.q, qpos, kr, vr, f.pos, f.dim, 0.125)), 2e-6);
}

TEST(SpeCache, FetchRejectsBadTokenLists) {
  Fixture f(2);
  EXPECT_THROW(specache_fetch(f.backing, {1, 500}), kvsdk::Error);
  EXPECT_THROW(specache_fetch(f.backing, {3, 2}), kvsdk::Error);
  const size_t rows = (f.n + SpeCacheBackingStore::kBlockTokens - 1) /
                      SpeCacheBackingStore::kBlockTokens * SpeCacheBackingStore::kBlockTokens;
  EXPECT_EQ(f.backing.bytes(), 2 * 2 * rows * f.dim);  // whole blocks, unchanged by the refusals
}

}  // namespace

namespace {

// A decode step: attend with the previous fetch, then prefetch for the next step.
TEST(SpeCacheHead, DecodeStepsFetchForTheNextStep) {
  const size_t dim = 32, group = 2, n = 300;
  SpeCacheHead head(dim, KiviConfig{1, 32, 32});
  const std::vector<float> k = normal_rows(n * dim, 81), v = normal_rows(n * dim, 82);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  head.append(k.data(), v.data(), pos.data(), n);
  // Whole blocks of kBlockTokens rows (keys and values, f16) are allocated.
  const size_t blocks = (n + SpeCacheBackingStore::kBlockTokens - 1) / SpeCacheBackingStore::kBlockTokens;
  EXPECT_EQ(head.backing_bytes(), 2 * 2 * blocks * SpeCacheBackingStore::kBlockTokens * dim);
  EXPECT_EQ(head.budget_bytes(), head.lowbit().bytes().total());  // nothing fetched yet
  const std::vector<float> q = normal_rows(group * dim, 83, 0.7f);
  const std::vector<int32_t> qpos(group, INT32_MAX);

  // Pre-decoding: the speculative query equals the real one, all tokens fetched: exact attention
  // and a hit rate of 1.
  head.prefetch(q.data(), group, INT32_MAX, 0.2f, n);
  EXPECT_NEAR(head.hit_rate(q.data(), group, INT32_MAX, 0.2f), 1.0, 1e-6);
  OnlineAttention attn(q.data(), qpos.data(), group, dim, 0.2f);
  head.attend(attn);
  std::vector<float> out(group * dim);
  attn.finish(out.data());
  EXPECT_LT(relative_error(out, reference_attention(q, qpos, f16_rounded(k), f16_rounded(v), pos, dim, 0.2)), 2e-6);
  EXPECT_EQ(head.budget_bytes(), head.lowbit().bytes().total() + head.fetched().bytes());

  // A new token arrives; a small fetch guessed by the same query covers more attention than a
  // fetch guessed by an unrelated query.
  const std::vector<float> k1 = normal_rows(dim, 84), v1 = normal_rows(dim, 85);
  const int32_t p1 = int32_t(n);
  head.append(k1.data(), v1.data(), &p1, 1);
  head.prefetch(q.data(), group, INT32_MAX, 0.2f, 15);
  const double good = head.hit_rate(q.data(), group, INT32_MAX, 0.2f);
  const std::vector<float> other = normal_rows(group * dim, 86, 0.7f);
  head.prefetch(other.data(), group, INT32_MAX, 0.2f, 15);
  const double bad = head.hit_rate(q.data(), group, INT32_MAX, 0.2f);
  EXPECT_GT(good, bad);
  EXPECT_EQ(head.fetched().tokens.size(), 15u);
}

}  // namespace

namespace {

// An empty store selects nothing (and reads no row), so a prefetch before any append is a no-op.
TEST(SpeCache, SelectionOnAnEmptyStoreIsEmpty) {
  KiviHeadStore empty(16, KiviConfig{2, 8, 8});
  const std::vector<float> q = normal_rows(2 * 16, 5);
  std::vector<float> probs = {1.0f};
  EXPECT_TRUE(specache_select(empty, q.data(), 2, INT32_MAX, 0.25f, 4, &probs).empty());
  EXPECT_TRUE(probs.empty());
  SpeCacheHead head(16, KiviConfig{2, 8, 8});
  head.prefetch(q.data(), 2, INT32_MAX, 0.25f, 4);
  EXPECT_TRUE(head.fetched().tokens.empty());
}

}  // namespace

namespace {

// specache_topk (the optimized selection's top-k) picks exactly smallkv_topk's tokens: the k
// highest, NaN lowest, ties to the lower index. Scores drawn from a few values force ties at
// the k-th place; every k from 0 to past n.
TEST(SpeCache, TopKIsSmallKvTopK) {
  std::mt19937 rng(7);
  SpeCacheSelectScratch scratch;
  std::vector<uint32_t> got;
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 300;
    const int levels = 1 + int(rng() % 12);
    std::vector<float> s(n);
    for (float& x : s) {
      const uint32_t r = rng() % 64;
      x = r == 0 ? std::nanf("") : r == 1 ? -0.0f : r == 2 ? 0.0f : float(int(rng() % levels) - 3);
    }
    for (size_t k : {size_t(0), size_t(1), size_t(rng() % (n + 1)), n - 1, n, n + 3}) {
      specache_topk(s.data(), n, k, scratch, got);
      EXPECT_EQ(got, smallkv_topk(s.data(), n, k)) << "n " << n << " k " << k;
    }
  }
}

}  // namespace

namespace {

// The optimized passes' low-bit scores: specache_scores_fast (the selection's route) gives the
// bits specache_attend_fast hands out (the decode step's route), whatever rows were fetched, so
// both routes select the same rows; and both are the dequantized keys' scores (the reference's)
// up to the fused kernel's integer query codes (fast_attention.h: each term off by 2^-15 of the
// largest; bounded here at 1e-3 of the row's largest |score|). 1, 2 and 4 bits, ragged stores
// (retain() dropped quantized tokens), causal rows and a row that sees everything.
TEST(SpeCache, FastScoresAreTheAttentionsScores) {
  struct Shape {
    size_t dim, group;
    uint32_t bits;
  };
  SpeCacheSelectScratch scratch;
  fast::Scratch kernel;
  for (const Shape& sh : {Shape{64, 32, 2}, Shape{64, 32, 1}, Shape{48, 16, 2}, Shape{128, 64, 4},
                          Shape{40, 8, 2}}) {
    for (bool ragged : {false, true}) {
      const size_t n = 300, dim = sh.dim, rows = 3;
      KiviHeadStore s(dim, KiviConfig{sh.bits, uint32_t(sh.group), 20});
      const std::vector<float> k = normal_rows(n * dim, 11), v = normal_rows(n * dim, 12);
      std::vector<int32_t> pos(n);
      std::iota(pos.begin(), pos.end(), 0);
      s.append(k.data(), v.data(), pos.data(), n);
      if (ragged) {
        std::vector<uint32_t> keep;
        for (uint32_t t = 0; t < n; ++t) {
          if (t % 7 != 3) keep.push_back(t);
        }
        s.retain(keep);
        ASSERT_TRUE(s.ragged());
      }
      const size_t m = s.size();
      const std::vector<float> q = normal_rows(rows * dim, 13);
      const int32_t qpos[rows] = {INT32_MAX, 150, 299};
      const fast::Queries fq{q.data(), qpos, rows, dim, 0.125f};
      std::vector<float> alone(rows * m, NAN), tapped(rows * m, NAN), out(rows * dim);
      specache_scores_fast(fq, s, scratch, kernel, alone.data());
      SpeCacheFetched fetched;  // every 9th token, any row contents
      for (uint32_t t = 2; t < m; t += 9) {
        fetched.tokens.push_back(t);
        fetched.k.insert(fetched.k.end(), dim, uint16_t(0x3c00));
        fetched.v.insert(fetched.v.end(), dim, uint16_t(0xc000));
      }
      specache_attend_fast(fq, s, fetched, scratch, kernel, out.data(), tapped.data());
      const std::string what = "dim " + std::to_string(dim) + " bits " +
                               std::to_string(sh.bits) + (ragged ? " ragged" : "");
      ASSERT_EQ(0, std::memcmp(alone.data(), tapped.data(), alone.size() * 4)) << what;
      std::vector<float> kr(m * dim), want(rows * m);
      s.read_rows(0, m, kr.data(), nullptr);
      specache_score_chunk(q.data(), qpos, rows, kr.data(), s.positions().data(), m, dim, 0.125f,
                           want.data(), m);  // the reference's scores
      for (size_t r = 0; r < rows; ++r) {
        float largest = 0.0f;
        for (size_t t = 0; t < m; ++t) {
          if (std::isfinite(want[r * m + t])) largest = std::max(largest, std::fabs(want[r * m + t]));
        }
        for (size_t t = 0; t < m; ++t) {
          const float g = alone[r * m + t];
          if (std::isinf(want[r * m + t])) {
            ASSERT_EQ(g, want[r * m + t]) << what << " row " << r << " token " << t;
          } else {
            ASSERT_NEAR(g, want[r * m + t], 1e-3f * largest) << what << " row " << r << " token " << t;
          }
        }
      }
    }
  }
}

}  // namespace
