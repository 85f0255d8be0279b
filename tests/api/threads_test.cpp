// kvsdk_context_options.n_threads: attention split over the context's threads gives the same bits
// as one thread, for every store that runs heads in parallel and for the others; bad values are
// refused; an app built before the field existed (smaller struct_size) gets the default.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// Outputs of a decode query and of a block of causal queries over a long cache.
std::vector<float> outputs(kvsdk_context* ctx, const char* spec) {
  const kvsdk_geometry g = make_geometry(2, 16, 4, 64);
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
  auto c = make_cache(ctx, g, &p);
  EXPECT_TRUE(c) << kvsdk_last_error();
  const size_t n = 1500, kv = size_t(g.n_kv_heads) * g.head_dim;
  const size_t qe = size_t(g.n_q_heads) * g.head_dim;
  const auto k = random_floats(n * kv, 1), v = random_floats(n * kv, 2), q = random_floats(3 * qe, 3);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(i);
  std::vector<float> all;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    EXPECT_EQ(kvsdk_cache_append(c.get(), l, n, k.data(), v.data(), pos.data(), n * kv * 4),
              KVSDK_OK) << kvsdk_last_error();
    const int32_t qpos[3] = {int32_t(n) - 1, 500, 1200};  // 12 rows x 1500 tokens: parallel
    std::vector<float> out(3 * qe);
    EXPECT_EQ(kvsdk_cache_attend(c.get(), l, 3, q.data(), qpos, q.size() * 4, out.data(),
                                 out.size() * 4), KVSDK_OK) << kvsdk_last_error();
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

TEST(Threads, AttentionGivesTheSameBitsOnAnyNumberOfThreads) {
  auto one = context_with_threads(1), two = context_with_threads(2), four = context_with_threads(4);
  ASSERT_TRUE(one && two && four);
  for (const char* spec : {"full", "kivi", "snapkv+kivi2", "spindlekv", "minicache"}) {
    const std::vector<float> a = outputs(one.get(), spec), b = outputs(two.get(), spec),
                             c = outputs(four.get(), spec);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << spec << ": 1 vs 2 threads";
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << spec << ": 1 vs 4 threads";
  }
}

// SpeCache's decode step (one attend of the output and speculative queries, then the prefetch
// with the speculative query) with its KV heads on the pool, both calls: the same outputs (so
// the same fetched rows) and the same measured hit rate on any number of threads (each head
// stages its own measurement).
struct SpeCacheRun {
  std::vector<float> out;
  double hit_rate = 0;
  uint64_t samples = 0;
};
SpeCacheRun specache_steps(kvsdk_context* ctx) {
  const kvsdk_geometry g = make_geometry(2, 16, 4, 64);
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, "specache"), KVSDK_OK);
  auto c = make_cache(ctx, g, &p);
  EXPECT_TRUE(c) << kvsdk_last_error();
  // Attend: 2 queries x 4 query heads a KV head = 8 rows, prefetch: 4 rows, x 4200 tokens: above
  // Cache's threshold for running heads in parallel.
  const size_t n = 4200, kv = size_t(g.n_kv_heads) * g.head_dim;
  const size_t qe = size_t(g.n_q_heads) * g.head_dim;
  const auto k = random_floats(n * kv, 4), v = random_floats(n * kv, 5), q = random_floats(2 * qe, 6);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(i);
  SpeCacheRun r;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    EXPECT_EQ(kvsdk_cache_append(c.get(), l, n, k.data(), v.data(), pos.data(), n * kv * 4),
              KVSDK_OK) << kvsdk_last_error();
    const int32_t qpos[2] = {int32_t(n), int32_t(n) + 1};
    for (int step = 0; step < 2; ++step) {  // the second attend measures the first's prefetch
      std::vector<float> out(2 * qe);
      EXPECT_EQ(kvsdk_cache_attend(c.get(), l, 2, q.data(), qpos, q.size() * 4, out.data(),
                                   out.size() * 4), KVSDK_OK) << kvsdk_last_error();
      EXPECT_EQ(kvsdk_cache_prefetch(c.get(), l, 1, q.data() + qe, qpos + 1, qe * 4), KVSDK_OK)
          << kvsdk_last_error();
      r.out.insert(r.out.end(), out.begin(), out.end());
    }
  }
  EXPECT_EQ(kvsdk_cache_fetch_stats(c.get(), &r.hit_rate, &r.samples), KVSDK_OK);
  return r;
}

TEST(Threads, SpeCacheGivesTheSameBitsAndHitRateOnAnyNumberOfThreads) {
  auto one = context_with_threads(1), two = context_with_threads(2), four = context_with_threads(4);
  ASSERT_TRUE(one && two && four);
  const SpeCacheRun a = specache_steps(one.get());
  EXPECT_EQ(a.samples, 8u);  // 2 layers x 4 KV heads, measured on the attend after a prefetch
  for (kvsdk_context* ctx : {two.get(), four.get()}) {
    const SpeCacheRun b = specache_steps(ctx);
    ASSERT_EQ(a.out.size(), b.out.size());
    EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4), 0);
    EXPECT_EQ(a.hit_rate, b.hit_rate);
    EXPECT_EQ(a.samples, b.samples);
  }
}

// Split-K: heads of 4,200 tokens are attended in two token ranges (Cache::kSplitTokens) on the
// pool when a call has at most 256 query rows (queries x query heads); a call with more rows
// attends whole heads. Queries of a
// call are independent, so the split call's outputs must agree with the same queries' outputs
// inside a whole-head call: elementwise for the f16 tier, in norm for KIVI (whose value weights
// are quantized per 64-token segment from each range's first token: 14-bit weights here;
// measured 9e-7 and 2e-5 of the norm). A
// split that dropped or double-counted a range, or read another head's queries, is off by tens
// of percent.
struct SplitRun {
  std::vector<float> split, whole;  // [2][n_q_heads * head_dim] each
};
SplitRun split_outputs(kvsdk_context* ctx, const char* spec) {
  const kvsdk_geometry g = make_geometry(1, 8, 2, 64);
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
  p.kivi_weight_bits = 14;
  auto c = make_cache(ctx, g, &p);
  EXPECT_TRUE(c) << kvsdk_last_error();
  const size_t n = 4200, kv = size_t(g.n_kv_heads) * g.head_dim;
  const size_t qe = size_t(g.n_q_heads) * g.head_dim;
  const auto k = random_floats(n * kv, 7), v = random_floats(n * kv, 8);
  const auto q = random_floats(33 * qe, 9);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(i);
  EXPECT_EQ(kvsdk_cache_append(c.get(), 0, n, k.data(), v.data(), pos.data(), n * kv * 4),
            KVSDK_OK) << kvsdk_last_error();
  // Query 0 sees every row, query 1 (a causal one) the rows of the first range and part of the
  // second; the others only fill the whole-head call past 256 rows (33 queries x 8 query heads).
  int32_t qpos[33] = {int32_t(n) - 1, 3000};
  for (int i = 2; i < 33; ++i) qpos[i] = 10 * i;
  SplitRun r;
  r.split.resize(2 * qe);
  std::vector<float> whole(33 * qe);
  EXPECT_EQ(kvsdk_cache_attend(c.get(), 0, 2, q.data(), qpos, 2 * qe * 4, r.split.data(),
                               r.split.size() * 4), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(kvsdk_cache_attend(c.get(), 0, 33, q.data(), qpos, 33 * qe * 4, whole.data(),
                               whole.size() * 4), KVSDK_OK) << kvsdk_last_error();
  r.whole.assign(whole.begin(), whole.begin() + 2 * qe);
  return r;
}

TEST(Threads, SplitKGivesTheSameBitsOnAnyNumberOfThreadsAndAgreesWithWholeHeads) {
  auto one = context_with_threads(1), two = context_with_threads(2), four = context_with_threads(4);
  ASSERT_TRUE(one && two && four);
  for (const char* spec : {"full", "kivi", "snapkv+kivi2"}) {
    const SplitRun a = split_outputs(one.get(), spec);
    for (kvsdk_context* ctx : {two.get(), four.get()}) {
      const SplitRun b = split_outputs(ctx, spec);
      ASSERT_EQ(a.split.size(), b.split.size());
      EXPECT_EQ(std::memcmp(a.split.data(), b.split.data(), a.split.size() * 4), 0) << spec;
    }
    double err = 0, norm = 0, worst = 0;
    for (size_t i = 0; i < a.split.size(); ++i) {
      const double d = double(a.split[i]) - a.whole[i];
      err += d * d, norm += double(a.whole[i]) * a.whole[i];
      worst = std::max(worst, std::fabs(d));
    }
    const bool exact_tier = std::string(spec) == "full";
    if (exact_tier) {
      EXPECT_LT(worst, 1e-5) << spec << ": split vs whole heads, largest difference";
    }
    std::printf("[ split-K  ] %s: relative error %.3g, largest difference %.3g\n", spec,
                std::sqrt(err / norm), worst);
    EXPECT_LT(std::sqrt(err / norm), exact_tier ? 1e-5 : 1e-3) << spec << ": relative error";
  }
}

TEST(Threads, DefaultIsEveryCoreAndBadValuesAreRefused) {
  kvsdk_context_options o;
  ASSERT_EQ(kvsdk_context_options_init(&o), KVSDK_OK);
  EXPECT_EQ(o.n_threads, 0);
  for (int32_t bad : {-1, KVSDK_MAX_THREADS + 1}) {
    o.n_threads = bad;
    kvsdk_context* c = nullptr;
    EXPECT_EQ(kvsdk_context_create(&c, &o), KVSDK_E_INVALID_ARG) << bad;
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::strstr(kvsdk_last_error(), "n_threads"), nullptr) << kvsdk_last_error();
  }
}

TEST(Threads, AnOptionsStructFromBeforeNThreadsIsAccepted) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.n_threads = 12345;  // beyond the old struct_size: never read
  o.struct_size = uint32_t(offsetof(kvsdk_context_options, n_threads));
  kvsdk_context* c = nullptr;
  ASSERT_EQ(kvsdk_context_create(&c, &o), KVSDK_OK) << kvsdk_last_error();
  kvsdk_context_destroy(c);
}

}  // namespace
