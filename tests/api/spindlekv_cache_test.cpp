// Policy 'spindlekv' through the C ABI: codebook layers below the boundary, SnapKV-style eviction
// with the SpindleKV schedule in the deep layers, the budget never exceeded (property test), a
// refused append that changes nothing, misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../backends/cpu/reference_attention.h"
#include "kvsdk.h"
#include "policy/allocation.h"
#include "rope.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16, kRow = kKv * kDim;

kvsdk_policy spindle() {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, "spindlekv"), KVSDK_OK);
  return p;
}

// Rows [n][kKv][kDim] around a few directions, so codebooks share entries; keys are rotated by
// RoPE at their positions (interleaved, θ 10000: the default geometry), as a host gives them.
std::vector<float> clustered(size_t n, uint32_t seed, const std::vector<int32_t>* rope_pos = nullptr) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> centers(4 * kDim);
  for (float& c : centers) c = d(rng);
  std::vector<float> x(n * kRow);
  const kvsdk::cpu::Rope rope(kDim, 10000.0f, KVSDK_ROPE_INTERLEAVED);
  for (size_t t = 0; t < n * kKv; ++t) {
    const size_t c = rng() % 4;
    for (size_t i = 0; i < kDim; ++i) x[t * kDim + i] = centers[c * kDim + i] + 0.02f * d(rng);
    if (rope_pos) rope.apply(&x[t * kDim], (*rope_pos)[t / kKv]);
  }
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
  return r;
}

kvsdk_cache_stats stats(kvsdk_cache* c) {
  kvsdk_cache_stats s;
  s.struct_size = sizeof(s);
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s;
}

void expect_attention_over_read_rows(kvsdk_cache* c, uint32_t layer, uint32_t seed) {
  const std::vector<int32_t> qpos = {std::numeric_limits<int32_t>::max(), 40};
  const std::vector<float> q = random_floats(qpos.size() * kQ * kDim, seed, 0.3f);
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

// Prefill of every layer (window observed first), as a host does it.
void prefill(kvsdk_cache* c, size_t n, uint32_t seed) {
  const std::vector<int32_t> pos = iota_positions(n);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = random_floats(8 * kQ * kDim, seed + 100 + l, 0.3f);
    const std::vector<int32_t> qpos(pos.end() - 8, pos.end());
    ASSERT_EQ(kvsdk_cache_observe(c, l, 8, q.data(), qpos.data(), q.size() * 4), KVSDK_OK);
    const std::vector<float> k = clustered(n, seed + l, &pos), v = clustered(n, seed + 50 + l);
    ASSERT_EQ(kvsdk_cache_append(c, l, n, k.data(), v.data(), pos.data(), k.size() * 4), KVSDK_OK)
        << kvsdk_last_error();
  }
}

TEST(SpindleKvCache, CodebookLayersAttendTheirRowsAndCountAsCodebook) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = spindle();
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache) << kvsdk_last_error();
  const size_t n = 120;
  prefill(cache.get(), n, 1);
  for (uint32_t l = 0; l < kLayers; ++l) expect_attention_over_read_rows(cache.get(), l, 9 + l);
  const kvsdk_cache_stats s = stats(cache.get());
  uint64_t sum = 0;
  for (uint64_t b : s.bytes_by_tier) sum += b;
  EXPECT_EQ(s.bytes, sum);
  EXPECT_EQ(s.context_used_bytes, s.bytes);
  EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_CODEBOOK], 0u);
  // The deep layers are exact (no budget: nothing evicted); the codebooks are far smaller.
  EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_EXACT], 2 * n * kKv * 4 * kDim);
  EXPECT_LT(s.bytes_by_tier[KVSDK_TIER_CODEBOOK], s.bytes_by_tier[KVSDK_TIER_EXACT] / 2);
  EXPECT_EQ(s.tokens, uint64_t(kLayers * kKv * n));
}

// Under a budget the deep layers evict with the SpindleKV schedule over the deep layers only
// (policy::allocate_pyramid, SpindleKV §3.3 Eq. (5)-(6)); the codebook layers keep every token.
TEST(SpindleKvCache, DeepLayersFollowTheSpindleSchedule) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = spindle();
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache);
  const size_t n = 200;
  prefill(cache.get(), n, 3);
  const kvsdk_cache_stats full = stats(cache.get());
  const uint64_t budget = full.bytes - full.bytes_by_tier[KVSDK_TIER_EXACT] * 6 / 10;
  ASSERT_EQ(kvsdk_cache_set_budget(cache.get(), budget), KVSDK_OK) << kvsdk_last_error();
  uint64_t cap = 0;
  ASSERT_EQ(kvsdk_cache_token_capacity(cache.get(), &cap, nullptr), KVSDK_OK);
  const std::vector<uint64_t> want = kvsdk::policy::allocate_pyramid(
      {n, n}, {uint64_t(p.obs_window), uint64_t(p.obs_window)}, cap, p.schedule_alpha,
      p.schedule_beta);
  uint64_t alloc[kLayers];
  ASSERT_EQ(kvsdk_cache_allocation(cache.get(), alloc, kLayers), KVSDK_OK);
  EXPECT_EQ(alloc[0], n);
  EXPECT_EQ(alloc[1], n);
  EXPECT_EQ(alloc[2], want[0]);
  EXPECT_EQ(alloc[3], want[1]);
  EXPECT_GT(alloc[2], alloc[3]);  // the schedule favours the first deep layer
  const kvsdk_cache_stats s = stats(cache.get());
  EXPECT_LE(s.bytes, budget);
  EXPECT_EQ(s.context_used_bytes, s.bytes);
  for (uint32_t l = 0; l < kLayers; ++l) expect_attention_over_read_rows(cache.get(), l, 20 + l);
}

// Property: random observes and appends under a tight budget never exceed it; every call either
// succeeds or fails with KVSDK_E_BUDGET leaving the cache unchanged; the deep layers evict.
TEST(SpindleKvCache, BudgetIsNeverExceededUnderRandomAppendsAndObserves) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  for (uint32_t trial = 0; trial < 3; ++trial) {
    const uint64_t budget = (60 + 40 * trial) * kLayers * exact_bytes_per_token(g);
    auto ctx = make_context(budget + 100000);
    const kvsdk_policy p = spindle();
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache);
    ASSERT_EQ(kvsdk_cache_set_budget(cache.get(), budget), KVSDK_OK);
    std::mt19937 rng(trial);
    int32_t next[kLayers] = {};
    size_t refused = 0, evicted_deep = 0;
    for (int step = 0; step < 300; ++step) {
      const uint32_t l = rng() % kLayers;
      const size_t n = 1 + rng() % (step % 25 == 0 ? 80 : 6);
      const kvsdk_cache_stats before = stats(cache.get());
      kvsdk_status st;
      if (rng() % 4 == 0) {
        const std::vector<float> q = random_floats(n * kQ * kDim, 7000 + step, 0.3f);
        const std::vector<int32_t> qpos = iota_positions(n, next[l]);
        st = kvsdk_cache_observe(cache.get(), l, n, q.data(), qpos.data(), q.size() * 4);
      } else {
        const std::vector<float> k = clustered(n, 1000 + step), v = random_floats(n * kRow, 3000 + step);
        const std::vector<int32_t> pos = iota_positions(n, next[l]);
        st = kvsdk_cache_append(cache.get(), l, n, k.data(), v.data(), pos.data(), k.size() * 4);
        if (st == KVSDK_OK) next[l] += int32_t(n);
      }
      const kvsdk_cache_stats after = stats(cache.get());
      ASSERT_LE(after.bytes, budget) << "step " << step;
      ASSERT_EQ(after.context_used_bytes, after.bytes);
      if (st != KVSDK_OK) {
        ASSERT_EQ(st, KVSDK_E_BUDGET) << kvsdk_last_error();
        ASSERT_EQ(std::memcmp(&before, &after, sizeof(before)), 0) << "step " << step;
        ++refused;
      }
      kvsdk_layer_stats ls;
      ls.struct_size = sizeof(ls);
      for (uint32_t d = 2; d < kLayers; ++d) {
        ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), d, &ls), KVSDK_OK);
        if (ls.tokens < ls.appended_tokens * kKv) ++evicted_deep;
      }
    }
    EXPECT_GT(evicted_deep, 0u) << "the deep layers never evicted (trial " << trial << ")";
    (void)refused;  // refusals happen once the codebooks alone outgrow the budget
  }
}

// A codebook-layer append the budget cannot hold is refused without changing anything.
TEST(SpindleKvCache, Misuse) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  kvsdk_policy p = spindle();
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache);
  const std::vector<float> k = clustered(4, 5);
  const std::vector<int32_t> pos = iota_positions(4);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), kLayers, 4, k.data(), k.data(), pos.data(), k.size() * 4), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_append(cache.get(), 0, 4, k.data(), nullptr, pos.data(), k.size() * 4), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_observe(cache.get(), kLayers, 1, k.data(), nullptr, kQ * kDim * 4), KVSDK_E_OUT_OF_RANGE);
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(cache.get(), 0, kKv, nullptr, nullptr, nullptr, 0, &n), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_read(nullptr, 0, 0, nullptr, nullptr, nullptr, 0, &n), KVSDK_E_INVALID_ARG);
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  p.boundary_layer = int32_t(kLayers) + 1;
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
}

}  // namespace
