// Policies 'minicache' and 'minicache+kivi4' through the C ABI: shallow layers exact, layer pairs
// merged from the middle layer on, the pending rows of a pair's leading layer exact, attention
// over read() rows, stats by tier, budget refusal that changes nothing, misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <limits>
#include <vector>

#include "../backends/cpu/reference_attention.h"
#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16, kRow = kKv * kDim;

kvsdk_policy parse(const char* name) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, name), KVSDK_OK) << name;
  return p;
}

std::vector<float> f16_rows(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> x = random_floats(n * kRow, seed, scale);
  for (float& f : x) f = kvsdk::f16_to_f32(kvsdk::f32_to_f16(f));
  return x;
}

struct HeadRows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
HeadRows read(kvsdk_cache* c, uint32_t layer, uint32_t h) {
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(c, layer, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  HeadRows r{std::vector<float>(n * kDim), std::vector<float>(n * kDim), std::vector<int32_t>(n)};
  size_t got = 0;
  EXPECT_EQ(kvsdk_cache_read(c, layer, h, r.k.data(), r.v.data(), r.pos.data(), n, &got), KVSDK_OK);
  EXPECT_EQ(got, n);
  return r;
}

kvsdk_cache_stats stats(kvsdk_cache* c) {
  kvsdk_cache_stats s;
  s.struct_size = sizeof(s);
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s;
}

// Attention of layer `layer` equals the double-precision reference over each head's read() rows.
void expect_attention_over_read_rows(kvsdk_cache* c, uint32_t layer, uint32_t seed) {
  const std::vector<int32_t> qpos = {std::numeric_limits<int32_t>::max(), 30};
  const std::vector<float> q = random_floats(qpos.size() * kQ * kDim, seed, 0.5f);
  std::vector<float> out(q.size());
  ASSERT_EQ(kvsdk_cache_attend(c, layer, qpos.size(), q.data(), qpos.data(), q.size() * 4,
                               out.data(), out.size() * 4), KVSDK_OK);
  const uint32_t group = kQ / kKv;
  for (uint32_t h = 0; h < kKv; ++h) {
    const HeadRows r = read(c, layer, h);
    std::vector<float> qh, got;
    std::vector<int32_t> qp;
    for (size_t i = 0; i < qpos.size(); ++i) {
      for (uint32_t j = 0; j < group; ++j) {
        const size_t o = (i * kQ + h * group + j) * kDim;
        qh.insert(qh.end(), q.begin() + o, q.begin() + o + kDim);
        got.insert(got.end(), out.begin() + o, out.begin() + o + kDim);
        qp.push_back(qpos[i]);
      }
    }
    const auto want = reference_attention(qh, qp, r.k, r.v, r.pos, kDim, 1.0 / std::sqrt(double(kDim)));
    EXPECT_LT(relative_error(got, want), 1e-5) << "layer " << layer << " head " << h;
  }
}

TEST(MiniCacheCache, MergesPairsAndCountsEveryTier) {
  for (const char* name : {"minicache", "minicache+kivi4"}) {
    auto ctx = make_context();
    const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
    const kvsdk_policy p = parse(name);
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache) << kvsdk_last_error();
    const size_t n = 80, prompt = 60;
    std::vector<std::vector<float>> k(kLayers), v(kLayers);
    for (uint32_t l = 0; l < kLayers; ++l) {
      k[l] = f16_rows(n, 10 + l);
      v[l] = f16_rows(n, 20 + l);
    }
    for (size_t i = 0; i < n * kRow; ++i) {  // layer 3 close to layer 2: most tokens merge
      k[3][i] = kvsdk::f16_to_f32(kvsdk::f32_to_f16(k[2][i] + 0.1f * k[3][i]));
      v[3][i] = kvsdk::f16_to_f32(kvsdk::f32_to_f16(v[2][i] + 0.1f * v[3][i]));
    }
    const std::vector<int32_t> pos = iota_positions(n);
    for (uint32_t l = 0; l < kLayers; ++l) {  // prompt, layer by layer
      ASSERT_EQ(kvsdk_cache_append(cache.get(), l, prompt, k[l].data(), v[l].data(), pos.data(), prompt * kRow * 4), KVSDK_OK);
    }
    for (size_t t = prompt; t < n; ++t) {  // decode steps
      for (uint32_t l = 0; l < kLayers; ++l) {
        ASSERT_EQ(kvsdk_cache_append(cache.get(), l, 1, &k[l][t * kRow], &v[l][t * kRow], &pos[t], kRow * 4), KVSDK_OK);
      }
    }
    for (uint32_t l = 0; l < kLayers; ++l) expect_attention_over_read_rows(cache.get(), l, 40 + l);
    // Shallow layers exact; merged layers restore norms (retained/merged rows) and positions.
    const HeadRows r0 = read(cache.get(), 0, 1);
    for (size_t t = 0; t < n; ++t) EXPECT_EQ(r0.k[t * kDim + 3], k[0][t * kRow + kDim + 3]);
    const HeadRows r3 = read(cache.get(), 3, 1);
    EXPECT_EQ(r3.pos, pos);
    const kvsdk_cache_stats s = stats(cache.get());
    uint64_t sum = 0;
    for (uint64_t b : s.bytes_by_tier) sum += b;
    EXPECT_EQ(s.bytes, sum);
    EXPECT_EQ(s.context_used_bytes, s.bytes);
    EXPECT_EQ(s.tokens, uint64_t(kLayers * kKv * n));
    EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_MERGED], 0u);
    if (std::string(name) == "minicache+kivi4") EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);
    // Exact tier: exactly the two shallow layers (no pending rows left).
    EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_EXACT], 2 * n * kKv * 4 * kDim);
    EXPECT_LT(s.bytes, s.full_bytes);
    kvsdk_layer_stats ls;
    ls.struct_size = sizeof(ls);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 3, &ls), KVSDK_OK);
    EXPECT_EQ(ls.tokens, uint64_t(kKv * n));
    EXPECT_EQ(ls.appended_tokens, uint64_t(n));
  }
}

// After appending only the first layer of a pair, attention over it equals exact attention over
// those rows (they wait, exact, for the partner layer).
TEST(MiniCacheCache, LeadingLayerAttendsExactly) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = parse("minicache+kivi4");
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache);
  const size_t n = 50;
  const std::vector<float> k = f16_rows(n, 1), v = f16_rows(n, 2);
  const std::vector<int32_t> pos = iota_positions(n);
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 2, n, k.data(), v.data(), pos.data(), n * kRow * 4), KVSDK_OK);
  for (uint32_t h = 0; h < kKv; ++h) {
    const HeadRows r = read(cache.get(), 2, h);
    for (size_t t = 0; t < n; ++t) {
      for (size_t x = 0; x < kDim; ++x) {
        ASSERT_EQ(r.k[t * kDim + x], k[t * kRow + h * kDim + x]);
        ASSERT_EQ(r.v[t * kDim + x], v[t * kRow + h * kDim + x]);
      }
    }
  }
  expect_attention_over_read_rows(cache.get(), 2, 7);
  const kvsdk_cache_stats s = stats(cache.get());
  EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_EXACT], n * kKv * 4 * kDim);
  EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_MERGED], 0u);
  EXPECT_EQ(s.context_used_bytes, s.bytes);
  // The partner's append merges them and releases the exact rows.
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 3, n, v.data(), k.data(), pos.data(), n * kRow * 4), KVSDK_OK);
  const kvsdk_cache_stats m = stats(cache.get());
  EXPECT_EQ(m.bytes_by_tier[KVSDK_TIER_EXACT], 0u);
  EXPECT_GT(m.bytes_by_tier[KVSDK_TIER_MERGED], 0u);
  EXPECT_EQ(m.context_used_bytes, m.bytes);
}

// A refused append (budget) leaves stats and rows exactly as they were; the budget is never
// exceeded along the way.
TEST(MiniCacheCache, BudgetRefusalChangesNothing) {
  for (const char* name : {"minicache", "minicache+kivi4"}) {
    const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
    const uint64_t budget = 30 * kLayers * exact_bytes_per_token(g);
    auto ctx = make_context(budget);
    const kvsdk_policy p = parse(name);
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache);
    // Token t of layer l: random rows, layer 3 close to layer 2 (so the pair merges).
    auto token = [](int32_t t, uint32_t l, uint32_t salt) {
      std::vector<float> x = random_floats(kRow, uint32_t(t) * 16 + (l == 3 ? 2 : l) + salt);
      if (l == 3) {
        const std::vector<float> e = random_floats(kRow, uint32_t(t) * 16 + 9 + salt, 0.1f);
        for (size_t i = 0; i < x.size(); ++i) x[i] += e[i];
      }
      return x;
    };
    kvsdk_status st = KVSDK_OK;
    int32_t t = 0;
    // A 20-token prompt (it fixes the merge threshold), then decode steps.
    for (int32_t step = 20; t < 1000 && st == KVSDK_OK; t += step, step = 1) {
      for (uint32_t l = 0; l < kLayers && st == KVSDK_OK; ++l) {
        std::vector<float> k, v;
        for (int32_t i = t; i < t + step; ++i) {
          const std::vector<float> kt = token(i, l, 0), vt = token(i, l, 5000);
          k.insert(k.end(), kt.begin(), kt.end());
          v.insert(v.end(), vt.begin(), vt.end());
        }
        const std::vector<int32_t> pos = iota_positions(size_t(step), t);
        const kvsdk_cache_stats before = stats(cache.get());
        const HeadRows rb = read(cache.get(), l, 0);
        st = kvsdk_cache_append(cache.get(), l, size_t(step), k.data(), v.data(), pos.data(), k.size() * 4);
        const kvsdk_cache_stats after = stats(cache.get());
        EXPECT_LE(after.context_used_bytes, budget);
        EXPECT_EQ(after.context_used_bytes, after.bytes);
        if (st != KVSDK_OK) {
          EXPECT_EQ(st, KVSDK_E_BUDGET) << kvsdk_last_error();
          EXPECT_EQ(std::memcmp(&before, &after, sizeof(before)), 0);
          const HeadRows ra = read(cache.get(), l, 0);
          EXPECT_EQ(ra.k, rb.k);
          EXPECT_EQ(ra.pos, rb.pos);
        }
      }
    }
    EXPECT_EQ(st, KVSDK_E_BUDGET) << name;
    EXPECT_GT(t, 32) << "merging should hold more tokens than the exact tier";
  }
}

TEST(MiniCacheCache, Misuse) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  kvsdk_policy p = parse("minicache");
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache);
  const std::vector<float> k = f16_rows(4, 5);
  const std::vector<int32_t> pos = iota_positions(4);
  EXPECT_EQ(kvsdk_cache_append(nullptr, 2, 4, k.data(), k.data(), pos.data(), k.size() * 4), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 9, 4, k.data(), k.data(), pos.data(), k.size() * 4), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 2, 4, nullptr, k.data(), pos.data(), k.size() * 4), KVSDK_E_INVALID_ARG);
  // The partner layer must give the same tokens the same positions.
  ASSERT_EQ(kvsdk_cache_append(cache.get(), 2, 4, k.data(), k.data(), pos.data(), k.size() * 4), KVSDK_OK);
  const kvsdk_cache_stats before = stats(cache.get());
  const std::vector<int32_t> shifted = iota_positions(4, 1);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 3, 4, k.data(), k.data(), shifted.data(), k.size() * 4), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()).find("position"), std::string::npos);
  const kvsdk_cache_stats after = stats(cache.get());
  EXPECT_EQ(std::memcmp(&before, &after, sizeof(before)), 0);
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(cache.get(), 2, 7, nullptr, nullptr, nullptr, 0, &n), KVSDK_E_OUT_OF_RANGE);
  float out[kQ * kDim];
  EXPECT_EQ(kvsdk_cache_attend(cache.get(), 9, 1, k.data(), nullptr, kQ * kDim * 4, out, sizeof(out)), KVSDK_E_OUT_OF_RANGE);
  // An allocation needs an eviction preset (snapshots: tests/formats/tier_snapshot_test.cpp).
  const uint64_t alloc[kLayers] = {1, 1, 1, 1};
  EXPECT_EQ(kvsdk_cache_set_allocation(cache.get(), alloc, kLayers), KVSDK_E_UNSUPPORTED);
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  // A boundary past the last layer is refused at creation.
  p.boundary_layer = int32_t(kLayers);
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
}

}  // namespace
