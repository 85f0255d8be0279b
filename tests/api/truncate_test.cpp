// kvsdk_cache_truncate (issue 16): for every preset, a conversation that takes a detour (tokens
// appended and attended, then truncated away) continues exactly as one that never took it: the
// same attention outputs, bit for bit, and the same snapshot. Where a tier cannot be exact the
// call refuses with KVSDK_E_STATE and changes nothing; each preset's scenario stays within the
// reach kvsdk.h states for it (after an eviction, inside KIVI's residual window since its last
// flush, after a codebook or merge layer's first batch, no attention statistics on the detour
// for SmallKV), and the refusals below check where that reach ends.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "preset_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16;
constexpr uint32_t kPLayers = 2, kPQ = 2;  // SmallKV's proxy: 1 KV head
constexpr size_t kKvRow = size_t(kKv) * kDim, kQRow = size_t(kQ) * kDim;
// The scenario: a prefill of kPrefill tokens in one append per layer, kShared decode steps, then
// the detour (kDetour steps that the other conversation never takes) and kTruth steps after it.
// KIVI blocks of 8 with a residual of 4 flush at 12, 20, 28 tokens: the shared steps end on a
// flush, so the detour and the truth stay inside the residual window.
constexpr int32_t kPrefill = 24, kShared = 4, kDetour = 3, kTruth = 4;
constexpr int32_t kCut = kPrefill + kShared;

class Truncate : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    policy = small_policy(GetParam(), 8);
    policy.evict_slack = 0.5f;  // after an eviction, room for the rest of the scenario
    // minicache+kivi4 quantizes only the merged tokens' directions: the prefill keeps
    // ceil(γ·24) = 2 tokens unmerged, so that KIVI store's flushes come 2 tokens later than the
    // comment above says (at 14, 22, 30 tokens), the last inside the detour: its tokens made a
    // flush quantize older directions, which no truncation can undo (MiniCacheKiviTruncate below
    // checks that refusal). A residual of 6 flushes at 16 and 24 tokens and not again before 32,
    // so the detour stays inside the residual window.
    if (std::string(GetParam()) == "minicache+kivi4") policy.quant_residual = 6;
    smallkv = policy.method == KVSDK_METHOD_SMALLKV;
    specache = policy.method == KVSDK_METHOD_SPECACHE;
    g = make_geometry(kLayers, kQ, kKv, kDim);
    ctx = make_context();
    ASSERT_TRUE(ctx);
  }

  // 26 exact tokens per layer for the eviction presets: the history evicts (the observation
  // windows take their share), with a slack that leaves room for the rest of the scenario without
  // another eviction.
  Chat start() {
    return start_chat(ctx.get(), g, policy, GetParam(), 26 * kLayers * exact_bytes_per_token(g),
                      make_geometry(kPLayers, kPQ, 1, kDim));
  }

  // `n` tokens from position `pos` in one append per layer, with inputs drawn from `seed`, each
  // layer attended by the same tokens' queries (causal) and observed (the eviction presets'
  // signal) unless `detour`; SpeCache prefetches the next step's queries. Returns the outputs.
  std::vector<float> tokens(Chat& c, int32_t pos, size_t n, uint32_t seed, bool detour = false) {
    SCOPED_TRACE("position " + std::to_string(pos));
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    auto noise = [&](size_t count) {
      std::vector<float> x(count);
      for (float& e : x) e = d(rng);
      return x;
    };
    const std::vector<int32_t> p = iota_positions(n, pos);
    // SmallKV's attention statistics (and its proxy's) cannot be taken back: the detour only
    // appends there.
    const bool attend = !(smallkv && detour);
    std::vector<float> outs;
    if (smallkv) {
      for (uint32_t l = 0; l < kPLayers; ++l) {
        const std::vector<float> k = noise(n * kDim), v = noise(n * kDim), q = noise(n * kPQ * kDim);
        std::vector<float> o(n * kPQ * kDim);
        EXPECT_EQ(kvsdk_cache_append(c.proxy.get(), l, n, k.data(), v.data(), p.data(),
                                     n * kDim * 4),
                  KVSDK_OK);
        if (!attend) continue;
        EXPECT_EQ(kvsdk_cache_attend(c.proxy.get(), l, n, q.data(), p.data(), n * kPQ * kDim * 4,
                                     o.data(), n * kPQ * kDim * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
    }
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<float> k = noise(n * kKvRow), v = noise(n * kKvRow), q = noise(n * kQRow);
      std::vector<float> o(n * kQRow);
      EXPECT_EQ(kvsdk_cache_append(c.cache.get(), l, n, k.data(), v.data(), p.data(),
                                   n * kKvRow * 4),
                KVSDK_OK)
          << kvsdk_last_error();
      if (attend) {
        EXPECT_EQ(kvsdk_cache_attend(c.cache.get(), l, n, q.data(), p.data(), n * kQRow * 4,
                                     o.data(), n * kQRow * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
      if (!detour) {
        EXPECT_EQ(kvsdk_cache_observe(c.cache.get(), l, n, q.data(), p.data(), n * kQRow * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
      if (specache) prefetch(c, l, pos + int32_t(n), seed);
      outs.insert(outs.end(), o.begin(), o.end());
    }
    return outs;
  }

  // SpeCache: the speculative queries of the step at `next` for one layer.
  void prefetch(Chat& c, uint32_t l, int32_t next, uint32_t seed) {
    const std::vector<float> q = random_floats(kQRow, seed * 31 + l);
    EXPECT_EQ(kvsdk_cache_prefetch(c.cache.get(), l, 1, q.data(), &next, kQRow * 4), KVSDK_OK)
        << kvsdk_last_error();
  }

  void steps(Chat& c, int32_t from, int32_t count, uint32_t seed, bool detour = false,
             std::vector<float>* outs = nullptr) {
    for (int32_t t = from; t < from + count; ++t) {
      std::vector<float> o = tokens(c, t, 1, seed + uint32_t(t), detour);
      if (outs) outs->insert(outs->end(), o.begin(), o.end());
    }
  }

  // The shared history up to kCut.
  void history(Chat& c) {
    tokens(c, 0, kPrefill, 11);
    steps(c, kPrefill, kShared, 100);
  }

  kvsdk_status truncate(Chat& c, int32_t position) {
    const kvsdk_status s = kvsdk_cache_truncate(c.cache.get(), position);
    if (s == KVSDK_OK && smallkv) {
      EXPECT_EQ(kvsdk_cache_truncate(c.proxy.get(), position), KVSDK_OK) << kvsdk_last_error();
    }
    // SpeCache: what was fetched for the detour's next step is gone; the app speculates again.
    if (s == KVSDK_OK && specache) {
      for (uint32_t l = 0; l < kLayers; ++l) prefetch(c, l, position, 100 + uint32_t(position - 1));
    }
    return s;
  }

  kvsdk_policy policy{};
  kvsdk_geometry g{};
  ContextPtr ctx;
  bool smallkv = false, specache = false;
};

TEST_P(Truncate, ADetourTruncatedAwayLeavesNoTrace) {
  Chat a = start(), b = start();
  history(a);
  history(b);
  if (evicts(GetParam()) && policy.quant_bits == 0) {  // (+kivi: compressed rows fit the budget)
    kvsdk_cache_stats st;
    kvsdk_cache_stats_init(&st);
    ASSERT_EQ(kvsdk_cache_stats_get(b.cache.get(), &st), KVSDK_OK);
    EXPECT_LT(st.tokens, uint64_t(kCut) * kLayers * kKv) << "the history evicted";
  }
  const uint64_t before_detour = used(ctx.get());
  steps(b, kCut, kDetour, 900, /*detour=*/true);
  EXPECT_GT(used(ctx.get()), before_detour);
  ASSERT_EQ(truncate(b, kCut), KVSDK_OK) << kvsdk_last_error();
  EXPECT_STREQ(kvsdk_last_error(), "");
  EXPECT_EQ(snapshot(b.cache.get()), snapshot(a.cache.get()))
      << "the truncated cache holds what the one without the detour holds";
  EXPECT_EQ(used(ctx.get()), before_detour) << "the detour's bytes went back to the context";
  std::vector<float> oa, ob;
  steps(a, kCut, kTruth, 100, false, &oa);
  steps(b, kCut, kTruth, 100, false, &ob);
  EXPECT_EQ(float_digest(ob), float_digest(oa)) << "the same attention outputs, bit for bit";
  EXPECT_EQ(snapshot(b.cache.get()), snapshot(a.cache.get()));
}

TEST_P(Truncate, APositionPastEveryTokenIsANoOp) {
  Chat a = start();
  history(a);
  const std::vector<uint8_t> snap = snapshot(a.cache.get());
  EXPECT_EQ(kvsdk_cache_truncate(a.cache.get(), kCut), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(kvsdk_cache_truncate(a.cache.get(), KVSDK_MAX_POSITION), KVSDK_OK);
  EXPECT_EQ(snapshot(a.cache.get()), snap);
}

TEST_P(Truncate, BeyondItsReachAPolicyRefusesAndChangesNothing) {
  // A cut inside the prefill: every policy but full compressed, evicted, merged, encoded or
  // attended those tokens together with the ones before them.
  Chat a = start();
  history(a);
  const uint64_t before = used(ctx.get());
  const std::vector<uint8_t> snap = snapshot(a.cache.get());
  const kvsdk_status s = kvsdk_cache_truncate(a.cache.get(), kPrefill / 2);
  if (std::string(GetParam()) == "full") {
    EXPECT_EQ(s, KVSDK_OK) << kvsdk_last_error();
    return;
  }
  EXPECT_EQ(s, KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("exactly"), std::string::npos)
      << kvsdk_last_error();
  EXPECT_EQ(used(ctx.get()), before);
  EXPECT_EQ(snapshot(a.cache.get()), snap);
  // And it still works afterwards.
  steps(a, kCut, 2, 100);
}

TEST_P(Truncate, AJournalDeltaRecordsTheTruncation) {
  // Unique per process and preset: ctest runs the presets in parallel.
  std::string name = GetParam();
  std::replace(name.begin(), name.end(), '+', '_');
  const std::string path = ::testing::TempDir() + "truncate_" + std::to_string(getpid()) + "_" +
                           name + ".kvs";
  Chat b = start();
  history(b);
  kvsdk_save_options opt;
  kvsdk_save_options_init(&opt);
  ASSERT_EQ(kvsdk_cache_save(b.cache.get(), path.c_str(), &opt), KVSDK_OK) << kvsdk_last_error();
  steps(b, kCut, kDetour, 900, /*detour=*/true);
  ASSERT_EQ(kvsdk_cache_save_delta(b.cache.get(), path.c_str(), &opt), KVSDK_OK)
      << kvsdk_last_error();
  ASSERT_EQ(truncate(b, kCut), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save_delta(b.cache.get(), path.c_str(), &opt), KVSDK_OK)
      << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), nullptr, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  EXPECT_EQ(snapshot(loaded.get()), snapshot(b.cache.get()));
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Presets, Truncate, ::testing::ValuesIn(kPresets), preset_name);

TEST(MiniCacheKiviTruncate, ADetourThatFlushedTheDirectionsIsRefused) {
  // minicache+kivi4 with the scenario's KIVI window (G 8, R 4): the merged directions flush at 12,
  // 20, 28 merged tokens; the prefill retains 2 of its 24 tokens unmerged (and, with these inputs,
  // no later token), so the flush at 28 comes with the detour's second token. It quantized
  // directions that the history without the detour holds exact: the cut is refused and nothing
  // changes. Tokens appended after that flush can go.
  ContextPtr ctx = make_context();
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "minicache+kivi4"), KVSDK_OK);
  p.quant_group = 8;
  p.quant_residual = 4;
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  CachePtr c = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  auto feed = [&](int32_t pos, size_t n, uint32_t seed) {
    const std::vector<float> k = random_floats(n * kKvRow, seed), v = random_floats(n * kKvRow, seed + 1);
    const std::vector<int32_t> ps = iota_positions(n, pos);
    for (uint32_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(kvsdk_cache_append(c.get(), l, n, k.data(), v.data(), ps.data(), n * kKvRow * 4),
                KVSDK_OK)
          << kvsdk_last_error();
    }
  };
  feed(0, kPrefill, 1);
  for (int32_t t = kPrefill; t < kCut + kDetour; ++t) feed(t, 1, 10 + uint32_t(t));
  const uint64_t before = used(ctx.get());
  const std::vector<uint8_t> snap = snapshot(c.get());
  EXPECT_EQ(kvsdk_cache_truncate(c.get(), kCut), KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("since the last flush"), std::string::npos)
      << kvsdk_last_error();
  EXPECT_EQ(used(ctx.get()), before);
  EXPECT_EQ(snapshot(c.get()), snap);
  feed(kCut + kDetour, 1, 99);
  EXPECT_EQ(kvsdk_cache_truncate(c.get(), kCut + kDetour), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(snapshot(c.get()), snap);
}

TEST(TruncateFull, CutsAnywhereAsIfTheTokensNeverCame) {
  // 'full' keeps no history: any cut is exact, and the cache equals one that got only the
  // tokens before it.
  ContextPtr ctx = make_context();
  const kvsdk_geometry g = make_geometry(2, 2, 1, 8);
  CachePtr a = make_cache(ctx.get(), g), b = make_cache(ctx.get(), g);
  const std::vector<float> k = random_floats(20 * 8, 1), v = random_floats(20 * 8, 2);
  const std::vector<int32_t> p = iota_positions(20);
  for (uint32_t l = 0; l < 2; ++l) {
    ASSERT_EQ(kvsdk_cache_append(a.get(), l, 20, k.data(), v.data(), p.data(), 20 * 8 * 4),
              KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_append(b.get(), l, 7, k.data(), v.data(), p.data(), 7 * 8 * 4),
              KVSDK_OK);
  }
  ASSERT_EQ(kvsdk_cache_truncate(a.get(), 7), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(snapshot(a.get()), snapshot(b.get()));
  ASSERT_EQ(kvsdk_cache_truncate(a.get(), 0), KVSDK_OK);
  kvsdk_cache_stats s;
  kvsdk_cache_stats_init(&s);
  ASSERT_EQ(kvsdk_cache_stats_get(a.get(), &s), KVSDK_OK);
  EXPECT_EQ(s.tokens, 0u);
  EXPECT_EQ(s.bytes, 0u);
}

TEST(TruncateArgs, BadArgumentsAreRefused) {
  ContextPtr ctx = make_context();
  CachePtr c = make_cache(ctx.get(), make_geometry(1, 2, 1, 8));
  EXPECT_EQ(kvsdk_cache_truncate(nullptr, 0), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_truncate(c.get(), -1), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()).find("KVSDK_MAX_POSITION"), std::string::npos);
  EXPECT_EQ(kvsdk_cache_truncate(c.get(), INT32_MAX), KVSDK_E_INVALID_ARG);
}

}  // namespace
