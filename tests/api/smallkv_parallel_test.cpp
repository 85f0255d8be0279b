// SmallKV with its proxy on another thread (kvsdk_cache_set_proxy_wait): the large cache's
// outputs, rows and stats are bit-identical to the sequential order (proxy step first) while the
// proxy runs each step in parallel, late on purpose at chosen layers, through prefill chunks,
// head matching during decode and evictions; a proxy that never comes makes the waiting call
// fail after the timeout, changing nothing; misuse.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// Large: 3 layers x 4 query heads x 2 KV heads; proxy: 2 layers x 2 query heads x 1 KV head.
constexpr uint32_t kLayers = 3, kPLayers = 2, kQ = 4, kKv = 2, kPQ = 2, kDim = 16;
constexpr int32_t kMatch = 24;

// One step's inputs for both models (the large model's keys follow the proxy's, so that the
// matching has something to find).
struct StepData {
  std::vector<int32_t> pos;
  std::vector<std::vector<float>> pk, pv, pq;  // [proxy layer]
  std::vector<std::vector<float>> k, v, q;     // [large layer]
};

std::vector<StepData> make_steps(const std::vector<size_t>& sizes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<StepData> steps;
  int32_t next = 0;
  for (size_t n : sizes) {
    StepData s;
    s.pos.resize(n);
    std::iota(s.pos.begin(), s.pos.end(), next);
    next += int32_t(n);
    for (uint32_t l = 0; l < kPLayers; ++l) {
      s.pk.emplace_back(n * kDim);
      s.pv.emplace_back(n * kDim);
      s.pq.emplace_back(n * kPQ * kDim);
      for (float& x : s.pk.back()) x = 3.0f * d(rng);
      for (float& x : s.pv.back()) x = d(rng);
      for (float& x : s.pq.back()) x = 3.0f * d(rng);
    }
    for (uint32_t l = 0; l < kLayers; ++l) {
      const uint32_t src = l % kPLayers;
      s.k.emplace_back(n * kKv * kDim);
      s.v.emplace_back(n * kKv * kDim);
      s.q.emplace_back(n * kQ * kDim);
      for (size_t i = 0; i < s.k.back().size(); ++i) {
        s.k.back()[i] = s.pk[src][i % (n * kDim)] + 0.3f * d(rng);
        s.v.back()[i] = d(rng);
      }
      for (size_t i = 0; i < s.q.back().size(); ++i) {
        s.q.back()[i] = s.pq[src][i % (n * kPQ * kDim)] + 0.3f * d(rng);
      }
    }
    steps.push_back(std::move(s));
  }
  return steps;
}

struct Outcome {
  std::vector<std::vector<float>> outputs;  // per step and large layer, the attend's output
  std::vector<std::vector<uint8_t>> rows;   // the large cache's rows at the end (K, V, positions)
  uint64_t bytes = 0;
  uint64_t tokens = 0, appended = 0;  // tokens held and ever appended (fewer held: it evicted)
  bool evicted() const { return tokens < appended * kKv; }
};

struct Pair {
  ContextPtr lctx = make_context(0), pctx = make_context();
  CachePtr large, proxy;
  explicit Pair(uint64_t cache_budget) {
    const kvsdk_geometry lg = make_geometry(kLayers, kQ, kKv, kDim);
    const kvsdk_geometry pg = make_geometry(kPLayers, kPQ, 1, kDim);
    kvsdk_policy p;
    kvsdk_policy_init(&p, KVSDK_METHOD_SMALLKV);
    p.match_tokens = kMatch;
    large = make_cache(lctx.get(), lg, &p);
    proxy = make_cache(pctx.get(), pg);
    EXPECT_EQ(kvsdk_cache_set_budget(large.get(), cache_budget), KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(kvsdk_cache_set_proxy(large.get(), proxy.get()), KVSDK_OK) << kvsdk_last_error();
  }
};

// The proxy's step: append + attend of each layer, in order; `delay_at` (a proxy layer, or -1)
// sleeps before that layer so that the large cache has to wait for it.
void proxy_step(kvsdk_cache* proxy, const StepData& s, int delay_at) {
  const size_t n = s.pos.size();
  for (uint32_t l = 0; l < kPLayers; ++l) {
    if (int(l) == delay_at) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    ASSERT_EQ(kvsdk_cache_append(proxy, l, n, s.pk[l].data(), s.pv[l].data(), s.pos.data(),
                                 s.pk[l].size() * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    std::vector<float> out(s.pq[l].size());
    ASSERT_EQ(kvsdk_cache_attend(proxy, l, n, s.pq[l].data(), s.pos.data(), s.pq[l].size() * 4,
                                 out.data(), out.size() * 4),
              KVSDK_OK)
        << kvsdk_last_error();
  }
}

void large_step(kvsdk_cache* large, const StepData& s, Outcome& run) {
  const size_t n = s.pos.size();
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kvsdk_cache_append(large, l, n, s.k[l].data(), s.v[l].data(), s.pos.data(),
                                 s.k[l].size() * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    std::vector<float> out(s.q[l].size());
    ASSERT_EQ(kvsdk_cache_attend(large, l, n, s.q[l].data(), s.pos.data(), s.q[l].size() * 4,
                                 out.data(), out.size() * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    run.outputs.push_back(std::move(out));
  }
}

void finish(Pair& p, Outcome& run) {
  kvsdk_cache_stats st;
  kvsdk_cache_stats_init(&st);
  ASSERT_EQ(kvsdk_cache_stats_get(p.large.get(), &st), KVSDK_OK);
  run.bytes = st.bytes;
  run.tokens = st.tokens;
  run.appended = st.appended_tokens;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t g = 0; g < kKv; ++g) {
      std::vector<float> k(4096 * kDim), v(4096 * kDim);
      std::vector<int32_t> pos(4096);
      size_t n = 0;
      ASSERT_EQ(kvsdk_cache_read(p.large.get(), l, g, k.data(), v.data(), pos.data(), pos.size(),
                                 &n),
                KVSDK_OK)
          << kvsdk_last_error();
      std::vector<uint8_t> bytes(n * kDim * 8 + n * 4);
      std::memcpy(bytes.data(), k.data(), n * kDim * 4);
      std::memcpy(bytes.data() + n * kDim * 4, v.data(), n * kDim * 4);
      std::memcpy(bytes.data() + n * kDim * 8, pos.data(), n * 4);
      run.rows.push_back(std::move(bytes));
    }
  }
}

Outcome run_sequential(const std::vector<StepData>& steps, uint64_t budget) {
  Pair p(budget);
  Outcome run;
  for (const StepData& s : steps) {
    proxy_step(p.proxy.get(), s, -1);
    large_step(p.large.get(), s, run);
  }
  finish(p, run);
  return run;
}

// `delay`: per step, the proxy layer to be late at (-1: none).
Outcome run_parallel(const std::vector<StepData>& steps, uint64_t budget,
                 const std::vector<int>& delay) {
  Pair p(budget);
  EXPECT_EQ(kvsdk_cache_set_proxy_wait(p.large.get(), 20000), KVSDK_OK) << kvsdk_last_error();
  Outcome run;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::thread proxy_thread(proxy_step, p.proxy.get(), std::cref(steps[i]), delay[i]);
    large_step(p.large.get(), steps[i], run);
    proxy_thread.join();
  }
  finish(p, run);
  return run;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    ASSERT_EQ(a.outputs[i].size(), b.outputs[i].size());
    EXPECT_EQ(std::memcmp(a.outputs[i].data(), b.outputs[i].data(), a.outputs[i].size() * 4), 0)
        << "attend output " << i << " (step " << i / kLayers << ", layer " << i % kLayers
        << ") differs";
  }
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.tokens, b.tokens);
}

// Prefill in chunks of 8, then decode: matching (24 tokens) happens in a decode step.
std::vector<size_t> prefill_then_decode(size_t decode) {
  std::vector<size_t> sizes{8, 8};
  sizes.insert(sizes.end(), decode, 1);
  return sizes;
}

uint64_t full_bytes(size_t tokens) {  // what a smallkv cache holds before it evicts, about
  return uint64_t(tokens) * kLayers * kKv * (2 * kDim * 2 + 8);
}

}  // namespace

TEST(SmallKvParallel, ProxyOnItsOwnThreadGivesTheSequentialBits) {
  const std::vector<StepData> steps = make_steps(prefill_then_decode(60), 11);
  const uint64_t budget = full_bytes(76) / 3;  // evicts from the prefill on
  const Outcome seq = run_sequential(steps, budget);
  ASSERT_TRUE(seq.evicted()) << "the scenario must evict";
  std::mt19937 rng(5);
  std::vector<int> late(steps.size());
  for (int& d : late) d = int(rng() % (kPLayers + 1)) - 1;  // none, or one proxy layer late
  const Outcome par = run_parallel(steps, budget, late);
  expect_same(seq, par);
}

TEST(SmallKvParallel, MatchingAndEvictionWaitForTheWholeProxyStep) {
  // The budget forces the first eviction (and so the matching of every head) during decode,
  // at the large cache's layer-0 append, while the proxy is late at its last layer: the
  // eviction must wait for the proxy's step rather than use the statistics of the step before.
  const std::vector<StepData> steps = make_steps(prefill_then_decode(40), 23);
  const uint64_t budget = full_bytes(20);
  const Outcome seq = run_sequential(steps, budget);
  ASSERT_TRUE(seq.evicted());
  const Outcome par = run_parallel(steps, budget, std::vector<int>(steps.size(), int(kPLayers) - 1));
  expect_same(seq, par);
}

TEST(SmallKvParallel, ThreadsOnUnlimitedBudgetMatchTooAndNeverWaitWhenTheProxyRanFirst) {
  const std::vector<StepData> steps = make_steps(prefill_then_decode(30), 3);
  const Outcome seq = run_sequential(steps, 0);
  const Outcome par = run_parallel(steps, 0, std::vector<int>(steps.size(), 0));
  expect_same(seq, par);
  // With the wait set, a proxy that ran first (same thread) changes nothing either.
  Pair p(0);
  ASSERT_EQ(kvsdk_cache_set_proxy_wait(p.large.get(), 1000), KVSDK_OK);
  Outcome run;
  for (const StepData& s : steps) {
    proxy_step(p.proxy.get(), s, -1);
    large_step(p.large.get(), s, run);
  }
  finish(p, run);
  expect_same(seq, run);
}

TEST(SmallKvParallel, AProxyThatNeverRunsFailsAfterTheTimeoutAndChangesNothing) {
  const std::vector<StepData> steps = make_steps(prefill_then_decode(30), 9);
  Pair p(0);
  Outcome run;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    proxy_step(p.proxy.get(), steps[i], -1);
    large_step(p.large.get(), steps[i], run);
  }
  ASSERT_EQ(kvsdk_cache_set_proxy_wait(p.large.get(), 30), KVSDK_OK);
  const StepData& s = steps.back();
  ASSERT_EQ(kvsdk_cache_append(p.large.get(), 0, 1, s.k[0].data(), s.v[0].data(), s.pos.data(),
                               s.k[0].size() * 4),
            KVSDK_OK);
  kvsdk_cache_stats before;
  kvsdk_cache_stats_init(&before);
  ASSERT_EQ(kvsdk_cache_stats_get(p.large.get(), &before), KVSDK_OK);
  std::vector<float> out(s.q[0].size(), -7.0f);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(kvsdk_cache_attend(p.large.get(), 0, 1, s.q[0].data(), s.pos.data(),
                               s.q[0].size() * 4, out.data(), out.size() * 4),
            KVSDK_E_STATE);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
  EXPECT_NE(std::string(kvsdk_last_error()).find("kvsdk_cache_set_proxy_wait"), std::string::npos)
      << kvsdk_last_error();
  for (float x : out) EXPECT_EQ(x, -7.0f);  // nothing written
  kvsdk_cache_stats after;
  kvsdk_cache_stats_init(&after);
  ASSERT_EQ(kvsdk_cache_stats_get(p.large.get(), &after), KVSDK_OK);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  // The proxy's step arrives late: the same call now succeeds, as in a sequential run.
  proxy_step(p.proxy.get(), s, -1);
  EXPECT_EQ(kvsdk_cache_attend(p.large.get(), 0, 1, s.q[0].data(), s.pos.data(),
                               s.q[0].size() * 4, out.data(), out.size() * 4),
            KVSDK_OK)
      << kvsdk_last_error();
}

TEST(SmallKvParallel, Misuse) {
  EXPECT_EQ(kvsdk_cache_set_proxy_wait(nullptr, 10), KVSDK_E_INVALID_ARG);
  ContextPtr ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  CachePtr full = make_cache(ctx.get(), g);
  EXPECT_EQ(kvsdk_cache_set_proxy_wait(full.get(), 10), KVSDK_E_UNSUPPORTED);
  EXPECT_NE(std::string(kvsdk_last_error()).find("SmallKV"), std::string::npos)
      << kvsdk_last_error();
  // Turning it off, and setting it without a proxy, are fine.
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_SMALLKV);
  CachePtr small = make_cache(ctx.get(), g, &p);
  EXPECT_EQ(kvsdk_cache_set_proxy_wait(small.get(), 10), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_set_proxy_wait(small.get(), 0), KVSDK_OK);
  EXPECT_STREQ(kvsdk_last_error(), "");
}
