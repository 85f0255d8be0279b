// The decode path allocates nothing: once a cache has warmed up, a decode step (append one token to
// every layer, observe and attend its query, and for SpeCache prefetch the next step's rows)
// performs no heap allocation besides the amortized growth of the stored rows. A counting global operator new proves it; heap churn on every step
// is what made compressed presets slower than `full` (page faults, zero-filled scratch, brk TLB
// flushes), so a step that allocates is a regression even when it is fast on this machine.
#include <gtest/gtest.h>

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

namespace {

std::atomic<uint64_t> g_allocations{0};
// KVSDK_ALLOC_BACKTRACE=1 prints the stack of every allocation of the counted steps (to find the
// allocation a change introduced; run one preset with --gtest_filter).
std::atomic<bool> g_trace{false};

void count_allocation() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (g_trace.load(std::memory_order_relaxed)) {
    g_trace = false;  // backtrace() itself may allocate
    void* frames[24];
    const int n = backtrace(frames, 24);
    const char sep[] = "---- allocation in a counted decode step:\n";
    (void)!write(2, sep, sizeof sep - 1);
    backtrace_symbols_fd(frames, n, 2);
    g_trace = true;
  }
}

}  // namespace

void* operator new(size_t n) {
  count_allocation();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  count_allocation();
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

using namespace kvsdk_test;

namespace {

// One decode-path run of a preset: prefill, warm-up, then 16 counted decode steps (append one
// token to every layer, observe and attend its query, and for SpeCache prefetch).
struct DecodeRun {
  uint64_t total = 0;         // allocations in the counted steps
  int steps_allocating = 0;   // counted steps that allocated at all
  kvsdk_cache_stats before{}, after{};  // around the counted steps
};

// `budget` 0: no budget (the cache grows); otherwise the cache's own budget in bytes.
// `slack` < 0: the preset's default evict_slack. `parallel_proxy` (smallkv): the proxy's step runs
// on a second thread while the large cache runs the same step (kvsdk_cache_set_proxy_wait).
// `prefill_steps`: prefill chunks of 96 tokens (96 x 43 = 4,128 tokens: heads long enough for
// Cache::attend to split them into token ranges on the pool).
void run_decode(const char* spec, uint64_t budget, float slack, DecodeRun* run,
                bool parallel_proxy = false, int prefill_steps = 1) {
  const kvsdk_geometry g = make_geometry(4, 8, 2, 64);
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
  p.quant_group = 8;
  p.quant_residual = 8;
  if (slack >= 0) p.evict_slack = slack;
  auto ctx = make_context();
  auto c = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  // SmallKV runs with its proxy, as a host does: the proxy's step (append + attend of each of its
  // layers) comes first, and the large cache reads the proxy's queries of that step.
  const bool smallkv = p.method == KVSDK_METHOD_SMALLKV;
  const kvsdk_geometry pg = make_geometry(2, 4, 1, 64);
  CachePtr proxy;
  if (smallkv) {
    proxy = make_cache(ctx.get(), pg);
    ASSERT_TRUE(proxy);
    ASSERT_EQ(kvsdk_cache_set_proxy(c.get(), proxy.get()), KVSDK_OK) << kvsdk_last_error();
  }
  const size_t pkv = size_t(pg.n_kv_heads) * pg.head_dim, pqe = size_t(pg.n_q_heads) * pg.head_dim;
  const auto pk = random_floats(512 * pkv, 4);
  const auto pq = random_floats(64 * pqe, 5);
  std::vector<float> pout(pqe);
  if (budget) ASSERT_EQ(kvsdk_cache_set_budget(c.get(), budget), KVSDK_OK) << kvsdk_last_error();
  const size_t kv = size_t(g.n_kv_heads) * g.head_dim, qe = size_t(g.n_q_heads) * g.head_dim;
  const auto k = random_floats(512 * kv, 1), v = random_floats(512 * kv, 2);
  std::vector<float> q = random_floats(64 * qe, 3);
  std::vector<float> out(qe);
  const bool prefetches = p.method == KVSDK_METHOD_SPECACHE;
  int32_t pos = 0;
  std::vector<int32_t> ps(512);  // (the test's own buffers are allocated before counting)
  std::vector<int32_t> pps(512);  // the proxy's positions (its own buffer: it may run aside)
  auto proxy_step = [&](size_t n) {
    for (uint32_t l = 0; smallkv && l < pg.n_layers; ++l) {
      for (size_t i = 0; i < n; ++i) pps[i] = pos + int32_t(i);
      const float* pkt = pk.data() + size_t(pos % 384) * pkv;
      EXPECT_EQ(kvsdk_cache_append(proxy.get(), l, n, pkt, pkt, pps.data(), n * pkv * 4),
                KVSDK_OK)
          << kvsdk_last_error();
      const int32_t qp = pos + int32_t(n) - 1;
      EXPECT_EQ(kvsdk_cache_attend(proxy.get(), l, 1, pq.data() + size_t(pos % 64) * pqe, &qp,
                                   pqe * 4, pout.data(), pqe * 4),
                KVSDK_OK)
          << kvsdk_last_error();
    }
  };
  // The proxy's thread, started before anything is counted; steps are handed over through two
  // counters (no allocation, as a host's own worker would do).
  std::atomic<int> proxy_go{0}, proxy_done{0};
  std::atomic<bool> proxy_stop{false};
  std::atomic<size_t> proxy_n{0};
  std::thread proxy_thread;
  if (parallel_proxy) {
    ASSERT_EQ(kvsdk_cache_set_proxy_wait(c.get(), 20000), KVSDK_OK) << kvsdk_last_error();
    proxy_thread = std::thread([&] {
      while (!proxy_stop.load()) {
        if (proxy_go.load() == proxy_done.load()) {
          std::this_thread::yield();
          continue;
        }
        proxy_step(proxy_n.load());
        proxy_done.fetch_add(1);
      }
    });
  }
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{proxy_stop, proxy_thread};
  auto step = [&](size_t n) {
    // Keys differ from step to step (a decode token is new), so codebooks and selections see
    // fresh rows; queries cycle through 64 rows.
    const float* kt = k.data() + size_t(pos % 384) * kv;
    const float* vt = v.data() + size_t(pos % 384) * kv;
    const float* qt = q.data() + size_t(pos % 64) * qe;
    if (parallel_proxy) {
      proxy_n = n;
      proxy_go.fetch_add(1);
    } else {
      proxy_step(n);
    }
    struct JoinProxy {  // the step ends once the proxy's step has (also when an ASSERT returns)
      bool on;
      std::atomic<int>& go;
      std::atomic<int>& done;
      ~JoinProxy() {
        while (on && done.load() != go.load()) std::this_thread::yield();
      }
    } join_proxy{parallel_proxy, proxy_go, proxy_done};
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (size_t i = 0; i < n; ++i) ps[i] = pos + int32_t(i);
      ASSERT_EQ(kvsdk_cache_append(c.get(), l, n, kt, vt, ps.data(), n * kv * 4), KVSDK_OK)
          << kvsdk_last_error();
      const int32_t qp = pos + int32_t(n) - 1;
      ASSERT_EQ(kvsdk_cache_observe(c.get(), l, 1, qt, &qp, qe * 4), KVSDK_OK);
      if (prefetches) {
        ASSERT_EQ(kvsdk_cache_prefetch(c.get(), l, 1, qt, &qp, qe * 4), KVSDK_OK);
      }
      ASSERT_EQ(kvsdk_cache_attend(c.get(), l, 1, qt, &qp, qe * 4, out.data(), qe * 4), KVSDK_OK)
          << kvsdk_last_error();
    }
    while (parallel_proxy && proxy_done.load() != proxy_go.load()) std::this_thread::yield();
    pos += int32_t(n);  // (the proxy's step reads it)
  };
  for (int i = 0; i < prefill_steps; ++i) step(96);  // prefill
  // Warm-up: scratch reaches its size, KIVI flushes once; under a budget, long enough for the
  // stores' capacities to settle through many evict/refill cycles (KIVI overlays alternate two
  // store buffers whose quantized and residual parts shift with every flush).
  for (int i = 0; i < (budget ? 200 : 40); ++i) step(1);
  run->before.struct_size = sizeof run->before;
  run->after.struct_size = sizeof run->after;
  ASSERT_EQ(kvsdk_cache_stats_get(c.get(), &run->before), KVSDK_OK);
  const char* trace = std::getenv("KVSDK_ALLOC_BACKTRACE");
  for (int i = 0; i < 16; ++i) {
    const uint64_t before = g_allocations.load();
    g_trace = trace && *trace == '1';
    step(1);
    g_trace = false;
    const uint64_t n = g_allocations.load() - before;
    run->total += n;
    run->steps_allocating += n > 0;
  }
  ASSERT_EQ(kvsdk_cache_stats_get(c.get(), &run->after), KVSDK_OK);
}

std::string test_name(const std::string& spec) {
  std::string s = spec;
  for (char& ch : s) {
    if (ch == '+') ch = '_';
  }
  return s;
}

// A growing cache (no budget): stored rows grow geometrically (std::vector-style capacity), so a
// step that crosses a capacity allocates; that is amortized O(1) per token, and at most one of
// the 16 counted steps may do it. Every other step must allocate nothing at all.
class DecodeAllocation : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeAllocation, ADecodeStepAllocatesNothing) {
  DecodeRun r;
  ASSERT_NO_FATAL_FAILURE(run_decode(GetParam(), 0, -1.0f, &r));
  std::printf("[ counts   ] %s, growing: %llu allocations in %d of 16 decode steps\n", GetParam(),
              static_cast<unsigned long long>(r.total), r.steps_allocating);
  // SmallKV runs two caches (its proxy's too), whose rows cross a capacity in different steps.
  const int growth_steps = std::string(GetParam()) == "smallkv" ? 2 : 1;
  EXPECT_LE(r.steps_allocating, growth_steps)
      << GetParam() << ": " << r.total << " allocations in " << r.steps_allocating
      << " of 16 decode steps";
}

// Long heads are attended in token ranges on the context's pool (split-K, two parts a head at
// 4,184 tokens): the parts' softmax states live in the cache's reused scratch, so a step still
// allocates only when the stored rows cross a capacity.
TEST(DecodeAllocationSplitK, LongCachesAllocateOnlyToGrow) {
  for (const char* spec : {"full", "kivi"}) {
    DecodeRun r;
    ASSERT_NO_FATAL_FAILURE(run_decode(spec, 0, -1.0f, &r, false, /*prefill_steps=*/43));
    ASSERT_GT(r.before.tokens, 4 * 2 * 4096u) << spec;  // layer-head tokens: 4 layers x 2 heads
    std::printf("[ counts   ] %s, %llu tokens a head: %llu allocations in %d of 16 decode "
                "steps\n", spec, static_cast<unsigned long long>(r.before.tokens / 8),
                static_cast<unsigned long long>(r.total), r.steps_allocating);
    EXPECT_LE(r.steps_allocating, 1) << spec << ": " << r.total << " allocations in "
                                     << r.steps_allocating << " of 16 decode steps";
  }
}

// SmallKV with its proxy on another thread (kvsdk_cache_set_proxy_wait): the large cache's waits
// and the proxy's thread computing the read heads' probabilities allocate nothing either, growing
// (amortized, as above) and full and evicting.
TEST(DecodeAllocationParallelProxy, SmallKvGrowingAllocatesOnlyToGrow) {
  DecodeRun r;
  ASSERT_NO_FATAL_FAILURE(run_decode("smallkv", 0, -1.0f, &r, /*parallel_proxy=*/true));
  std::printf("[ counts   ] smallkv, proxy in parallel, growing: %llu allocations in %d of 16 "
              "decode steps\n", static_cast<unsigned long long>(r.total), r.steps_allocating);
  EXPECT_LE(r.steps_allocating, 2);
}

TEST(DecodeAllocationParallelProxy, SmallKvFullAndEvictingAllocatesNothing) {
  const uint64_t budget = 4 * 40 * 520 + 8192;
  for (float slack : {0.0f, -1.0f}) {
    DecodeRun r;
    ASSERT_NO_FATAL_FAILURE(run_decode("smallkv", budget, slack, &r, /*parallel_proxy=*/true));
    EXPECT_LT(r.after.tokens, r.before.tokens + 2 * 64u);
    EXPECT_LE(r.after.bytes, budget);
    EXPECT_EQ(r.total, 0u) << "slack " << slack << ": " << r.total << " allocations in "
                           << r.steps_allocating << " of 16 steps";
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, DecodeAllocation,
                         ::testing::Values("full", "streaming_llm", "h2o", "snapkv", "pyramidkv",
                                           "xkv", "xkv+kivi2", "h2o+kivi4", "kivi", "spindlekv",
                                           "minicache", "smallkv", "specache"),
                         [](const auto& info) { return test_name(info.param); });

// Steady state of an evicting preset: under a budget far below what the decode steps append, the
// cache is full and evicts during the counted steps; nothing grows, so no step may allocate, with
// exact eviction (slack 0: a selection pass on every step) and with the default slack.
struct Evicting {
  const char* spec;
  float slack;
};

class SteadyStateEviction : public ::testing::TestWithParam<Evicting> {};

TEST_P(SteadyStateEviction, NoStepAllocates) {
  // About 40 layer-tokens per layer of 520 bytes each (the prefill alone appends 96).
  const uint64_t budget = 4 * 40 * 520 + 8192;
  DecodeRun r;
  ASSERT_NO_FATAL_FAILURE(run_decode(GetParam().spec, budget, GetParam().slack, &r));
  std::printf("[ counts   ] %s, slack %g, full and evicting: %llu allocations in %d of 16 steps\n",
              GetParam().spec, double(GetParam().slack),
              static_cast<unsigned long long>(r.total), r.steps_allocating);
  // It did evict in the counted steps: 64 layer-tokens were appended, the cache kept fewer.
  const uint64_t appended = r.after.appended_tokens - r.before.appended_tokens;  // layer-tokens
  EXPECT_EQ(appended, 64u);
  EXPECT_LT(r.after.tokens, r.before.tokens + 2 * appended);
  EXPECT_LE(r.after.bytes, budget);
  EXPECT_EQ(r.total, 0u) << GetParam().spec << ": " << r.total << " allocations in "
                         << r.steps_allocating << " of 16 steps of a full cache";
}

const Evicting kEvicting[] = {
    {"streaming_llm", 0.0f}, {"streaming_llm", -1.0f}, {"h2o", 0.0f},   {"h2o", -1.0f},
    {"snapkv", 0.0f},        {"snapkv", -1.0f},        {"pyramidkv", 0.0f}, {"pyramidkv", -1.0f},
    {"xkv", 0.0f},           {"xkv", -1.0f},           {"xkv+kivi2", 0.0f}, {"xkv+kivi2", -1.0f},
    {"h2o+kivi4", 0.0f},     {"h2o+kivi4", -1.0f},    {"smallkv", 0.0f},   {"smallkv", -1.0f},
    // (spindlekv is not here: its codebook layers never evict, so its cache never stops growing;
    // its deep layers evict through the same selection stage as the presets above.)
};

INSTANTIATE_TEST_SUITE_P(Presets, SteadyStateEviction, ::testing::ValuesIn(kEvicting),
                         [](const auto& info) {
                           return test_name(info.param.spec) +
                                  (info.param.slack == 0.0f ? "_exact" : "_slack");
                         });

}  // namespace
