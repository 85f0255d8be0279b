// The per-head KIVI store (residual window, block flushes, byte accounting) and attention over it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "kivi_attention.h"
#include "kivi_quant.h"
#include "kivi_store.h"
#include "reference_attention.h"
#include "util/error.h"
#include "util/half.h"

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

namespace {

// Saved buffers restore a store that continues exactly like the original (bit-identical resume).
TEST(KiviStore, RestoredStoreContinuesBitIdentically) {
  const size_t dim = 32, n = 250;
  const KiviConfig cfg{2, 32, 64};
  const std::vector<float> k = normal_rows(n * dim, 71), v = normal_rows(n * dim, 72);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(i);
  KiviHeadStore a(dim, cfg);
  a.append(k.data(), v.data(), pos.data(), 170);
  KiviHeadStore b = KiviHeadStore::restore(dim, cfg, a.buffers());
  a.append(&k[170 * dim], &v[170 * dim], &pos[170], n - 170);
  b.append(&k[170 * dim], &v[170 * dim], &pos[170], n - 170);
  const KiviHeadBuffers ba = a.buffers(), bb = b.buffers();
  EXPECT_EQ(ba.quantized_tokens, bb.quantized_tokens);
  EXPECT_EQ(ba.key_codes, bb.key_codes);
  EXPECT_EQ(ba.value_codes, bb.value_codes);
  EXPECT_EQ(ba.key_scales, bb.key_scales);
  EXPECT_EQ(ba.value_zeros, bb.value_zeros);
  EXPECT_EQ(ba.residual_keys, bb.residual_keys);
  EXPECT_EQ(ba.positions, bb.positions);
  EXPECT_EQ(a.bytes().total(), b.bytes().total());
}

TEST(KiviStore, RestoreRejectsInconsistentBuffers) {
  const size_t dim = 16;
  const KiviConfig cfg{4, 8, 8};
  const std::vector<float> k = normal_rows(40 * dim, 73);
  std::vector<int32_t> pos(40, 0);
  KiviHeadStore a(dim, cfg);
  a.append(k.data(), k.data(), pos.data(), 40);
  const KiviHeadBuffers good = a.buffers();
  EXPECT_NO_THROW(KiviHeadStore::restore(dim, cfg, good));
  const auto corrupt = [&](auto mutate) {
    KiviHeadBuffers b = good;
    mutate(b);
    try {
      KiviHeadStore::restore(dim, cfg, b);
      return false;
    } catch (const kvsdk::Error& e) {
      return e.status() == KVSDK_E_CORRUPT;
    }
  };
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.quantized_tokens += 1; }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.quantized_tokens += 8; }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.key_codes.pop_back(); }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.value_scales.push_back(0); }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.residual_keys.clear(); }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.positions.push_back(1); }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& b) { b.key_zeros.resize(3); }));
}

}  // namespace

namespace {

TEST(KiviStore, ProjectedBytesMatchAppend) {
  const size_t dim = 24;
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    KiviHeadStore s(dim, KiviConfig{bits, 8, 12});
    const std::vector<float> k = normal_rows(200 * dim, 93);
    std::vector<int32_t> pos(200, 0);
    size_t t = 0;
    for (size_t n : {1u, 3u, 19u, 1u, 1u, 40u, 7u, 100u}) {
      const KiviBytes want = s.projected_bytes(n);
      s.append(&k[t * dim], &k[t * dim], &pos[t], n);
      t += n;
      const KiviBytes got = s.bytes();
      EXPECT_EQ(got.codes, want.codes);
      EXPECT_EQ(got.scales_zeros, want.scales_zeros);
      EXPECT_EQ(got.residual, want.residual);
      EXPECT_EQ(got.positions, want.positions);
    }
  }
}

}  // namespace

// retain(): eviction on top of KIVI without re-quantizing (compositions such as xkv+kivi2).
namespace {

std::vector<float> rows_of(const KiviHeadStore& s) {
  std::vector<float> k(s.size() * s.head_dim()), v(s.size() * s.head_dim());
  s.read_rows(0, s.size(), k.data(), v.data());
  k.insert(k.end(), v.begin(), v.end());
  return k;
}

// Keeps every index i < n for which keep(i) holds.
template <typename F>
std::vector<uint32_t> pick(size_t n, F keep) {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    if (keep(i)) out.push_back(i);
  }
  return out;
}

TEST(KiviStoreRetain, KeptRowsReadBackBitIdentically) {
  const size_t dim = 24, n = 150;
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    const KiviConfig cfg{bits, 8, 20};
    KiviHeadStore s(dim, cfg);
    const std::vector<float> k = normal_rows(n * dim, 301), v = normal_rows(n * dim, 302);
    std::vector<int32_t> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = int32_t(3 * i + 1);
    s.append(k.data(), v.data(), pos.data(), n);
    std::vector<float> before_k(n * dim), before_v(n * dim);
    s.read_rows(0, n, before_k.data(), before_v.data());
    // Drop a whole block (8..15), thin others, drop residual rows.
    const std::vector<uint32_t> keep =
        pick(n, [](uint32_t i) { return (i < 8 || i >= 16) && (i % 3 != 1 || i < 4); });
    s.retain(keep);
    ASSERT_EQ(s.size(), keep.size());
    EXPECT_TRUE(s.ragged());
    std::vector<float> ak(keep.size() * dim), av(keep.size() * dim);
    s.read_rows(0, keep.size(), ak.data(), av.data());
    for (size_t j = 0; j < keep.size(); ++j) {
      EXPECT_EQ(s.positions()[j], pos[keep[j]]);
      for (size_t d = 0; d < dim; ++d) {
        ASSERT_EQ(ak[j * dim + d], before_k[keep[j] * dim + d]) << "bits " << bits << " row " << j;
        ASSERT_EQ(av[j * dim + d], before_v[keep[j] * dim + d]) << "bits " << bits << " row " << j;
      }
    }
    // Reading an arbitrary sub-range agrees with the full read.
    std::vector<float> pk(7 * dim), pv(7 * dim);
    s.read_rows(5, 7, pk.data(), pv.data());
    for (size_t i = 0; i < 7 * dim; ++i) EXPECT_EQ(pk[i], ak[5 * dim + i]);
    // Counts: blocks hold what was kept of them; the emptied block is gone.
    const std::vector<uint32_t> counts = s.block_tokens();
    uint64_t sum = 0;
    for (uint32_t c : counts) {
      EXPECT_GE(c, 1u);
      EXPECT_LE(c, cfg.group);
      sum += c;
    }
    EXPECT_EQ(sum, s.quantized_tokens());
    EXPECT_EQ(s.key_scales().size(), counts.size() * dim);
  }
}

TEST(KiviStoreRetain, BytesDropByWhatWasRemoved) {
  const size_t dim = 32, n = 200;
  const KiviConfig cfg{2, 8, 16};
  KiviHeadStore s(dim, cfg);
  const std::vector<float> k = normal_rows(n * dim, 303);
  std::vector<int32_t> pos(n, 0);
  s.append(k.data(), k.data(), pos.data(), n);
  const size_t nq = s.quantized_tokens(), nr = s.residual_tokens(), blocks = nq / 8;
  const KiviBytes b0 = s.bytes();
  EXPECT_FALSE(s.ragged());
  // Dropping residual rows only: no block counts appear.
  s.retain(pick(n, [&](uint32_t i) { return i < nq || i % 2 == 0; }));
  EXPECT_FALSE(s.ragged());
  const size_t nr1 = s.residual_tokens();
  EXPECT_EQ(nr1, (nr + 1) / 2);  // nq is even, so the even indices are every other row
  const KiviBytes b1 = s.bytes();
  EXPECT_EQ(b1.residual, b0.residual - 2 * 2 * (nr - nr1) * dim);
  EXPECT_EQ(b1.positions, b0.positions - 4 * (nr - nr1));
  EXPECT_EQ(b1.codes, b0.codes);
  EXPECT_EQ(b1.scales_zeros, b0.scales_zeros);
  // Dropping the first block entirely and one token of the second.
  const size_t n1 = s.size();
  s.retain(pick(n1, [](uint32_t i) { return i >= 9; }));
  EXPECT_TRUE(s.ragged());
  const size_t row = kivi_packed_bytes(dim, 2), vg = kivi_value_groups(dim, 8);
  const KiviBytes b2 = s.bytes();
  EXPECT_EQ(s.quantized_tokens(), nq - 9);
  EXPECT_EQ(b2.codes, 2 * (nq - 9) * row);
  // Key scale+zero per remaining block, value scale+zero per token, a uint32 count per block.
  EXPECT_EQ(b2.scales_zeros, 2 * 2 * (blocks - 1) * dim + 2 * 2 * (nq - 9) * vg + 4 * (blocks - 1));
  EXPECT_EQ(b2.positions, 4 * s.size());
  EXPECT_EQ(b2.residual, b1.residual);
  // Keeping everything changes nothing; bad indices are refused and change nothing.
  const std::vector<float> rows = rows_of(s);
  s.retain(pick(s.size(), [](uint32_t) { return true; }));
  EXPECT_EQ(rows_of(s), rows);
  EXPECT_THROW(s.retain({3, 2}), kvsdk::Error);
  EXPECT_THROW(s.retain({uint32_t(s.size())}), kvsdk::Error);
  EXPECT_EQ(rows_of(s), rows);
  EXPECT_EQ(s.bytes().total(), b2.total());
  // Everything dropped: an empty store.
  s.retain({});
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.bytes().total(), 0u);
}

TEST(KiviStoreRetain, AppendAfterRetainFlushesAndProjects) {
  const size_t dim = 16, n = 120;
  const KiviConfig cfg{4, 8, 12};
  const std::vector<float> k = normal_rows(400 * dim, 304), v = normal_rows(400 * dim, 305);
  std::vector<int32_t> pos(400);
  for (size_t i = 0; i < 400; ++i) pos[i] = int32_t(i);
  KiviHeadStore s(dim, cfg);
  s.append(k.data(), v.data(), pos.data(), n);
  s.retain(pick(n, [](uint32_t i) { return i % 5 != 2; }));
  const size_t kept = s.size(), kept_quant = s.quantized_tokens();
  ASSERT_GT(kept_quant, 0u);
  std::vector<float> old_k(kept_quant * dim), old_v(kept_quant * dim);
  s.read_rows(0, kept_quant, old_k.data(), old_v.data());
  size_t t = n;
  for (size_t m : {1u, 9u, 30u, 3u, 100u}) {
    const KiviBytes want = s.projected_bytes(m);
    s.append(&k[t * dim], &v[t * dim], &pos[t], m);
    t += m;
    const KiviBytes got = s.bytes();
    EXPECT_EQ(got.codes, want.codes);
    EXPECT_EQ(got.scales_zeros, want.scales_zeros);
    EXPECT_EQ(got.residual, want.residual);
    EXPECT_EQ(got.positions, want.positions);
    EXPECT_LT(s.residual_tokens(), size_t(cfg.residual + cfg.group));
  }
  // The retained quantized rows did not change (the retained residual rows were flushed since);
  // new blocks hold G tokens each.
  std::vector<float> now_k(kept_quant * dim), now_v(kept_quant * dim);
  s.read_rows(0, kept_quant, now_k.data(), now_v.data());
  EXPECT_EQ(now_k, old_k);
  EXPECT_EQ(now_v, old_v);
  const std::vector<uint32_t> counts = s.block_tokens();
  EXPECT_EQ(counts.back(), cfg.group);
  // The new tokens are quantized the same as in a store that never evicted: compare with a
  // fresh store fed the same residual + new rows is not possible bit-wise (block alignment
  // differs), so check the error bound of the newest quantized block instead.
  std::vector<float> all_k(s.size() * dim), all_v(s.size() * dim);
  s.read_rows(0, s.size(), all_k.data(), all_v.data());
  for (size_t j = kept; j < s.quantized_tokens(); ++j) {
    const size_t src = size_t(s.positions()[j]);
    for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(all_v[j * dim + d], v[src * dim + d], 1.0);
  }
}

TEST(KiviStoreRetain, RaggedRestoreRoundTripsAndRejectsBadCounts) {
  const size_t dim = 16, n = 90;
  const KiviConfig cfg{2, 8, 10};
  const std::vector<float> k = normal_rows(200 * dim, 306);
  std::vector<int32_t> pos(200);
  for (size_t i = 0; i < 200; ++i) pos[i] = int32_t(i);
  KiviHeadStore a(dim, cfg);
  a.append(k.data(), k.data(), pos.data(), n);
  a.retain(pick(n, [](uint32_t i) { return i % 4 != 0; }));
  ASSERT_TRUE(a.ragged());
  const KiviHeadBuffers good = a.buffers();
  KiviHeadStore b = KiviHeadStore::restore(dim, cfg, good);
  EXPECT_EQ(rows_of(a), rows_of(b));
  EXPECT_EQ(a.bytes().total(), b.bytes().total());
  a.append(&k[n * dim], &k[n * dim], &pos[n], 60);
  b.append(&k[n * dim], &k[n * dim], &pos[n], 60);
  EXPECT_EQ(rows_of(a), rows_of(b));
  EXPECT_EQ(a.block_tokens(), b.block_tokens());
  const auto corrupt = [&](auto mutate) {
    KiviHeadBuffers c = good;
    mutate(c);
    try {
      KiviHeadStore::restore(dim, cfg, c);
      return false;
    } catch (const kvsdk::Error& e) {
      return e.status() == KVSDK_E_CORRUPT;
    }
  };
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& c) { c.block_tokens[0] += 1; }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& c) { c.block_tokens[0] = 0; }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& c) { c.block_tokens.back() = 9; }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& c) { c.block_tokens.push_back(1); }));
  EXPECT_TRUE(corrupt([](KiviHeadBuffers& c) { c.block_tokens.clear(); }));
}

}  // namespace
