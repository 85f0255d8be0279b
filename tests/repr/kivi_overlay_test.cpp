// The row store of a KIVI overlay (repr/kivi_repr.h as the eviction presets' row store): its
// snapshot records (one "kivi.head" record per KV head, ragged blocks included) restore
// bit-identically into a fresh store, and damaged records are refused with KVSDK_E_CORRUPT
// without touching the layer.
#include <gtest/gtest.h>

#include <vector>

#include "core/cache.h"
#include "core/representation.h"
#include "kvsdk.h"
#include "repr/kivi_repr.h"
#include "test_util.h"
#include "util/error.h"

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

std::vector<float> rows(const kvsdk::Representation& s, uint32_t l, uint32_t h) {
  const size_t n = s.head_tokens(l, h);
  std::vector<float> kv(2 * n * kDim);
  std::vector<int32_t> pos(n);
  s.read(l, h, kv.data(), kv.data() + n * kDim, pos.data());
  for (int32_t p : pos) kv.push_back(float(p));
  return kv;
}

std::unique_ptr<kvsdk::Representation> fresh_store(const kvsdk::Cache& cache) {
  return kvsdk::make_row_store(cache.geometry(), cache.policy());
}

TEST(QuantOverlay, RecordsRestoreBitIdentically) {
  auto ctx = make_context();
  CachePtr c = evicted_cache(ctx.get());
  const kvsdk::Cache& cache = *c->impl;
  bool ragged = false;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const kvsdk::Representation& L = cache.store(l);
    ASSERT_NE(dynamic_cast<const kvsdk::KiviRepresentation*>(&L), nullptr);
    for (uint32_t h = 0; h < kKv; ++h) EXPECT_EQ(cache.exact_rows(l, h).size(), 0u);  // counted once
    const std::vector<kvsdk::TierRecord> rec = L.save(l);
    ASSERT_EQ(rec.size(), kKv);
    auto fresh = fresh_store(cache);
    fresh->restore(l, rec);
    EXPECT_EQ(fresh->layer_bytes(l), L.layer_bytes(l));
    for (uint32_t h = 0; h < kKv; ++h) {
      EXPECT_EQ(rows(*fresh, l, h), rows(L, l, h));
      for (const kvsdk::TierField& f : rec[h].fields) {
        ragged = ragged || (f.name == "block_tokens" && !f.u32.empty());
      }
    }
  }
  EXPECT_TRUE(ragged) << "the eviction should have thinned some key block";
}

TEST(QuantOverlay, DamagedRecordsAreCorruptAndChangeNothing) {
  auto ctx = make_context();
  CachePtr c = evicted_cache(ctx.get());
  const kvsdk::Cache& cache = *c->impl;
  const std::vector<kvsdk::TierRecord> good = cache.store(0).save(0);
  auto target = fresh_store(cache);
  target->restore(0, good);
  const std::vector<float> before = rows(*target, 0, 1);
  const auto corrupt = [&](auto mutate) {
    std::vector<kvsdk::TierRecord> r = good;
    mutate(r);
    try {
      target->restore(0, r);
      return false;
    } catch (const kvsdk::Error& e) {
      return e.status() == KVSDK_E_CORRUPT && rows(*target, 0, 1) == before;
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
  const std::vector<kvsdk::TierRecord> other = cache.store(1).save(1);
  EXPECT_TRUE(corrupt([&](Recs& r) {
    r[1] = other[1];
    r[1].layer = 0;
  }));
}

}  // namespace
