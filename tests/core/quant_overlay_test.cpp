// core/quant_overlay: the snapshot records of a KIVI overlay (one "kivi.head" record per KV head,
// ragged blocks included) restore bit-identically, and damaged records are refused with
// KVSDK_E_CORRUPT without touching the layer.
#include <gtest/gtest.h>

#include <vector>

#include "core/cache.h"
#include "core/error.h"
#include "core/quant_overlay.h"
#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 16;

// An xkv+kivi2 cache whose stores went through an eviction (ragged key blocks).
CachePtr evicted_cache(kvsdk_context* ctx) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, "xkv+kivi2"), KVSDK_OK);
  p.quant_group = 4;
  p.quant_residual = 8;
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  CachePtr c = make_cache(ctx, g, &p);
  EXPECT_TRUE(c) << kvsdk_last_error();
  const size_t n = 60, row = kKv * kDim;
  const std::vector<float> k = random_floats(n * row, 1), v = random_floats(n * row, 2);
  const std::vector<int32_t> pos = iota_positions(n);
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(kvsdk_cache_append(c.get(), l, n, k.data(), v.data(), pos.data(), k.size() * 4), KVSDK_OK);
    const std::vector<float> q = random_floats(4 * kQ * kDim, 3 + l);
    EXPECT_EQ(kvsdk_cache_observe(c.get(), l, 4, q.data(), nullptr, q.size() * 4), KVSDK_OK);
  }
  const uint64_t alloc[kLayers] = {37, 21};
  EXPECT_EQ(kvsdk_cache_set_allocation(c.get(), alloc, kLayers), KVSDK_OK) << kvsdk_last_error();
  return c;
}

std::vector<float> rows(const kvsdk::LayerState& L, uint32_t h) {
  const size_t n = kvsdk::held_rows(L, h);
  std::vector<float> kv(2 * n * kDim);
  std::vector<int32_t> pos(n);
  kvsdk::read_held_rows(L, h, kDim, kv.data(), kv.data() + n * kDim, pos.data());
  for (int32_t p : pos) kv.push_back(float(p));
  return kv;
}

TEST(QuantOverlay, RecordsRestoreBitIdentically) {
  auto ctx = make_context();
  CachePtr c = evicted_cache(ctx.get());
  const kvsdk::Cache& cache = *c->impl;
  bool ragged = false;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const kvsdk::LayerState& L = cache.layer(l);
    ASSERT_EQ(L.quant.size(), kKv);
    for (const kvsdk::ExactStore& e : L.heads) EXPECT_EQ(e.size(), 0u);  // nothing counted twice
    const std::vector<kvsdk::TierRecord> rec = kvsdk::quant_overlay_records(L, l);
    ASSERT_EQ(rec.size(), kKv);
    kvsdk::LayerState fresh;
    fresh.heads.resize(kKv);
    kvsdk::quant_overlay_restore(fresh, l, cache.geometry(), cache.policy(), rec);
    for (uint32_t h = 0; h < kKv; ++h) {
      EXPECT_EQ(rows(fresh, h), rows(L, h));
      EXPECT_EQ(fresh.quant[h].bytes().total(), L.quant[h].bytes().total());
      EXPECT_EQ(fresh.quant[h].block_tokens(), L.quant[h].block_tokens());
      ragged = ragged || L.quant[h].ragged();
    }
  }
  EXPECT_TRUE(ragged) << "the eviction should have thinned some key block";
}

TEST(QuantOverlay, DamagedRecordsAreCorruptAndChangeNothing) {
  auto ctx = make_context();
  CachePtr c = evicted_cache(ctx.get());
  const kvsdk::Cache& cache = *c->impl;
  const std::vector<kvsdk::TierRecord> good = kvsdk::quant_overlay_records(cache.layer(0), 0);
  kvsdk::LayerState target;
  target.heads.resize(kKv);
  kvsdk::quant_overlay_restore(target, 0, cache.geometry(), cache.policy(), good);
  const std::vector<float> before = rows(target, 1);
  const auto corrupt = [&](auto mutate) {
    std::vector<kvsdk::TierRecord> r = good;
    mutate(r);
    try {
      kvsdk::quant_overlay_restore(target, 0, cache.geometry(), cache.policy(), r);
      return false;
    } catch (const kvsdk::Error& e) {
      return e.status() == KVSDK_E_CORRUPT && rows(target, 1) == before;
    }
  };
  using Recs = std::vector<kvsdk::TierRecord>;
  EXPECT_TRUE(corrupt([](Recs& r) { r.pop_back(); }));
  EXPECT_TRUE(corrupt([](Recs& r) { r[0].kind = "spindlekv.head"; }));
  EXPECT_TRUE(corrupt([](Recs& r) { r[1].kv_head = 0; }));
  EXPECT_TRUE(corrupt([](Recs& r) { r[1].layer = 1; }));
  EXPECT_TRUE(corrupt([](Recs& r) { r[0].fields.erase(r[0].fields.begin() + 1); }));
  for (const kvsdk::TierField& f : good[0].fields) {
    // Every field matters: drop one element of each non-empty buffer in turn.
    if (f.u8.empty() && f.u16.empty() && f.i32.empty() && f.u32.empty() && f.u64.empty()) continue;
    const std::string name = f.name;
    EXPECT_TRUE(corrupt([&](Recs& r) {
      for (kvsdk::TierField& g : r[0].fields) {
        if (g.name != name) continue;
        if (!g.u8.empty()) g.u8.pop_back();
        else if (!g.u16.empty()) g.u16.pop_back();
        else if (!g.i32.empty()) g.i32.pop_back();
        else if (!g.u32.empty()) g.u32.pop_back();
        else g.u64[0] += 1;
      }
    })) << name;
  }
  // Heads of one layer with different row counts.
  const std::vector<kvsdk::TierRecord> other = kvsdk::quant_overlay_records(cache.layer(1), 1);
  EXPECT_TRUE(corrupt([&](Recs& r) {
    r[1] = other[1];
    r[1].layer = 0;
  }));
}

}  // namespace
