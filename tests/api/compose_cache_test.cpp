// Eviction presets with a KIVI overlay (xkv+kivi2, snapkv+kivi2, h2o+kivi4, streaming_llm+kivi8,
// pyramidkv+kivi1) through the C ABI: the budget is never exceeded under random operations, bytes
// add up by tier, kept rows are dequantized rows of appended tokens that never change once
// quantized (eviction does not re-quantize), attention equals a reference over read() rows, and
// refused operations change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 3, kQ = 4, kKv = 2, kDim = 32;
constexpr size_t kRow = kKv * kDim;

kvsdk_policy overlay_policy(const char* spec) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK) << spec;
  p.quant_group = 8;  // small G and R so that short tests quantize
  p.quant_residual = 16;
  p.obs_window = 4;
  p.sink_tokens = 2;
  return p;
}

kvsdk_cache_stats stats_of(kvsdk_cache* c) {
  kvsdk_cache_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof(s);
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s;
}

struct HeadRows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  bool operator==(const HeadRows& o) const { return k == o.k && v == o.v && pos == o.pos; }
};

HeadRows read_head(kvsdk_cache* c, uint32_t layer, uint32_t h) {
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(c, layer, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  HeadRows r;
  r.k.resize(n * kDim);
  r.v.resize(n * kDim);
  r.pos.resize(n);
  size_t got = 0;
  EXPECT_EQ(kvsdk_cache_read(c, layer, h, r.k.data(), r.v.data(), r.pos.data(), n, &got),
            KVSDK_OK);
  EXPECT_EQ(got, n);
  return r;
}

std::vector<HeadRows> read_all(kvsdk_cache* c) {
  std::vector<HeadRows> out;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kKv; ++h) out.push_back(read_head(c, l, h));
  }
  return out;
}

void expect_tiers_add_up(kvsdk_cache* c) {
  const kvsdk_cache_stats s = stats_of(c);
  uint64_t sum = 0;
  for (uint64_t b : s.bytes_by_tier) sum += b;
  EXPECT_EQ(sum, s.bytes);
  EXPECT_EQ(s.context_used_bytes, s.bytes);  // the only cache of its context
  EXPECT_EQ(s.bytes_by_tier[KVSDK_TIER_CODEBOOK] + s.bytes_by_tier[KVSDK_TIER_MERGED], 0u);
}

// Double-precision attention of queries over one layer's rows, given per KV head.
std::vector<double> reference(const std::vector<float>& q, const std::vector<int32_t>& qpos,
                              const std::vector<HeadRows>& heads, float scale) {
  const size_t nq = qpos.size(), group = kQ / kKv;
  std::vector<double> out(nq * kQ * kDim, 0.0);
  for (size_t i = 0; i < nq; ++i) {
    for (size_t h = 0; h < kQ; ++h) {
      const HeadRows& r = heads[h / group];
      const size_t n = r.pos.size();
      std::vector<double> s(n, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t t = 0; t < n; ++t) {
        if (r.pos[t] > qpos[i]) continue;
        double d = 0;
        for (size_t x = 0; x < kDim; ++x) d += double(q[(i * kQ + h) * kDim + x]) * r.k[t * kDim + x];
        s[t] = d * scale;
        mx = std::max(mx, s[t]);
      }
      double z = 0;
      for (size_t t = 0; t < n; ++t) z += (s[t] = r.pos[t] > qpos[i] ? 0.0 : std::exp(s[t] - mx));
      for (size_t t = 0; t < n; ++t) {
        for (size_t x = 0; x < kDim; ++x) out[(i * kQ + h) * kDim + x] += s[t] / z * r.v[t * kDim + x];
      }
    }
  }
  return out;
}

void expect_attention_matches_read(kvsdk_cache* c, uint32_t layer, uint32_t seed) {
  std::vector<HeadRows> heads;
  for (uint32_t h = 0; h < kKv; ++h) heads.push_back(read_head(c, layer, h));
  if (heads[0].pos.empty()) return;
  const std::vector<float> q = random_floats(2 * kQ * kDim, seed, 0.5f);
  // One query that sees only the oldest rows (causal mask), one that sees every row.
  const std::vector<int32_t> qpos = {std::max(heads[0].pos[0], heads[1].pos[0]),
                                     std::max(heads[0].pos.back(), heads[1].pos.back())};
  std::vector<float> out(q.size());
  ASSERT_EQ(kvsdk_cache_attend(c, layer, 2, q.data(), qpos.data(), q.size() * 4, out.data(),
                               out.size() * 4),
            KVSDK_OK);
  const std::vector<double> want = reference(q, qpos, heads, 1.0f / std::sqrt(float(kDim)));
  double e = 0, w = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    e += (out[i] - want[i]) * (out[i] - want[i]);
    w += want[i] * want[i];
  }
  // The optimized KIVI kernel sums integer codes of the query x scale and of the value weights
  // (docs/backends.md: within 2e-3 of max |v| per element); measured up to ~3e-5 relative here
  // with 14-bit weights, up to ~1.5e-3 with 7-bit ones (kvsdk_policy.kivi_weight_bits).
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  ASSERT_EQ(kvsdk_cache_policy(c, &p), KVSDK_OK);
  const double tol = p.kivi_weight_bits == 7 ? 1e-2 : 3e-4;
  EXPECT_LT(std::sqrt(e / std::max(w, 1e-30)), tol) << "layer " << layer;
}

// Every appended row, by (layer, position): f16-rounded keys/values of each KV head.
struct Appended {
  std::map<std::pair<uint32_t, int32_t>, std::vector<float>> k, v;
};

float f16r(float x) { return kvsdk::f16_to_f32(kvsdk::f32_to_f16(x)); }

class OverlayProperty : public ::testing::TestWithParam<const char*> {};

TEST_P(OverlayProperty, BudgetHoldsAndRowsStayTrueUnderRandomOperations) {
  const kvsdk_policy p = overlay_policy(GetParam());
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  // Room for about 120 exact layer-tokens: quantization lets the cache hold more than that.
  const uint64_t context_budget = 120 * exact_bytes_per_token(g) + 4096;
  auto ctx = make_context(context_budget);
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache) << kvsdk_last_error();
  const double bound = p.quant_bits == 8 ? 0.05 : p.quant_bits == 4 ? 0.6 : p.quant_bits == 2 ? 2.5 : 5.0;
  std::mt19937 rng(1234 + p.method * 10 + p.quant_bits);
  std::vector<int32_t> next_pos(kLayers, 0);
  Appended seen;
  uint64_t cache_budget = 0;
  std::vector<HeadRows> before = read_all(cache.get());
  size_t budget_refusals = 0, misuse = 0, quantized_seen = 0;
  for (int step = 0; step < 100; ++step) {
    const kvsdk_cache_stats s0 = stats_of(cache.get());
    const int op = int(rng() % 10);
    const uint32_t layer = rng() % kLayers;
    kvsdk_status st = KVSDK_OK;
    if (step % 20 == 19) {  // misuse: refused before anything is looked at
      st = kvsdk_cache_append(cache.get(), kLayers, 1, nullptr, nullptr, nullptr, 0);
    } else if (op < 6) {  // append 1..24 tokens to one layer
      const size_t n = 1 + rng() % 24;
      const std::vector<float> k = random_floats(n * kRow, rng()), v = random_floats(n * kRow, rng());
      const std::vector<int32_t> pos = iota_positions(n, next_pos[layer]);
      st = kvsdk_cache_append(cache.get(), layer, n, k.data(), v.data(), pos.data(), k.size() * 4);
      if (st == KVSDK_OK) {
        next_pos[layer] += int32_t(n);
        for (size_t t = 0; t < n; ++t) {
          std::vector<float> kr(kRow), vr(kRow);
          for (size_t i = 0; i < kRow; ++i) kr[i] = f16r(k[t * kRow + i]), vr[i] = f16r(v[t * kRow + i]);
          seen.k[{layer, pos[t]}] = kr;
          seen.v[{layer, pos[t]}] = vr;
        }
      }
    } else if (op < 8) {  // observe queries (H2O scores, observation windows)
      const size_t n = 1 + rng() % 3;
      const std::vector<float> q = random_floats(n * kQ * kDim, rng(), 0.5f);
      std::vector<int32_t> qpos(n, next_pos[layer]);
      st = kvsdk_cache_observe(cache.get(), layer, n, q.data(), qpos.data(), q.size() * 4);
    } else if (op < 9) {
      st = kvsdk_cache_compress(cache.get());
    } else {  // a new cache budget: sometimes too small to be met, sometimes none
      const uint64_t choices[] = {0, context_budget / 2, context_budget / 4, 64};
      const uint64_t b = choices[rng() % 4];
      st = kvsdk_cache_set_budget(cache.get(), b);
      if (st == KVSDK_OK) cache_budget = b;
    }
    const kvsdk_cache_stats s1 = stats_of(cache.get());
    // The budget holds after every call, whatever it returned.
    EXPECT_LE(s1.bytes, context_budget) << GetParam() << " step " << step;
    if (cache_budget) {
      EXPECT_LE(s1.bytes, cache_budget) << GetParam() << " step " << step;
    }
    expect_tiers_add_up(cache.get());
    std::vector<HeadRows> after = read_all(cache.get());
    if (st != KVSDK_OK) {
      st == KVSDK_E_BUDGET ? ++budget_refusals : ++misuse;
      EXPECT_TRUE(st == KVSDK_E_BUDGET || st == KVSDK_E_OUT_OF_RANGE || st == KVSDK_E_INVALID_ARG)
          << kvsdk_last_error();
      EXPECT_EQ(s1.bytes, s0.bytes);
      EXPECT_EQ(s1.tokens, s0.tokens);
      EXPECT_TRUE(after == before) << "a refused call changed the cache";
    }
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kKv; ++h) {
        const HeadRows& now = after[l * kKv + h];
        const HeadRows& old = before[l * kKv + h];
        EXPECT_EQ(now.pos.size(), after[l * kKv].pos.size());  // every head keeps as many rows
        for (size_t t = 0; t < now.pos.size(); ++t) {
          // Ascending positions of appended tokens, within the quantization error of the
          // appended row (exact f16 in the residual window).
          if (t > 0) EXPECT_LT(now.pos[t - 1], now.pos[t]);
          const auto key = std::make_pair(l, now.pos[t]);
          ASSERT_TRUE(seen.k.count(key)) << "position " << now.pos[t] << " was never appended";
          bool exact = true;
          for (size_t x = 0; x < kDim; ++x) {
            const float ko = seen.k[key][h * kDim + x], vo = seen.v[key][h * kDim + x];
            ASSERT_LE(std::fabs(now.k[t * kDim + x] - ko), bound);
            ASSERT_LE(std::fabs(now.v[t * kDim + x] - vo), bound);
            exact = exact && now.k[t * kDim + x] == ko && now.v[t * kDim + x] == vo;
          }
          if (!exact) ++quantized_seen;
          // A row present before is unchanged, unless it was exact then (flushed since):
          // eviction never re-quantizes what it keeps.
          const auto it = std::lower_bound(old.pos.begin(), old.pos.end(), now.pos[t]);
          if (it == old.pos.end() || *it != now.pos[t]) continue;
          const size_t o = size_t(it - old.pos.begin());
          bool same = true, was_exact = true;
          for (size_t x = 0; x < kDim; ++x) {
            same = same && now.k[t * kDim + x] == old.k[o * kDim + x] &&
                   now.v[t * kDim + x] == old.v[o * kDim + x];
            was_exact = was_exact && old.k[o * kDim + x] == seen.k[key][h * kDim + x] &&
                        old.v[o * kDim + x] == seen.v[key][h * kDim + x];
          }
          EXPECT_TRUE(same || was_exact) << "row at position " << now.pos[t] << " changed";
        }
      }
    }
    before = std::move(after);
  }
  EXPECT_GT(quantized_seen, 0u) << "the overlay never quantized anything";
  EXPECT_GT(misuse, 0u) << "no refused call was exercised";
  if (p.method != KVSDK_METHOD_H2O && p.method != KVSDK_METHOD_STREAMING_LLM) {
    // Window methods cannot go below their observation windows: some budgets are refused.
    EXPECT_GT(budget_refusals, 0u) << "no budget refusal was exercised";
  }
  for (uint32_t l = 0; l < kLayers; ++l) expect_attention_matches_read(cache.get(), l, 77 + l);
  const kvsdk_cache_stats s = stats_of(cache.get());
  EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);
}

INSTANTIATE_TEST_SUITE_P(Presets, OverlayProperty,
                         ::testing::Values("xkv+kivi2", "snapkv+kivi2", "h2o+kivi4",
                                           "streaming_llm+kivi8", "pyramidkv+kivi1"));

// With the same allocation and no attention signal (recency), an overlay keeps exactly the
// positions its preset keeps, their rows are the dequantized rows, and it costs fewer bytes.
TEST(ComposeCache, KeepsWhatThePresetKeeps) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  for (const char* spec : {"streaming_llm+kivi8", "snapkv+kivi2", "xkv+kivi2"}) {
    kvsdk_policy with = overlay_policy(spec), without = with;
    without.quant_bits = 0;
    auto ctx = make_context(), ctx_b = make_context();
    auto a = make_cache(ctx.get(), g, &with);
    auto b = make_cache(ctx_b.get(), g, &without);
    ASSERT_TRUE(a && b) << kvsdk_last_error();
    const size_t n = 150;
    const std::vector<float> k = random_floats(n * kRow, 11), v = random_floats(n * kRow, 12);
    const std::vector<int32_t> pos = iota_positions(n);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (size_t t = 0; t < n; t += 30) {
        for (kvsdk_cache* c : {a.get(), b.get()}) {
          ASSERT_EQ(kvsdk_cache_append(c, l, 30, &k[t * kRow], &v[t * kRow], &pos[t], 30 * kRow * 4),
                    KVSDK_OK);
        }
      }
    }
    const uint64_t alloc[kLayers] = {90, 41, 7};
    ASSERT_EQ(kvsdk_cache_set_allocation(a.get(), alloc, kLayers), KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_set_allocation(b.get(), alloc, kLayers), KVSDK_OK) << kvsdk_last_error();
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kKv; ++h) {
        const HeadRows ra = read_head(a.get(), l, h), rb = read_head(b.get(), l, h);
        EXPECT_EQ(ra.pos, rb.pos) << spec << " layer " << l;
        EXPECT_EQ(ra.pos.size(), alloc[l]);
        if (with.method == KVSDK_METHOD_STREAMING_LLM) {
          EXPECT_EQ(ra.pos[0], 0);  // sinks
          EXPECT_EQ(ra.pos[1], 1);
        }
        EXPECT_EQ(ra.pos.back(), int32_t(n - 1));  // the newest row stays
        // Rows of the last R appended tokens are in the exact residual window; older ones are
        // quantized but close.
        const size_t m = ra.pos.size();
        for (size_t t = 0; t < m; ++t) {
          for (size_t x = 0; x < kDim; ++x) {
            if (ra.pos[t] >= int32_t(n - 16)) {
              EXPECT_EQ(ra.k[t * kDim + x], rb.k[t * kDim + x]);
              EXPECT_EQ(ra.v[t * kDim + x], rb.v[t * kDim + x]);
            }
            EXPECT_NEAR(ra.v[t * kDim + x], rb.v[t * kDim + x], 2.5);
          }
        }
      }
      expect_attention_matches_read(a.get(), l, 5 + l);
    }
    expect_tiers_add_up(a.get());
    const kvsdk_cache_stats sa = stats_of(a.get()), sb = stats_of(b.get());
    EXPECT_EQ(sa.tokens, sb.tokens);
    EXPECT_LT(sa.bytes, sb.bytes) << spec;
    EXPECT_GT(sa.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);
  }
}

// Under the same byte budget the overlay holds more tokens than its preset (the point of it),
// and never more bytes than the budget.
TEST(ComposeCache, HoldsMoreTokensInTheSameBudget) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const uint64_t budget = 3 * 60 * exact_bytes_per_token(g);  // 60 exact tokens per layer
  for (const char* spec : {"xkv+kivi2", "snapkv+kivi2"}) {
    kvsdk_policy with = overlay_policy(spec), without = with;
    without.quant_bits = 0;
    uint64_t tokens[2] = {};
    for (int i = 0; i < 2; ++i) {
      auto ctx = make_context(budget);
      auto c = make_cache(ctx.get(), g, i == 0 ? &with : &without);
      ASSERT_TRUE(c) << kvsdk_last_error();
      const size_t n = 300;
      const std::vector<float> k = random_floats(n * kRow, 21), v = random_floats(n * kRow, 22);
      const std::vector<int32_t> pos = iota_positions(n);
      for (size_t t = 0; t < n; t += 10) {
        for (uint32_t l = 0; l < kLayers; ++l) {
          const std::vector<float> q = random_floats(kQ * kDim, uint32_t(t + l), 0.5f);
          const int32_t qp = int32_t(t + 9);
          ASSERT_EQ(kvsdk_cache_append(c.get(), l, 10, &k[t * kRow], &v[t * kRow], &pos[t], 10 * kRow * 4),
                    KVSDK_OK) << kvsdk_last_error();
          ASSERT_EQ(kvsdk_cache_observe(c.get(), l, 1, q.data(), &qp, q.size() * 4), KVSDK_OK);
          EXPECT_LE(stats_of(c.get()).bytes, budget);
        }
      }
      expect_tiers_add_up(c.get());
      tokens[i] = stats_of(c.get()).tokens;
    }
    EXPECT_GT(tokens[0], tokens[1] * 3 / 2) << spec << ": overlay " << tokens[0] << " vs " << tokens[1];
  }
}

TEST(ComposeCache, RefusalsAndMisuseChangeNothing) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = overlay_policy("snapkv+kivi2");
  auto ctx = make_context();
  auto c = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  const size_t n = 80;
  const std::vector<float> k = random_floats(n * kRow, 31);
  const std::vector<int32_t> pos = iota_positions(n);
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kvsdk_cache_append(c.get(), l, n, k.data(), k.data(), pos.data(), k.size() * 4), KVSDK_OK);
    const std::vector<float> q = random_floats(4 * kQ * kDim, 40 + l);
    ASSERT_EQ(kvsdk_cache_observe(c.get(), l, 4, q.data(), nullptr, q.size() * 4), KVSDK_OK);
  }
  const kvsdk_cache_stats s0 = stats_of(c.get());
  const std::vector<HeadRows> r0 = read_all(c.get());
  // A budget below the observation windows alone cannot be met.
  EXPECT_EQ(kvsdk_cache_set_budget(c.get(), 100), KVSDK_E_BUDGET);
  EXPECT_EQ(kvsdk_cache_append(c.get(), kLayers, 1, k.data(), k.data(), pos.data(), kRow * 4),
            KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_append(c.get(), 0, 1, nullptr, k.data(), pos.data(), kRow * 4),
            KVSDK_E_INVALID_ARG);
  size_t got = 0;
  std::vector<float> small(kDim);
  EXPECT_EQ(kvsdk_cache_read(c.get(), 0, 0, small.data(), nullptr, nullptr, 1, &got),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_read(c.get(), 0, kKv, nullptr, nullptr, nullptr, 0, &got),
            KVSDK_E_OUT_OF_RANGE);
  const kvsdk_cache_stats s1 = stats_of(c.get());
  EXPECT_EQ(s1.bytes, s0.bytes);
  EXPECT_EQ(s1.tokens, s0.tokens);
  EXPECT_TRUE(read_all(c.get()) == r0);
  // Overlay caches save their KIVI stores (round trips: tests/formats/tier_snapshot_test.cpp).
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  // 'full' takes no overlay.
  kvsdk_policy full;
  ASSERT_EQ(kvsdk_policy_parse(&full, "full+kivi2"), KVSDK_OK);
  kvsdk_cache* none = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&none, ctx.get(), &g, &full), KVSDK_E_UNSUPPORTED);
  EXPECT_EQ(none, nullptr);
  // A budget that can be met compresses to it.
  ASSERT_EQ(kvsdk_cache_set_budget(c.get(), s0.bytes / 2), KVSDK_OK) << kvsdk_last_error();
  EXPECT_LE(stats_of(c.get()).bytes, s0.bytes / 2);
  expect_tiers_add_up(c.get());
}

}  // namespace
