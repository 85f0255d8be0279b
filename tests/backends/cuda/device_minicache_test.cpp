// Policy 'minicache' on a CUDA context (the device MiniCache store, src/repr/device_minicache.h),
// against the same calls on the CPU reference backend (the oracle, src/repr/minicache_repr.h):
// the device store merges the same tokens at the same appends, so rows (restored merged rows,
// retained rows and the pending rows of a pair's leading layer) must be the CPU's bit for bit,
// attention within the decode kernel's tolerance (2e-4 absolute), stats bytes per tier and the
// context charges equal, snapshots byte-identical and loadable on the other backend, truncation
// allowed and refused exactly where the CPU allows and refuses it (refusals changing nothing),
// bad input failing with the CPU's status, and the arena never above the budget.
//
// Why layer by layer: a pair merges when its second layer's append arrives, so the tests append
// the pair's layers in either order and in chunks of different sizes (the common prefix merges,
// the rest waits), with exact layers below the boundary and an uncovered last layer.
//
// Built twice, like device_cache_test.cpp: with CUDA (cuda_backend_test) and against the host
// execution shim (cuda_host_cache_test).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "device_cache_util.h"
#include "../../api/preset_util.h"
#include "../../formats/snapshot_test_util.h"
#include "kvsdk.h"
#include "test_util.h"

namespace {

using kvsdk_test::CachePtr;
using kvsdk_test::ContextPtr;
using namespace kvsdk_device_test;

kvsdk_policy minicache_policy(float retain_ratio) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, "minicache"), KVSDK_OK) << kvsdk_last_error();
  p.retain_ratio = retain_ratio;
  return p;
}

void expect_same_accounting(kvsdk_cache* a, kvsdk_cache* b, const kvsdk_geometry& g) {
  const kvsdk_cache_stats sa = stats(a), sb = stats(b);
  EXPECT_EQ(sa.tokens, sb.tokens);
  EXPECT_EQ(sa.bytes, sb.bytes);
  for (int t = 0; t < KVSDK_TIER_SLOTS; ++t) {
    EXPECT_EQ(sa.bytes_by_tier[t], sb.bytes_by_tier[t]) << "tier " << t;
  }
  EXPECT_EQ(sa.context_used_bytes, sb.context_used_bytes);
  // The arena: the budget; what the store reserves never exceeds it (nor what it is charged).
  EXPECT_EQ(sa.device_arena_bytes, sa.budget_bytes);
  EXPECT_LE(sa.device_reserved_bytes, sa.device_arena_bytes);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    kvsdk_layer_stats x, y;
    kvsdk_layer_stats_init(&x);
    kvsdk_layer_stats_init(&y);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(a, l, &x), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(b, l, &y), KVSDK_OK);
    EXPECT_EQ(0, std::memcmp(&x, &y, sizeof(x))) << "layer stats " << l;
  }
}

// A device cache and a CPU reference cache fed the same calls.
struct Rig {
  kvsdk_geometry g{};
  ContextPtr gpu, cpu;  // (a fork's rig holds none: gctx, cctx are its parent's)
  kvsdk_context* gctx = nullptr;
  kvsdk_context* cctx = nullptr;
  CachePtr a, b;
  std::vector<int32_t> count;  // tokens appended per layer
  uint32_t seed = 100;

  // Appends positions [count[l], count[l] + n) to layer l of both (the same rows); expects the
  // same status and, with `check`, compares the layer's rows and the accounting.
  kvsdk_status step(uint32_t l, size_t n, bool check = true) {
    const std::vector<int32_t> pos = kvsdk_test::iota_positions(n, count[l]);
    const kvsdk_status sa = append_at(a.get(), g, l, pos, seed);
    const kvsdk_status sb = append_at(b.get(), g, l, pos, seed);
    EXPECT_EQ(sa, sb) << "layer " << l << ": " << kvsdk_last_error();
    seed += 10;
    if (sa == KVSDK_OK) count[l] += int32_t(n);
    if (check) {
      expect_same_layer_rows(a.get(), b.get(), g, l);
      expect_same_accounting(a.get(), b.get(), g);
      EXPECT_EQ(kvsdk_test::used(gctx), kvsdk_test::used(cctx));
    }
    return sa;
  }
  void attend_all(uint32_t l, uint32_t s) {
    const int32_t newest = std::max(count[l] - 1, 0);
    expect_same_attention(a.get(), b.get(), g, l,
                          {INT32_MAX, newest, newest / 2, 0, std::max(newest - 2, 0)}, s);
  }
};

// 5 layers: 0, 1 exact (below the boundary 2), the pair 2+3, 4 uncovered (no partner).
bool make_rig(Rig& r, uint32_t dim, uint32_t q_heads, uint32_t kv_heads, float retain,
              uint64_t budget) {
  r.g = kvsdk_test::make_geometry(5, q_heads, kv_heads, dim);
  const kvsdk_policy p = minicache_policy(retain);
  if (cuda_context(budget, r.gpu) != KVSDK_OK) return false;
  r.cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  r.gctx = r.gpu.get();
  r.cctx = r.cpu.get();
  r.a = kvsdk_test::make_cache(r.gpu.get(), r.g, &p);
  EXPECT_TRUE(r.a) << "minicache on CUDA: " << kvsdk_last_error();
  r.b = kvsdk_test::make_cache(r.cpu.get(), r.g, &p);
  EXPECT_TRUE(r.b) << kvsdk_last_error();
  r.count.assign(5, 0);
  return r.a && r.b;
}

#define MINICACHE_RIG_OR_SKIP(r, dim, q, kv, retain, budget)                       \
  Rig r;                                                                            \
  {                                                                                 \
    ContextPtr probe_;                                                              \
    const kvsdk_status st_ = cuda_context((budget), probe_);                        \
    if (st_ == KVSDK_E_BACKEND) KVSDK_NO_CUDA_DEVICE(kvsdk_last_error());           \
    ASSERT_EQ(st_, KVSDK_OK) << kvsdk_last_error();                                 \
  }                                                                                 \
  ASSERT_TRUE(make_rig(r, dim, q, kv, retain, budget))

struct Case {
  uint32_t dim, q_heads, kv_heads;
  float retain;
};

class DeviceMiniCache : public ::testing::TestWithParam<Case> {};

// Prefill in chunks with either layer of the pair leading and chunks of different sizes, then
// decode steps of one token per layer (the leader waits one layer, the partner merges it); rows,
// accounting and attention after every append that changes the pair.
TEST_P(DeviceMiniCache, ConversationMatchesTheCpuReference) {
  const Case c = GetParam();
  MINICACHE_RIG_OR_SKIP(r, c.dim, c.q_heads, c.kv_heads, c.retain, 32u << 20);
  // Prefill: layers in order (2 leads), then 3 leading with a longer chunk, then 2 catching up
  // in two pieces (the common prefix merges, the rest of the leader waits).
  for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 40), KVSDK_OK);
  r.attend_all(2, 1);
  r.attend_all(3, 2);
  for (uint32_t l : {3u, 0u, 1u, 4u}) ASSERT_EQ(r.step(l, 25), KVSDK_OK);
  r.attend_all(3, 3);  // 25 pending rows in layer 3
  ASSERT_EQ(r.step(2, 10), KVSDK_OK);
  r.attend_all(3, 4);  // 15 still pending
  r.attend_all(2, 5);
  ASSERT_EQ(r.step(2, 30), KVSDK_OK);  // 15 merge, 15 now wait in layer 2
  r.attend_all(2, 6);
  ASSERT_EQ(r.step(3, 15), KVSDK_OK);
  // The leader appends twice before its partner (the second chunk waits after the first), then
  // the partner merges both at once.
  ASSERT_EQ(r.step(2, 5), KVSDK_OK);
  ASSERT_EQ(r.step(2, 6), KVSDK_OK);
  r.attend_all(2, 7);
  ASSERT_EQ(r.step(3, 11), KVSDK_OK);
  for (uint32_t l : {0u, 1u, 4u}) ASSERT_EQ(r.step(l, 11), KVSDK_OK);
  ASSERT_FALSE(HasFailure());
  const kvsdk_cache_stats s = stats(r.a.get());
  EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_MERGED], 0u);
  // Decode: one token per layer per step.
  for (int t = 0; t < 24; ++t) {
    for (uint32_t l = 0; l < 5; ++l) {
      const bool check = l >= 2 && l <= 3 && t % 4 == 0;
      ASSERT_EQ(r.step(l, 1, check), KVSDK_OK);
      if (check) r.attend_all(l, 100 + t);
    }
    ASSERT_FALSE(HasFailure());
  }
  expect_same_rows(r.a.get(), r.b.get(), r.g);
  expect_same_accounting(r.a.get(), r.b.get(), r.g);
  for (uint32_t l = 0; l < 5; ++l) r.attend_all(l, 200 + l);
  EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == kvsdk_test::snapshot(r.b.get()));
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeviceMiniCache,
                         ::testing::Values(Case{64, 4, 2, 0.05f}, Case{128, 2, 1, 0.25f},
                                           Case{256, 3, 3, 0.1f}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return "dim" + std::to_string(c.dim) + "_q" +
                                  std::to_string(c.q_heads) + "_kv" +
                                  std::to_string(c.kv_heads) + "_retain" +
                                  std::to_string(int(c.retain * 100));
                         });

// A conversation that ends with rows pending in a leading layer: snapshots are the CPU's bytes,
// each side's loads on the other backend, and both continue alike.
TEST(DeviceMiniCacheSnapshot, SavesAndLoadsBothWays) {
  MINICACHE_RIG_OR_SKIP(r, 64, 4, 2, 0.2f, 16u << 20);
  for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 30, false), KVSDK_OK);
  for (int t = 0; t < 3; ++t) {
    for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 1, false), KVSDK_OK);
  }
  ASSERT_EQ(r.step(2, 4, false), KVSDK_OK);  // pending in layer 2
  const auto x = kvsdk_test::save_buffer(r.a.get()), y = kvsdk_test::save_buffer(r.b.get());
  ASSERT_FALSE(x.empty());
  EXPECT_TRUE(x == y) << "snapshot bytes";
  CachePtr on_gpu = kvsdk_test::load_buffer(r.gpu.get(), y);  // the CPU's, on CUDA
  ASSERT_TRUE(on_gpu) << kvsdk_last_error();
  CachePtr on_cpu = kvsdk_test::load_buffer(r.cpu.get(), x);  // the device's, on the CPU
  ASSERT_TRUE(on_cpu) << kvsdk_last_error();
  expect_same_rows(on_gpu.get(), r.b.get(), r.g);
  expect_same_rows(on_cpu.get(), r.b.get(), r.g);
  expect_same_accounting(on_gpu.get(), on_cpu.get(), r.g);
  EXPECT_TRUE(kvsdk_test::save_buffer(on_gpu.get()) == y) << "saved again: the same bytes";
  EXPECT_TRUE(kvsdk_test::save_buffer(on_cpu.get()) == x);
  ASSERT_FALSE(HasFailure());
  // The loaded caches continue alike: the partner merges the pending rows, then decode steps.
  r.a = std::move(on_gpu);
  r.b = std::move(on_cpu);
  ASSERT_EQ(r.step(3, 4), KVSDK_OK);
  for (int t = 0; t < 3; ++t) {
    for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 1, l == 3), KVSDK_OK);
  }
  r.attend_all(2, 7);
  r.attend_all(3, 8);
  EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == kvsdk_test::snapshot(r.b.get()));
}

// Forks (the snapshot's records, without the bytes) continue like the CPU's, beside their parents
// in the same arena.
TEST(DeviceMiniCacheFork, ForksContinueLikeTheCpu) {
  MINICACHE_RIG_OR_SKIP(r, 128, 2, 1, 0.2f, 16u << 20);
  for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 21, false), KVSDK_OK);
  ASSERT_EQ(r.step(3, 3, false), KVSDK_OK);  // pending in layer 3
  kvsdk_cache* fa = nullptr;
  kvsdk_cache* fb = nullptr;
  ASSERT_EQ(kvsdk_cache_fork(&fa, r.a.get()), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_fork(&fb, r.b.get()), KVSDK_OK) << kvsdk_last_error();
  Rig f;
  f.g = r.g;
  f.gctx = r.gctx;
  f.cctx = r.cctx;
  f.a.reset(fa);
  f.b.reset(fb);
  f.count = r.count;
  f.seed = 900;
  expect_same_rows(f.a.get(), f.b.get(), f.g);
  for (int t = 0; t < 4; ++t) {
    for (uint32_t l = 0; l < 5; ++l) {
      ASSERT_EQ(f.step(l, 1 + t % 2), KVSDK_OK);
      ASSERT_EQ(r.step(l, 1), KVSDK_OK);  // the parents go on differently, on the same arenas
    }
  }
  f.attend_all(2, 13);
  f.attend_all(3, 14);
  r.attend_all(3, 15);
  EXPECT_TRUE(kvsdk_test::snapshot(f.a.get()) == kvsdk_test::snapshot(f.b.get()));
  EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == kvsdk_test::snapshot(r.b.get()));
  EXPECT_FALSE(kvsdk_test::snapshot(r.a.get()) == kvsdk_test::snapshot(f.a.get()));
}

// Truncation: refused inside the first merge and for pending rows older than merged ones that
// stay, allowed for decode tokens and for a leader's pending rows; refusals change nothing.
TEST(DeviceMiniCacheTruncate, AllowedAndRefusedLikeTheCpu) {
  MINICACHE_RIG_OR_SKIP(r, 64, 2, 2, 0.2f, 16u << 20);
  for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 20, false), KVSDK_OK);
  for (int t = 0; t < 6; ++t) {
    for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 1, false), KVSDK_OK);
  }
  ASSERT_EQ(r.step(3, 3, false), KVSDK_OK);  // positions 26..28 pending in layer 3
  const auto both = [&](int32_t position) {
    const auto before = kvsdk_test::snapshot(r.a.get());
    const kvsdk_status sa = kvsdk_cache_truncate(r.a.get(), position);
    const kvsdk_status sb = kvsdk_cache_truncate(r.b.get(), position);
    EXPECT_EQ(sa, sb) << "truncate at " << position;
    if (sa != KVSDK_OK) {
      EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == before) << "refusal changed nothing";
    }
    expect_same_rows(r.a.get(), r.b.get(), r.g);
    expect_same_accounting(r.a.get(), r.b.get(), r.g);
    EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == kvsdk_test::snapshot(r.b.get()));
    return sa;
  };
  EXPECT_NE(both(10), KVSDK_OK) << "inside the first merge";
  EXPECT_EQ(both(27), KVSDK_OK) << "two pending rows";
  EXPECT_EQ(both(23), KVSDK_OK) << "decode tokens and the rest of the pending rows";
  for (uint32_t l = 0; l < 5; ++l) r.count[l] = std::min(r.count[l], 23);
  // The pair continues alike after the cut (the threshold stays fixed).
  for (int t = 0; t < 3; ++t) {
    for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 1, l >= 2 && l <= 3), KVSDK_OK);
  }
  r.attend_all(3, 9);
  EXPECT_EQ(both(0), KVSDK_OK) << "everything: the fresh pair";
  for (uint32_t l = 0; l < 5; ++l) r.count[l] = 0;
  for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 12), KVSDK_OK);
  r.attend_all(2, 10);
}

// Bad input and refusals: a partner's append at other positions, a budget too small; the
// statuses are the CPU's and nothing changes.
TEST(DeviceMiniCacheApi, BadInputAndBudgetMatchTheCpu) {
  const uint32_t dim = 64;
  // About 30 tokens of every layer (exact layers hold f16 rows and positions).
  const uint64_t budget = 30ull * 5 * 2 * (4 * dim + 4);
  MINICACHE_RIG_OR_SKIP(r, dim, 4, 2, 0.1f, budget);
  for (uint32_t l = 0; l < 5; ++l) ASSERT_EQ(r.step(l, 8), KVSDK_OK);
  ASSERT_EQ(r.step(2, 3), KVSDK_OK);
  const auto before_a = kvsdk_test::snapshot(r.a.get());
  // Layer 3 at positions that are not the pending ones.
  const std::vector<int32_t> wrong{9, 10, 11};
  EXPECT_EQ(append_at(r.a.get(), r.g, 3, wrong, 5), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(append_at(r.b.get(), r.g, 3, wrong, 5), KVSDK_E_INVALID_ARG);
  EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == before_a);
  expect_same_accounting(r.a.get(), r.b.get(), r.g);
  // Appends until the budget refuses, alike.
  kvsdk_status st = KVSDK_OK;
  for (int i = 0; i < 40 && st == KVSDK_OK; ++i) {
    for (uint32_t l = 0; l < 5 && st == KVSDK_OK; ++l) {
      const auto before = kvsdk_test::snapshot(r.a.get());
      st = r.step(l, 2);
      if (st != KVSDK_OK) {
        EXPECT_EQ(st, KVSDK_E_BUDGET) << kvsdk_last_error();
        EXPECT_TRUE(kvsdk_test::snapshot(r.a.get()) == before) << "a refusal changed nothing";
      }
    }
  }
  EXPECT_EQ(st, KVSDK_E_BUDGET);
  const kvsdk_cache_stats s = stats(r.a.get());
  EXPECT_LE(s.device_reserved_bytes, s.device_arena_bytes);
  r.attend_all(2, 11);
  r.attend_all(3, 12);
}

}  // namespace
