// policy.evict_slack (amortized eviction): the budget holds at every append whatever the slack,
// and a slack of s rows makes a full layer select about once per s appended rows instead of on
// every row (Cache::selection_passes counts the selection passes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "core/cache.h"
#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

struct Counts {
  uint64_t passes = 0;
  uint64_t max_bytes = 0;
  uint64_t cap = 0;  // layer-tokens the budget holds
};

// Appends `n` decode tokens (after a 32-token prefill) to every layer of a cache whose own
// budget is `budget`, observing each step's query; checks the budget after every call.
void run(const char* spec, const kvsdk_geometry& g, float slack, uint64_t budget, size_t n,
         Counts* out) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
  p.evict_slack = slack;
  p.obs_window = 4;
  p.quant_group = 8;
  p.quant_residual = 8;
  auto ctx = make_context();
  auto c = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_set_budget(c.get(), budget), KVSDK_OK);
  const size_t kv = size_t(g.n_kv_heads) * g.head_dim, qe = size_t(g.n_q_heads) * g.head_dim;
  const auto k = random_floats((n + 32) * kv, 11), v = random_floats((n + 32) * kv, 12);
  const auto q = random_floats((n + 32) * qe, 13);
  std::vector<int32_t> pos(n + 32);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  const auto check = [&](const char* what, size_t t) {
    kvsdk_cache_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(kvsdk_cache_stats_get(c.get(), &st), KVSDK_OK);
    ASSERT_LE(st.bytes, budget) << spec << " slack " << slack << ": " << what << " at token " << t;
    out->max_bytes = std::max(out->max_bytes, st.bytes);
  };
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    ASSERT_EQ(kvsdk_cache_append(c.get(), l, 32, k.data(), v.data(), pos.data(), 32 * kv * 4),
              KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_observe(c.get(), l, 1, q.data(), &pos[31], qe * 4), KVSDK_OK);
    check("prefill", 32);
  }
  const uint64_t passes_before = c->impl->selection_passes();
  out->cap = c->impl->token_capacity();
  for (size_t t = 32; t < n + 32; ++t) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      ASSERT_EQ(kvsdk_cache_append(c.get(), l, 1, k.data() + t * kv, v.data() + t * kv, &pos[t],
                                   kv * 4), KVSDK_OK) << kvsdk_last_error();
      check("append", t);
      ASSERT_EQ(kvsdk_cache_observe(c.get(), l, 1, q.data() + t * qe, &pos[t], qe * 4), KVSDK_OK)
          << kvsdk_last_error();
      check("observe", t);
    }
  }
  out->passes = c->impl->selection_passes() - passes_before;
}

const char* const kPresets[] = {"streaming_llm", "h2o", "snapkv", "pyramidkv", "xkv",
                                "xkv+kivi2", "h2o+kivi4"};

TEST(EvictSlack, TheBudgetHoldsAtEveryAppendWhateverTheSlack) {
  const kvsdk_geometry g = make_geometry(3, 4, 2, 16);
  for (const char* spec : kPresets) {
    for (float slack : {0.0f, 0.0625f, 0.25f, 0.5f}) {
      for (uint64_t budget : {uint64_t(6000), uint64_t(12000)}) {
        SCOPED_TRACE(std::string(spec) + " slack " + std::to_string(slack) + " budget " +
                     std::to_string(budget));
        Counts c;
        ASSERT_NO_FATAL_FAILURE(run(spec, g, slack, budget, 96, &c));
        EXPECT_GT(c.max_bytes, budget / 2);  // it filled the budget (then evicted)
      }
    }
  }
}

TEST(EvictSlack, SelectionPassesFallFromOnePerTokenToOnePerSlack) {
  // One layer and one KV head: every appended row past the cap needs an eviction.
  const kvsdk_geometry g = make_geometry(1, 2, 1, 16);
  const size_t n = 512;
  for (const char* spec : {"streaming_llm", "h2o", "snapkv"}) {
    SCOPED_TRACE(spec);
    Counts exact, slack;
    const uint64_t budget = 64 * (16 * 2 * 2 + 4 + 4) + 4 * (2 * 16 * 4 + 4);  // ~64 rows
    ASSERT_NO_FATAL_FAILURE(run(spec, g, 0.0f, budget, n, &exact));
    ASSERT_NO_FATAL_FAILURE(run(spec, g, 0.25f, budget, n, &slack));
    ASSERT_GE(exact.cap, 40u);
    // Exact eviction: a pass on (nearly) every appended token once full.
    EXPECT_GE(exact.passes, n - 64);
    // With a slack of s = floor(0.25 x cap) rows: about n / s passes.
    const uint64_t s = uint64_t(0.25 * double(slack.cap));
    ASSERT_GE(s, 8u);
    EXPECT_LE(slack.passes, n / s + 2) << "cap " << slack.cap << ", slack " << s;
    EXPECT_GE(slack.passes, n / (s + 1) - 2) << "cap " << slack.cap << ", slack " << s;
  }
}

TEST(EvictSlack, OutOfRangeIsInvalidAndOldStructsEvictExactly) {
  const kvsdk_geometry g = make_geometry(1, 2, 1, 16);
  auto ctx = make_context();
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_H2O), KVSDK_OK);
  EXPECT_EQ(p.evict_slack, 0.0625f);
  for (float bad : {-0.01f, 0.51f, 2.0f}) {
    p.evict_slack = bad;
    kvsdk_cache* raw = nullptr;
    EXPECT_EQ(kvsdk_cache_create(&raw, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
    EXPECT_NE(std::string(kvsdk_last_error()).find("evict_slack"), std::string::npos);
    EXPECT_EQ(raw, nullptr);
  }
  // A caller compiled before the field passes the old size: its caches evict exactly, and
  // kvsdk_cache_policy writes only the fields it has.
  p.evict_slack = 0.3f;  // (beyond the old struct: must be ignored)
  p.struct_size = uint32_t(offsetof(kvsdk_policy, evict_slack));
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_create(&raw, ctx.get(), &g, &p), KVSDK_OK) << kvsdk_last_error();
  CachePtr c(raw);
  EXPECT_EQ(c->impl->policy().evict_slack, 0.0f);
  kvsdk_policy old;
  std::memset(&old, 0xAB, sizeof old);
  old.struct_size = uint32_t(offsetof(kvsdk_policy, evict_slack));
  ASSERT_EQ(kvsdk_cache_policy(c.get(), &old), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(old.method, KVSDK_METHOD_H2O);
  unsigned char tail[sizeof(float)];
  std::memset(tail, 0xAB, sizeof tail);
  EXPECT_EQ(std::memcmp(&old.evict_slack, tail, sizeof tail), 0) << "wrote past struct_size";
}

}  // namespace
