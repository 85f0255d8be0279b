// Policy 'specache' as a Representation: attention over the low-bit copy with the fetched rows in
// full precision equals a reference over read() rows, and with every token fetched equals exact
// attention over the f16 backing rows; append_bound covers the growth; bytes by tier match an
// independent count and leave the backing store out; save/restore is bit-identical; damaged
// records are KVSDK_E_CORRUPT; a file-backed store gives identical results.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "../backends/cpu/reference_attention.h"
#include "backend_ops.h"
#include "core/geometry.h"
#include "core/policy.h"
#include "repr/specache_repr.h"
#include "util/error.h"

using namespace kvsdk;
using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 32, kGroup = kQ / kKv;

Geometry geometry() {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = kLayers;
  g.n_q_heads = kQ;
  g.n_kv_heads = kKv;
  g.head_dim = kDim;
  return Geometry::from_c(&g);
}

kvsdk_policy policy(int32_t bits, int32_t fetch) {
  kvsdk_policy p = policy_defaults(KVSDK_METHOD_SPECACHE);
  p.quant_bits = bits;
  p.quant_group = 8;
  p.quant_residual = 16;
  p.fetch_tokens = fetch;
  return p;
}

// Appends `n` random tokens (positions from `first`) to every layer.
void fill(SpeCacheRepresentation& r, size_t n, int32_t first, uint32_t seed) {
  const size_t row = kKv * kDim;
  const std::vector<float> k = normal_rows(n * row, seed), v = normal_rows(n * row, seed + 1);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = first + int32_t(i);
  for (uint32_t l = 0; l < kLayers; ++l) r.append(l, n, k.data(), v.data(), pos.data());
}

std::vector<float> attend(const SpeCacheRepresentation& r, uint32_t l, uint32_t h,
                          const std::vector<float>& q, const std::vector<int32_t>& qpos) {
  std::vector<float> out(q.size());
  r.attend(l, h, q.data(), qpos.data(), qpos.size(), out.data());
  return out;
}

std::vector<int32_t> positions(size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = int32_t(i);
  return p;
}

struct Rows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
Rows read(const SpeCacheRepresentation& r, uint32_t l, uint32_t h) {
  Rows x;
  const size_t n = r.head_tokens(l, h);
  x.k.resize(n * kDim);
  x.v.resize(n * kDim);
  x.pos.resize(n);
  r.read(l, h, x.k.data(), x.v.data(), x.pos.data());
  return x;
}

// The backing store's rows of one head as f32 (exact f16 values).
Rows backing(const SpeCacheRepresentation& r, uint32_t l, uint32_t h) {
  const cpu::SpeCacheBackingStore& b = r.head(l, h).backing();
  Rows x;
  for (size_t t = 0; t < b.size(); ++t) {
    for (size_t d = 0; d < kDim; ++d) {
      x.k.push_back(f16_to_f32(b.key_row(t)[d]));
      x.v.push_back(f16_to_f32(b.value_row(t)[d]));
    }
  }
  x.pos = r.head(l, h).lowbit().positions();
  return x;
}

TEST(SpeCacheRepr, AttendEqualsReferenceOverReadRowsWithAPartialFetch) {
  for (int32_t bits : {2, 1}) {
    SpeCacheRepresentation r(geometry(), policy(bits, 20));
    fill(r, 150, 0, 1);
    const std::vector<float> spec = normal_rows(kGroup * kDim, 7);
    const std::vector<int32_t> qpos(kGroup, 200);
    r.prefetch(1, 0, spec.data(), qpos.data(), kGroup);
    EXPECT_EQ(r.head(1, 0).fetched().tokens.size(), 20u);
    const std::vector<float> q = normal_rows(kGroup * kDim, 8);
    const Rows rows = read(r, 1, 0);
    const std::vector<float> got = attend(r, 1, 0, q, qpos);
    // The fused KIVI kernel with 7-bit value weights (the default for 1- and 2-bit copies):
    // ~1e-2 from float attention over the same rows (kivi_cache_test's kernel tolerance).
    EXPECT_LT(relative_error(got, reference_attention(q, qpos, rows.k, rows.v, rows.pos, kDim,
                                                      geometry().attn_scale)),
              3e-2)
        << bits;
    // The fetched rows are the backing rows, the others are not (low-bit).
    const Rows exact = backing(r, 1, 0);
    const uint32_t t = r.head(1, 0).fetched().tokens[3];
    for (size_t d = 0; d < kDim; ++d) EXPECT_EQ(rows.k[t * kDim + d], exact.k[t * kDim + d]);
  }
}

TEST(SpeCacheRepr, FetchingEveryTokenGivesExactAttentionOverTheBackingRows) {
  const size_t n = 130;
  SpeCacheRepresentation r(geometry(), policy(1, int32_t(n)));
  fill(r, n, 0, 3);
  const std::vector<float> q = normal_rows(kGroup * kDim, 9);
  const std::vector<int32_t> qpos(kGroup, INT32_MAX);
  const std::vector<float> k = normal_rows(n * kKv * kDim, 3), v = normal_rows(n * kKv * kDim, 4);
  for (uint32_t h = 0; h < kKv; ++h) {
    r.prefetch(0, h, q.data(), qpos.data(), kGroup);
    // Exact f16 rows of head h, straight from the appended data.
    std::vector<float> kh, vh;
    for (size_t t = 0; t < n; ++t) {
      for (size_t d = 0; d < kDim; ++d) {
        kh.push_back(k[(t * kKv + h) * kDim + d]);
        vh.push_back(v[(t * kKv + h) * kDim + d]);
      }
    }
    const std::vector<float> got = attend(r, 0, h, q, qpos);
    EXPECT_LT(relative_error(got, reference_attention(q, qpos, f16_rounded(kh), f16_rounded(vh),
                                                      positions(n), kDim,
                                                      geometry().attn_scale)),
              2e-6);
  }
  EXPECT_NEAR(r.hit_rate(), 1.0, 1e-6);  // the same query guessed: all of the mass
  EXPECT_EQ(r.hit_rate_samples(), uint64_t(kKv));
}

TEST(SpeCacheRepr, HitRateAveragesTheFirstAttendAfterEachPrefetch) {
  SpeCacheRepresentation r(geometry(), policy(2, 10));
  // On the reference backend: `want` below is the reference kernel's measurement (the group's
  // averaged probabilities summed over the fetched rows), which the cache takes as the mean of
  // each head's share (float) of the same softmax: equal up to float rounding. (The optimized
  // backend's shares differ by more: backend_ops_test bounds them.)
  r.set_ops(backend::cpu_reference());
  fill(r, 100, 0, 5);
  const std::vector<float> q = normal_rows(kGroup * kDim, 11);
  const std::vector<int32_t> qpos(kGroup, 1000);
  EXPECT_EQ(r.hit_rate(), -1.0);
  attend(r, 0, 0, q, qpos);
  EXPECT_EQ(r.hit_rate_samples(), 0u);  // no prefetch yet
  r.prefetch(0, 0, q.data(), qpos.data(), kGroup);
  attend(r, 0, 0, q, qpos);
  attend(r, 0, 0, q, qpos);  // a second attend after the same prefetch is not measured
  EXPECT_EQ(r.hit_rate_samples(), 1u);
  const double want = r.head(0, 0).hit_rate(q.data(), kGroup, 1000, geometry().attn_scale);
  EXPECT_NEAR(r.hit_rate(), want, 1e-6 * want);
  EXPECT_GT(want, 0.0);
  EXPECT_LT(want, 1.0);
  // More than one speculative query per head is refused before anything changes.
  const std::vector<float> two = normal_rows(2 * kGroup * kDim, 12);
  const std::vector<int32_t> two_pos(2 * kGroup, 1000);
  const auto before = r.head(0, 0).fetched().tokens;
  EXPECT_THROW(r.prefetch(0, 0, two.data(), two_pos.data(), 2 * kGroup), Error);
  EXPECT_EQ(r.head(0, 0).fetched().tokens, before);
}

// prefetch() right after attending the same speculative query takes that pass's scores
// (SpeCache §3.3) instead of scanning again: the same rows, the same hit rate, on both backends;
// a changed query, position or copy (an append in between) scans again.
TEST(SpeCacheRepr, PrefetchAfterAttendingTheSameQueryFetchesWhatAScanFetches) {
  for (const backend::Ops* ops : {&backend::cpu_reference(), &backend::cpu_optimized()}) {
    SCOPED_TRACE(ops->name);
    SpeCacheRepresentation scored(geometry(), policy(2, 10)), scanned(geometry(), policy(2, 10));
    scored.set_ops(*ops);
    scanned.set_ops(*ops);
    fill(scored, 90, 0, 21);
    fill(scanned, 90, 0, 21);
    const std::vector<float> q = normal_rows(kGroup * kDim, 22), q2 = normal_rows(kGroup * kDim, 23);
    const std::vector<int32_t> qpos(kGroup, 90), early(kGroup, 40);
    const auto same_fetch = [&](uint32_t l, uint32_t h) {
      EXPECT_EQ(scored.head(l, h).fetched().tokens, scanned.head(l, h).fetched().tokens);
      EXPECT_EQ(scored.head(l, h).fetched().k, scanned.head(l, h).fetched().k);
    };
    for (uint32_t h = 0; h < kKv; ++h) {
      attend(scored, 1, h, q, qpos);  // scores kept
      scored.prefetch(1, h, q.data(), qpos.data(), kGroup);
      scanned.prefetch(1, h, q.data(), qpos.data(), kGroup);
      same_fetch(1, h);
      ASSERT_FALSE(scored.head(1, h).fetched().tokens.empty());
    }
    // The hit rate measured from the attend pass's scores is what a scan measures.
    attend(scored, 1, 0, q2, qpos);
    attend(scanned, 1, 0, q2, qpos);
    EXPECT_DOUBLE_EQ(scored.hit_rate(), scanned.hit_rate());
    EXPECT_EQ(scored.hit_rate_samples(), 1u);
    // Another query, another position, another layer, or an append since: a fresh scan.
    attend(scored, 0, 0, q, qpos);
    scored.prefetch(0, 0, q2.data(), qpos.data(), kGroup);
    scanned.prefetch(0, 0, q2.data(), qpos.data(), kGroup);
    same_fetch(0, 0);
    attend(scored, 0, 1, q, qpos);
    scored.prefetch(0, 1, q.data(), early.data(), kGroup);
    scanned.prefetch(0, 1, q.data(), early.data(), kGroup);
    same_fetch(0, 1);
    attend(scored, 1, 1, q2, qpos);
    scored.prefetch(0, 1, q2.data(), qpos.data(), kGroup);
    scanned.prefetch(0, 1, q2.data(), qpos.data(), kGroup);
    same_fetch(0, 1);
    attend(scored, 0, 0, q2, qpos);
    fill(scored, 5, 90, 24);
    fill(scanned, 5, 90, 24);
    scored.prefetch(0, 0, q2.data(), qpos.data(), kGroup);
    scanned.prefetch(0, 0, q2.data(), qpos.data(), kGroup);
    same_fetch(0, 0);
  }
}

TEST(SpeCacheRepr, AppendAndPrefetchBoundsCoverTheGrowth) {
  std::mt19937 rng(42);
  SpeCacheRepresentation r(geometry(), policy(2, 24));
  int32_t pos = 0;
  for (int i = 0; i < 60; ++i) {
    const size_t n = 1 + rng() % 23;
    const uint32_t l = rng() % kLayers;
    const uint64_t bound = r.append_bound(l, n), before = r.layer_bytes(l);
    const std::vector<float> k = normal_rows(n * kKv * kDim, rng()), v = normal_rows(n * kKv * kDim, rng());
    std::vector<int32_t> p(n);
    for (auto& x : p) x = pos++;
    r.append(l, n, k.data(), v.data(), p.data());
    ASSERT_LE(r.layer_bytes(l), before + bound) << i;
    const uint32_t h = rng() % kKv;
    const uint64_t pbound = r.prefetch_bound(l, h), pbefore = r.layer_bytes(l);
    const std::vector<float> q = normal_rows(kGroup * kDim, rng());
    const std::vector<int32_t> qpos(kGroup, pos);
    r.prefetch(l, h, q.data(), qpos.data(), kGroup);
    ASSERT_LE(r.layer_bytes(l), pbefore + pbound) << i;
  }
}

TEST(SpeCacheRepr, BytesByTierEqualAnIndependentCountWithoutTheBackingStore) {
  SpeCacheRepresentation r(geometry(), policy(2, 12));
  fill(r, 77, 0, 13);
  const std::vector<float> q = normal_rows(kGroup * kDim, 14);
  const std::vector<int32_t> qpos(kGroup, 100);
  r.prefetch(0, 1, q.data(), qpos.data(), kGroup);
  uint64_t t[KVSDK_TIER_SLOTS] = {};
  r.add_bytes(0, t);
  // Per head: KIVI codes/scales are the quantized tier, its f16 residual window exact.
  uint64_t quant = 0, exact = 0, meta = 0;
  for (uint32_t h = 0; h < kKv; ++h) {
    const cpu::KiviBytes b = r.head(0, h).lowbit().bytes();
    quant += b.codes + b.scales_zeros;
    exact += r.head(0, h).lowbit().residual_tokens() * kDim * 2 * 2;
    meta += 77 * 4;
  }
  exact += 12 * kDim * 2 * 2;  // fetched f16 keys and values of head 1
  meta += 12 * 4;              // their token indices
  EXPECT_EQ(t[KVSDK_TIER_QUANTIZED], quant);
  EXPECT_GT(quant, 0u);
  EXPECT_EQ(t[KVSDK_TIER_EXACT], exact);
  EXPECT_EQ(t[KVSDK_TIER_METADATA], meta);
  // Backing: whole blocks of 64 tokens per head and layer: 77 tokens -> 2 blocks.
  EXPECT_EQ(r.backing_bytes(), uint64_t(kLayers) * kKv * 2 * 64 * kDim * 2 * 2);
}

TEST(SpeCacheRepr, SaveRestoreIsBitIdenticalAndContinuesIdentically) {
  SpeCacheRepresentation a(geometry(), policy(1, 16));
  fill(a, 90, 0, 21);
  const std::vector<float> q = normal_rows(kGroup * kDim, 22);
  const std::vector<int32_t> qpos(kGroup, 500);
  a.prefetch(1, 1, q.data(), qpos.data(), kGroup);
  SpeCacheRepresentation b(geometry(), policy(1, 16));
  for (uint32_t l = 0; l < kLayers; ++l) b.restore(l, a.save(l));
  auto same = [&] {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kKv; ++h) {
        const Rows x = read(a, l, h), y = read(b, l, h);
        EXPECT_EQ(x.k, y.k);
        EXPECT_EQ(x.v, y.v);
        EXPECT_EQ(x.pos, y.pos);
        EXPECT_EQ(backing(a, l, h).k, backing(b, l, h).k);
        EXPECT_EQ(attend(a, l, h, q, qpos), attend(b, l, h, q, qpos));
      }
      uint64_t ta[KVSDK_TIER_SLOTS] = {}, tb[KVSDK_TIER_SLOTS] = {};
      a.add_bytes(l, ta);
      b.add_bytes(l, tb);
      for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) EXPECT_EQ(ta[i], tb[i]);
    }
  };
  same();
  fill(a, 25, 90, 23);
  fill(b, 25, 90, 23);
  a.prefetch(0, 0, q.data(), qpos.data(), kGroup);
  b.prefetch(0, 0, q.data(), qpos.data(), kGroup);
  same();
}

TEST(SpeCacheRepr, DamagedRecordsAreCorrupt) {
  SpeCacheRepresentation a(geometry(), policy(2, 8));
  fill(a, 40, 0, 31);
  const std::vector<float> q = normal_rows(kGroup * kDim, 32);
  const std::vector<int32_t> qpos(kGroup, 100);
  a.prefetch(0, 0, q.data(), qpos.data(), kGroup);
  const std::vector<TierRecord> good = a.save(0);
  auto expect_corrupt = [&](std::vector<TierRecord> recs, const char* what) {
    SpeCacheRepresentation b(geometry(), policy(2, 8));
    try {
      b.restore(0, recs);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << what << ": " << e.what();
    }
  };
  auto field = [](TierRecord& r, const std::string& name) -> TierField& {
    for (TierField& f : r.fields) {
      if (f.name == name) return f;
    }
    throw std::runtime_error("no field " + name);
  };
  std::vector<TierRecord> recs = good;
  recs.pop_back();
  expect_corrupt(recs, "missing head");
  recs = good;
  recs[0].kind = "kivi.head";
  expect_corrupt(recs, "wrong kind");
  recs = good;
  recs[1].kv_head = 0;
  expect_corrupt(recs, "wrong head");
  recs = good;
  recs[0].fields.erase(recs[0].fields.begin() + long(recs[0].fields.size()) - 1);
  expect_corrupt(recs, "missing field");
  recs = good;
  field(recs[0], "backing.keys").u16.pop_back();
  expect_corrupt(recs, "short backing keys");
  recs = good;
  field(recs[0], "fetched_tokens").u32[0] = 9999;
  expect_corrupt(recs, "fetched token beyond the rows");
  recs = good;
  std::swap(field(recs[0], "fetched_tokens").u32[0], field(recs[0], "fetched_tokens").u32[1]);
  expect_corrupt(recs, "fetched tokens not ascending");
  recs = good;
  field(recs[0], "fetched_values").u16.push_back(0);
  expect_corrupt(recs, "fetched values size");
  recs = good;
  field(recs[0], "lowbit.positions").i32.pop_back();
  expect_corrupt(recs, "low-bit positions");
  // A well-formed copy still restores.
  SpeCacheRepresentation b(geometry(), policy(2, 8));
  EXPECT_NO_THROW(b.restore(0, good));
}

TEST(SpeCacheRepr, FileBackingGivesTheSameResultsAsHostMemory) {
  char path[] = "/tmp/kvsdk_specache_repr_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  SpeCacheRepresentation host(geometry(), policy(2, 30));
  SpeCacheRepresentation file(geometry(), policy(2, 30));
  file.set_backing_file(path);
  EXPECT_EQ(file.head(0, 0).backing().arena().where(), std::string(path));
  const std::vector<float> q = normal_rows(kGroup * kDim, 41);
  const std::vector<int32_t> qpos(kGroup, INT32_MAX);
  for (int round = 0; round < 12; ++round) {  // enough blocks to remap the file several times
    fill(host, 70, round * 70, 40 + round);
    fill(file, 70, round * 70, 40 + round);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kKv; ++h) {
        host.prefetch(l, h, q.data(), qpos.data(), kGroup);
        file.prefetch(l, h, q.data(), qpos.data(), kGroup);
        ASSERT_EQ(attend(host, l, h, q, qpos), attend(file, l, h, q, qpos));
        ASSERT_EQ(backing(host, l, h).k, backing(file, l, h).k);
        ASSERT_EQ(backing(host, l, h).v, backing(file, l, h).v);
      }
    }
  }
  EXPECT_EQ(host.backing_bytes(), file.backing_bytes());
  // Too late once tokens are stored.
  try {
    file.set_backing_file(path);
    ADD_FAILURE() << "accepted after appends";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_STATE);
  }
  std::remove(path);
}

}  // namespace
