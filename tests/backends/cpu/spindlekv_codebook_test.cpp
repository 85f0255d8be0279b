// SpindleKV codebook (SpindleKV (docs/papers.md) Algorithm 1) against a naive dense-graph
// reference; coverage, reconstruction, decode-time joining, and the pre-RoPE key store.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention.h"
#include "fast_attention.h"  // available_targets / force_target
#include "reference_attention.h"
#include "rope.h"
#include "spindlekv_codebook.h"
#include "spindlekv_entry_dots.h"
#include "spindlekv_store.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

double cosine(const float* a, const float* b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

double norm(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

// `clusters` random directions; each row = a direction + small noise, scaled by a random norm.
std::vector<float> clustered_rows(size_t n, size_t dim, size_t clusters, float noise, uint32_t seed) {
  const std::vector<float> centers = normal_rows(clusters * dim, seed);
  const std::vector<float> jitter = normal_rows(n * dim, seed + 1, noise);
  const std::vector<float> scales = normal_rows(n, seed + 2, 0.3f);
  std::vector<float> x(n * dim);
  for (size_t t = 0; t < n; ++t) {
    const size_t c = (t * 7919) % clusters;
    for (size_t d = 0; d < dim; ++d) {
      x[t * dim + d] = (centers[c * dim + d] + jitter[t * dim + d]) * (1.5f + scales[t]);
    }
  }
  return x;
}

std::vector<float> entry(const SpindleCodebook& cb, size_t e) {
  std::vector<float> c(cb.dim());
  for (size_t d = 0; d < cb.dim(); ++d) c[d] = kvsdk::f16_to_f32(cb.entry_data()[e * cb.dim() + d]);
  return c;
}

// Algorithm 1 written out with a dense graph and degrees recomputed each round. Candidates are the
// rows' f16-rounded directions (what the codebook stores).
struct RefCodebook {
  std::vector<size_t> entry_rows;  // row whose direction became entry e
  std::vector<size_t> index;
};
RefCodebook reference_algorithm1(const std::vector<float>& x, size_t n, size_t dim, float theta) {
  std::vector<float> cand(n * dim);
  for (size_t t = 0; t < n; ++t) {
    const double nt = norm(&x[t * dim], dim);
    for (size_t d = 0; d < dim; ++d) {
      cand[t * dim + d] = kvsdk::f16_to_f32(kvsdk::f32_to_f16(float(x[t * dim + d] / nt)));
    }
  }
  std::vector<std::vector<char>> G(n, std::vector<char>(n));
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) G[a][b] = cosine(&x[a * dim], &cand[b * dim], dim) > theta;
  std::vector<char> alive(n, 1);
  RefCodebook r;
  r.index.assign(n, SIZE_MAX);
  for (;;) {
    size_t best = SIZE_MAX, best_deg = 0;
    for (size_t b = 0; b < n; ++b) {
      if (!alive[b]) continue;
      size_t deg = 0;
      for (size_t a = 0; a < n; ++a) deg += alive[a] && G[a][b];
      if (best == SIZE_MAX || deg > best_deg) {
        best = b;
        best_deg = deg;
      }
    }
    if (best == SIZE_MAX) break;
    for (size_t a = 0; a < n; ++a) {
      if (alive[a] && G[a][best]) {
        r.index[a] = r.entry_rows.size();
        alive[a] = 0;
      }
    }
    r.entry_rows.push_back(best);
  }
  return r;
}

TEST(SpindleCodebook, GreedyConstructionMatchesReferenceAlgorithm1) {
  const size_t n = 120, dim = 32;
  for (float theta : {kSpindleThetaK, kSpindleThetaV, 0.8f}) {
    const std::vector<float> x = clustered_rows(n, dim, 9, 0.08f, 17);
    SpindleCodebook cb(dim, theta);
    cb.append(x.data(), n);
    const RefCodebook ref = reference_algorithm1(x, n, dim, theta);
    ASSERT_EQ(cb.entries(), ref.entry_rows.size()) << theta;
    for (size_t t = 0; t < n; ++t) EXPECT_EQ(cb.index()[t], ref.index[t]) << "row " << t;
    for (size_t e = 0; e < cb.entries(); ++e) {
      const std::vector<float> c = entry(cb, e);
      EXPECT_GT(cosine(c.data(), &x[ref.entry_rows[e] * dim], dim), 0.9999);
    }
  }
}

TEST(SpindleCodebook, EveryRowIsCoveredAndReconstructedWithItsNorm) {
  const size_t n = 400, dim = 64;
  for (float theta : {kSpindleThetaK, kSpindleThetaV}) {
    // Tight clusters (compressible) and plain Gaussian rows (one entry per row, mostly).
    for (float noise : {0.05f, 3.0f}) {
      const std::vector<float> x = clustered_rows(n, dim, 12, noise, 23);
      SpindleCodebook cb(dim, theta);
      cb.append(x.data(), n);
      ASSERT_EQ(cb.size(), n);
      std::vector<float> r(n * dim);
      cb.reconstruct(0, n, r.data());
      for (size_t t = 0; t < n; ++t) {
        const std::vector<float> c = entry(cb, cb.index()[t]);
        EXPECT_GT(cosine(&x[t * dim], c.data(), dim), double(theta) - 1e-6) << "row " << t;
        // Eq. 14: C[r] · m, with the row's own norm.
        for (size_t d = 0; d < dim; ++d) EXPECT_EQ(r[t * dim + d], c[d] * cb.magnitude()[t]);
        EXPECT_NEAR(norm(&r[t * dim], dim), norm(&x[t * dim], dim), 1e-5 * norm(&x[t * dim], dim));
      }
      if (noise < 1.0f) EXPECT_LE(cb.entries(), 40u) << "tight clusters must share entries";
      EXPECT_EQ(cb.bytes(), 2 * cb.entries() * dim + 8 * n);
    }
  }
}

TEST(SpindleCodebook, DecodeRowsJoinAnEntryAboveThetaOrExtendTheCodebook) {
  const size_t dim = 32, n = 60;
  const std::vector<float> x = clustered_rows(n, dim, 4, 0.05f, 31);
  SpindleCodebook cb(dim, kSpindleThetaV);
  cb.append(x.data(), n);
  const size_t before = cb.entries();
  const std::vector<uint16_t> entries_before = cb.entry_data();
  // A scaled copy of row 5 has the same direction: it joins row 5's entry.
  std::vector<float> y(&x[5 * dim], &x[6 * dim]);
  for (float& f : y) f *= -2.0f;  // opposite direction: must not join
  std::vector<float> same(&x[5 * dim], &x[6 * dim]);
  for (float& f : same) f *= 3.0f;
  cb.append(same.data(), 1);
  EXPECT_EQ(cb.entries(), before);
  EXPECT_EQ(cb.index()[n], cb.index()[5]);
  EXPECT_EQ(cb.entry_data(), entries_before);
  cb.append(y.data(), 1);
  EXPECT_EQ(cb.entries(), before + 1);
  EXPECT_EQ(cb.index()[n + 1], before);
  // Several new rows at once: the ones that do not join build new entries greedily.
  const std::vector<float> fresh = clustered_rows(10, dim, 2, 0.01f, 99);
  cb.append(fresh.data(), 10);
  EXPECT_EQ(cb.entries(), before + 3);
  for (size_t t = 0; t < cb.size(); ++t) {
    const std::vector<float> c = entry(cb, cb.index()[t]);
    const float* row = t < n ? &x[t * dim] : t == n ? same.data() : t == n + 1 ? y.data()
                                                                             : &fresh[(t - n - 2) * dim];
    EXPECT_GT(cosine(row, c.data(), dim), double(kSpindleThetaV) - 1e-6) << t;
  }
}

TEST(SpindleCodebook, ZeroRowsReconstructToZero) {
  const size_t dim = 8;
  std::vector<float> x(3 * dim, 0.0f);
  for (size_t d = 0; d < dim; ++d) x[dim + d] = float(d) - 3.5f;
  SpindleCodebook cb(dim, 0.9f);
  cb.append(x.data(), 3);
  std::vector<float> r(3 * dim);
  cb.reconstruct(0, 3, r.data());
  for (size_t d = 0; d < dim; ++d) {
    EXPECT_EQ(r[d], 0.0f);
    EXPECT_EQ(r[2 * dim + d], 0.0f);
  }
  std::vector<float> only_zero(dim, 0.0f);
  SpindleCodebook z(dim, 0.9f);
  z.append(only_zero.data(), 1);
  z.reconstruct(0, 1, r.data());
  for (size_t d = 0; d < dim; ++d) EXPECT_EQ(r[d], 0.0f);
}

TEST(SpindleCodebook, RejectsBadArguments) {
  EXPECT_THROW(SpindleCodebook(0, 0.9f), kvsdk::Error);
  EXPECT_THROW(SpindleCodebook(8, 1.0f), kvsdk::Error);
  EXPECT_THROW(SpindleCodebook(8, -1.0f), kvsdk::Error);
}

// Keys that differ only by RoPE (same pre-RoPE direction at different positions) share one entry,
// and reconstruction re-applies the rotation of each token's position.
TEST(SpindleHeadStore, KeysAreGroupedBeforeRopeAndRotatedBackOnRead) {
  const size_t dim = 64, n = 200;
  for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF}) {
    const std::vector<float> pre = clustered_rows(n, dim, 5, 0.03f, 41);
    std::vector<float> k = pre;
    std::vector<int32_t> pos(n);
    const Rope rope(dim, 10000.0f, style);
    for (size_t t = 0; t < n; ++t) {
      pos[t] = int32_t(3 * t + 1);
      rope.apply(&k[t * dim], pos[t]);
    }
    const std::vector<float> v = clustered_rows(n, dim, 7, 0.05f, 43);
    SpindleHeadStore s(dim, 10000.0f, style);
    s.append(k.data(), v.data(), pos.data(), n);
    EXPECT_LE(s.keys().entries(), 15u) << "post-RoPE keys would not cluster";
    std::vector<float> kr(n * dim), vr(n * dim);
    s.read_rows(0, n, kr.data(), vr.data());
    for (size_t t = 0; t < n; ++t) {
      EXPECT_GT(cosine(&kr[t * dim], &k[t * dim], dim), kSpindleThetaK - 1e-5) << t;
      EXPECT_GT(cosine(&vr[t * dim], &v[t * dim], dim), kSpindleThetaV - 1e-5) << t;
    }
    const SpindleBytes b = s.bytes();
    EXPECT_EQ(b.total(), s.keys().bytes() + s.values().bytes() + 4 * n);

    // Attention over the store equals dense attention over its reconstructed rows.
    const std::vector<float> q = normal_rows(2 * dim, 47, 0.3f);
    const std::vector<int32_t> qpos = {INT32_MAX, 300};
    const float scale = 0.125f;
    OnlineAttention attn(q.data(), qpos.data(), 2, dim, scale);
    spindlekv_attend(s, attn);
    std::vector<float> out(2 * dim);
    attn.finish(out.data());
    EXPECT_LT(relative_error(out, reference_attention(q, qpos, kr, vr, pos, dim, scale)), 2e-6);
  }
}

}  // namespace

namespace {

// A prefill longer than one block is encoded block by block: still every row covered, and the
// same result as appending the blocks one by one.
TEST(SpindleHeadStore, LongPrefillIsEncodedInBlocks) {
  const size_t dim = 16, n = kSpindlePrefillBlock + 300;
  const std::vector<float> k = clustered_rows(n, dim, 6, 0.02f, 51), v = clustered_rows(n, dim, 6, 0.02f, 52);
  std::vector<int32_t> pos(n);
  for (size_t t = 0; t < n; ++t) pos[t] = int32_t(t);
  SpindleHeadStore whole(dim, 10000.0f, KVSDK_ROPE_NONE), parts(dim, 10000.0f, KVSDK_ROPE_NONE);
  whole.append(k.data(), v.data(), pos.data(), n);
  parts.append(k.data(), v.data(), pos.data(), kSpindlePrefillBlock);
  parts.append(&k[kSpindlePrefillBlock * dim], &v[kSpindlePrefillBlock * dim], &pos[kSpindlePrefillBlock], 300);
  EXPECT_EQ(whole.keys().index(), parts.keys().index());
  EXPECT_EQ(whole.values().entry_data(), parts.values().entry_data());
  EXPECT_LE(whole.keys().entries(), 30u);
  for (size_t t = 0; t < n; ++t) {
    const std::vector<float> c = entry(whole.keys(), whole.keys().index()[t]);
    EXPECT_GT(cosine(&k[t * dim], c.data(), dim), kSpindleThetaK - 1e-6) << t;
  }
}

}  // namespace

namespace {

TEST(SpindleCodebook, RestoredCodebookContinuesIdentically) {
  const size_t dim = 16, n = 80;
  const std::vector<float> x = clustered_rows(n, dim, 5, 0.05f, 91);
  SpindleCodebook a(dim, kSpindleThetaV);
  a.append(x.data(), 50);
  SpindleCodebook b = SpindleCodebook::restore(dim, kSpindleThetaV, a.entry_data(), a.index(), a.magnitude());
  a.append(&x[50 * dim], n - 50);
  b.append(&x[50 * dim], n - 50);
  EXPECT_EQ(a.entry_data(), b.entry_data());
  EXPECT_EQ(a.index(), b.index());
  EXPECT_EQ(a.magnitude(), b.magnitude());
  // Corrupt buffers are rejected with KVSDK_E_CORRUPT.
  std::vector<uint32_t> bad = a.index();
  bad[3] = uint32_t(a.entries());
  EXPECT_THROW(SpindleCodebook::restore(dim, kSpindleThetaV, a.entry_data(), bad, a.magnitude()), kvsdk::Error);
  std::vector<uint16_t> short_entries(a.entry_data().begin(), a.entry_data().end() - 1);
  EXPECT_THROW(SpindleCodebook::restore(dim, kSpindleThetaV, short_entries, a.index(), a.magnitude()), kvsdk::Error);
  EXPECT_THROW(SpindleCodebook::restore(dim, kSpindleThetaV, {}, {0}, {1.0f}), kvsdk::Error);
}

}  // namespace

namespace {

// A store rebuilt from its codebooks and positions reads identically and keeps encoding new
// tokens identically; inconsistent buffers are refused with KVSDK_E_CORRUPT.
TEST(SpindleHeadStore, RestoredStoreContinuesIdentically) {
  const size_t dim = 32, n = 120;
  const std::vector<float> k = clustered_rows(n, dim, 5, 0.03f, 61);
  const std::vector<float> v = clustered_rows(n, dim, 6, 0.05f, 62);
  std::vector<int32_t> pos(n);
  for (size_t t = 0; t < n; ++t) pos[t] = int32_t(t);
  SpindleHeadStore a(dim, 10000.0f, KVSDK_ROPE_HALF);
  a.append(k.data(), v.data(), pos.data(), 70);
  auto copy = [&](const SpindleCodebook& c, float theta) {
    return SpindleCodebook::restore(dim, theta, c.entry_data(), c.index(), c.magnitude());
  };
  SpindleHeadStore b = SpindleHeadStore::restore(dim, 10000.0f, KVSDK_ROPE_HALF,
                                                 copy(a.keys(), kSpindleThetaK),
                                                 copy(a.values(), kSpindleThetaV), a.positions());
  a.append(&k[70 * dim], &v[70 * dim], &pos[70], n - 70);
  b.append(&k[70 * dim], &v[70 * dim], &pos[70], n - 70);
  std::vector<float> ka(n * dim), va(n * dim), kb(n * dim), vb(n * dim);
  a.read_rows(0, n, ka.data(), va.data());
  b.read_rows(0, n, kb.data(), vb.data());
  EXPECT_EQ(ka, kb);
  EXPECT_EQ(va, vb);
  EXPECT_EQ(a.bytes().total(), b.bytes().total());
  std::vector<int32_t> short_pos(a.positions().begin(), a.positions().end() - 1);
  try {
    SpindleHeadStore::restore(dim, 10000.0f, KVSDK_ROPE_HALF, copy(a.keys(), kSpindleThetaK),
                              copy(a.values(), kSpindleThetaV), short_pos);
    ADD_FAILURE() << "restore accepted one position too few";
  } catch (const kvsdk::Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_CORRUPT);
  }
  EXPECT_THROW(SpindleHeadStore::restore(dim + 1, 10000.0f, KVSDK_ROPE_HALF,
                                         copy(a.keys(), kSpindleThetaK),
                                         copy(a.values(), kSpindleThetaV), a.positions()),
               kvsdk::Error);
}

}  // namespace

namespace {

// The append's dot products over f16 entries (spindle_entry_dots, Highway SIMD) have dot_f32's
// bits on the converted rows, for every head dim (tails past a multiple of 4 included), every
// entry count (4, 2 and 1 entries per vector), with and without the squares, on every SIMD
// target this machine runs.
TEST(SpindleCodebook, EntryDotsHaveDotF32BitsOnEveryTarget) {
  const std::vector<kvsdk::cpu::fast::Target> targets = kvsdk::cpu::fast::available_targets();
  ASSERT_FALSE(targets.empty());
  for (const kvsdk::cpu::fast::Target& t : targets) {
    kvsdk::cpu::fast::force_target(t.bits);
    for (size_t dim : {size_t(1), size_t(3), size_t(4), size_t(7), size_t(40), size_t(64), size_t(128)}) {
      for (size_t n_e : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5), size_t(8), size_t(13)}) {
        const std::vector<float> x = normal_rows(dim, uint32_t(dim));
        const std::vector<float> raw = normal_rows(n_e * dim, uint32_t(dim + 100 * n_e + 1));
        std::vector<uint16_t> c(raw.size());
        std::vector<float> cf(raw.size());
        for (size_t i = 0; i < raw.size(); ++i) {
          c[i] = kvsdk::f32_to_f16(raw[i]);
          cf[i] = kvsdk::f16_to_f32(c[i]);
        }
        std::vector<float> dot(n_e, NAN), sq(n_e, NAN), dot_only(n_e, NAN);
        spindle_entry_dots(x.data(), c.data(), n_e, dim, dot.data(), sq.data());
        spindle_entry_dots(x.data(), c.data(), n_e, dim, dot_only.data(), nullptr);
        for (size_t e = 0; e < n_e; ++e) {
          const float want = dot_f32(x.data(), &cf[e * dim], dim);
          const float want_sq = dot_f32(&cf[e * dim], &cf[e * dim], dim);
          const std::string what = std::string(t.name) + " dim " + std::to_string(dim) +
                                   " entries " + std::to_string(n_e) + " entry " +
                                   std::to_string(e);
          EXPECT_EQ(std::memcmp(&dot[e], &want, 4), 0) << what << ": " << dot[e] << " vs " << want;
          EXPECT_EQ(std::memcmp(&sq[e], &want_sq, 4), 0) << what << " squares";
          EXPECT_EQ(std::memcmp(&dot_only[e], &want, 4), 0) << what << " without squares";
        }
      }
    }
  }
  kvsdk::cpu::fast::force_target(0);
}

}  // namespace
