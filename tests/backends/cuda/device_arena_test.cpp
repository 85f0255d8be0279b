// The device arena on a GPU: one allocation of exactly the budget, live data preserved across
// re-partitioning, refusals that change nothing, and a budget proof: the device's free memory
// (cudaMemGetInfo) never drops by more than the budget (rounded up to the driver's 2 MiB
// allocation granularity) while the arena is created, partitioned, filled and re-partitioned.
#include "device_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "cuda_test_util.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

kvsdk_status status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return KVSDK_OK;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 7 + seed);
  return v;
}

TEST(CudaDeviceArena, RepartitionKeepsLiveDataAndStaysInsideTheBudget) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  KVSDK_CUDA_OK(cudaFree(nullptr));  // create the context before measuring
  size_t free_before = 0, total = 0, free_now = 0;
  KVSDK_CUDA_OK(cudaMemGetInfo(&free_before, &total));
  size_t min_free = free_before;
  const auto sample = [&] {
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    EXPECT_EQ(cudaSuccess, cudaMemGetInfo(&free_now, &total));
    min_free = std::min(min_free, free_now);
  };
  const uint64_t budget = 64ull << 20;
  {
    DeviceArena arena(0, budget);
    sample();
    // XKV-style personalised plan: 4 layers x 2 tiers (exact, KIVI), different sizes per layer.
    ArenaPlan plan{{{8 << 20, 4 << 20}, {2 << 20, 1 << 20}, {16 << 20, 8 << 20}, {1 << 20, 0}}};
    arena.apply_plan(plan);
    std::vector<std::vector<uint8_t>> live;
    for (size_t l = 0; l < 4; ++l) {
      for (size_t t = 0; t < 2; ++t) {
        const uint64_t n = arena.slice_bytes(l, t) / 2 + 3;
        live.push_back(pattern(n, uint8_t(l * 2 + t)));
        if (arena.slice_bytes(l, t) == 0) {
          live.back().clear();
          continue;
        }
        KVSDK_CUDA_OK(cudaMemcpy(arena.slice(l, t), live.back().data(), n,
                                 cudaMemcpyHostToDevice));
        arena.set_used(l, t, n);
      }
    }
    sample();
    uint64_t used = 0;
    for (const auto& v : live) used += v.size();
    EXPECT_EQ(arena.stats().used, used);
    EXPECT_EQ(arena.stats().capacity, budget);
    EXPECT_LE(arena.stats().reserved, budget);

    // Over-budget plan and a shrink below live bytes: refused, nothing moves.
    const ArenaPartition before = arena.partition();
    const ArenaPlan too_big{{{budget, 0}, {1, 0}, {0, 0}, {0, 0}}};
    EXPECT_EQ(status_of([&] { arena.apply_plan(too_big); }), KVSDK_E_BUDGET);
    EXPECT_EQ(status_of([&] { arena.apply_plan(ArenaPlan{{{1, 1}, {1, 1}, {1, 1}, {1, 1}}}); }),
              KVSDK_E_BUDGET);
    EXPECT_EQ(arena.partition().slices[2].offset, before.slices[2].offset);

    // New plan: layer 0 shrinks, layer 2 grows, layer 3 gains a KIVI tier.
    arena.apply_plan(ArenaPlan{{{5 << 20, 3 << 20}, {3 << 20, 1 << 20}, {20 << 20, 10 << 20},
                                {2 << 20, 4 << 20}}});
    sample();
    for (size_t l = 0; l < 4; ++l) {
      for (size_t t = 0; t < 2; ++t) {
        const auto& want = live[l * 2 + t];
        if (want.empty()) continue;
        std::vector<uint8_t> got(want.size());
        KVSDK_CUDA_OK(cudaMemcpy(got.data(), arena.slice(l, t), got.size(),
                                 cudaMemcpyDeviceToHost));
        EXPECT_EQ(got, want) << "layer " << l << " tier " << t;
      }
    }
    EXPECT_EQ(arena.stats().used, used);
  }
  sample();
  const uint64_t granularity = 2ull << 20;
  const uint64_t allowed = (budget + granularity - 1) / granularity * granularity;
  EXPECT_LE(free_before - min_free, allowed)
      << "peak device use " << (free_before - min_free) << " bytes for a " << budget
      << "-byte budget";
}

TEST(CudaDeviceArena, ImpossibleBudgetIsABackendError) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  size_t free_mem = 0, total = 0;
  KVSDK_CUDA_OK(cudaMemGetInfo(&free_mem, &total));
  EXPECT_EQ(status_of([&] { DeviceArena arena(0, uint64_t(total) * 4); }), KVSDK_E_BACKEND);
  EXPECT_EQ(cudaSuccess, cudaGetLastError());  // the failed allocation left no sticky error
  EXPECT_EQ(status_of([&] { DeviceArena arena(0, 0); }), KVSDK_E_INVALID_ARG);
}

TEST(CudaDeviceArena, SlicesBeforeAPlanAreAStateError) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  DeviceArena arena(0, 1 << 20);
  EXPECT_EQ(status_of([&] { arena.slice(0, 0); }), KVSDK_E_STATE);
  arena.apply_plan(ArenaPlan{{{1000}}});
  EXPECT_EQ(status_of([&] { arena.slice(1, 0); }), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(status_of([&] { arena.set_used(0, 0, 1001); }), KVSDK_E_INVALID_ARG);
}

}  // namespace
}  // namespace kvsdk::cuda
