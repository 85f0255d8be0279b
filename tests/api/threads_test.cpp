// kvsdk_context_options.n_threads: attention split over the context's threads gives the same bits
// as one thread, for every store that runs heads in parallel and for the others; bad values are
// refused; an app built before the field existed (smaller struct_size) gets the default.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
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
