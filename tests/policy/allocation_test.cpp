// Allocation: XKV greedy equals the brute-force optimum on small instances (both modes), R_avg
// mode reaches its target with the smallest total, uniform/pyramid/shares meet the capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kvsdk.h"
#include "policy/allocation.h"

using namespace kvsdk::policy;

namespace {

std::vector<std::vector<float>> random_w(std::mt19937& rng, size_t layers, size_t max_len) {
  std::vector<std::vector<float>> w(layers);
  std::exponential_distribution<float> e(1.0f);
  for (auto& v : w) {
    v.resize(1 + rng() % max_len);
    for (float& x : v) x = (rng() % 7 == 0) ? 0.0f : e(rng);
  }
  return w;
}

// Enumerates every allocation with sum == n (n_i <= |w_i|); returns the best R_avg.
double brute_best(const std::vector<std::vector<float>>& w, uint64_t n) {
  std::vector<uint64_t> a(w.size(), 0);
  double best = -1;
  std::function<void(size_t, uint64_t)> rec = [&](size_t i, uint64_t left) {
    if (i == w.size()) {
      if (left == 0) best = std::max(best, xkv_average_retention(w, a));
      return;
    }
    for (uint64_t x = 0; x <= std::min<uint64_t>(left, w[i].size()); ++x) {
      a[i] = x;
      rec(i + 1, left - x);
    }
  };
  rec(0, n);
  return best;
}

TEST(XkvAllocation, GreedyEqualsBruteForceOptimum) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const auto w = random_w(rng, 1 + rng() % 4, 6);
    uint64_t total = 0;
    for (auto& v : w) total += v.size();
    const uint64_t n = rng() % (total + 1);
    const auto a = xkv_allocate_total(w, n);
    ASSERT_EQ(std::accumulate(a.begin(), a.end(), uint64_t(0)), n);
    for (size_t i = 0; i < w.size(); ++i) ASSERT_LE(a[i], w[i].size());
    ASSERT_NEAR(xkv_average_retention(w, a), brute_best(w, n), 1e-9) << trial;
  }
}

TEST(XkvAllocation, RetentionModeReachesTargetWithSmallestTotal) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    const auto w = random_w(rng, 1 + rng() % 4, 6);
    const double target = 0.05 + 0.95 * (rng() % 1000) / 1000.0;
    const auto a = xkv_allocate_retention(w, target);
    const uint64_t n = std::accumulate(a.begin(), a.end(), uint64_t(0));
    ASSERT_GE(xkv_average_retention(w, a), target - 1e-9) << trial;
    if (n > 0) ASSERT_LT(brute_best(w, n - 1), target - 1e-12) << trial;  // n is minimal
  }
}

TEST(XkvAllocation, PlanAllocationCApi) {
  std::vector<float> w0{5, 1, 1, 1}, w1{1, 1, 1, 1};
  const float* w[] = {w0.data(), w1.data()};
  size_t len[] = {4, 4};
  uint64_t out[2] = {99, 99};
  ASSERT_EQ(kvsdk_plan_allocation(2, w, len, KVSDK_ALLOC_TOTAL_TOKENS, 3, out), KVSDK_OK);
  EXPECT_EQ(out[0] + out[1], 3u);
  ASSERT_EQ(kvsdk_plan_allocation(2, w, len, KVSDK_ALLOC_TARGET_RETENTION, 1.0, out), KVSDK_OK);
  EXPECT_EQ(out[0], 4u);
  EXPECT_EQ(out[1], 4u);
  uint64_t keep[2] = {7, 7};
  EXPECT_EQ(kvsdk_plan_allocation(2, w, len, 7, 1.0, keep), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_plan_allocation(2, w, len, KVSDK_ALLOC_TARGET_RETENTION, 1.5, keep),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_plan_allocation(2, nullptr, len, 0, 1, keep), KVSDK_E_INVALID_ARG);
  w1[2] = -1;
  EXPECT_EQ(kvsdk_plan_allocation(2, w, len, 0, 1, keep), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(keep[0], 7u);  // outputs untouched on failure
}

TEST(Allocation, UniformAndPyramidMeetCapacityExactly) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t L = 1 + rng() % 12;
    std::vector<uint64_t> len(L), prot(L);
    for (size_t i = 0; i < L; ++i) len[i] = rng() % 200, prot[i] = std::min<uint64_t>(len[i], rng() % 40);
    const uint64_t total = std::accumulate(len.begin(), len.end(), uint64_t(0));
    const uint64_t cap = rng() % (total + 50);
    for (int which = 0; which < 2; ++which) {
      const auto a = which == 0 ? allocate_uniform(len, cap)
                                : allocate_pyramid(len, prot, cap, 0.525, 0.05);
      ASSERT_EQ(std::accumulate(a.begin(), a.end(), uint64_t(0)), std::min(cap, total));
      for (size_t i = 0; i < L; ++i) ASSERT_LE(a[i], len[i]);
    }
  }
}

TEST(Allocation, PyramidDecreasesWithDepth) {
  const std::vector<uint64_t> len(8, 1000), prot(8, 32);
  const auto a = allocate_pyramid(len, prot, 8 * 300, 0.525, 0.05);
  for (size_t i = 1; i < a.size(); ++i) EXPECT_LE(a[i], a[i - 1]);
  EXPECT_GT(a.front(), a.back());
  // SpindleKV Eq. (5): the last layer keeps beta of its context.
  EXPECT_NEAR(double(a.back() - 32) / (1000 - 32), 0.05, 0.01);
}

TEST(Allocation, SharesSplitExactly) {
  const auto a = allocate_by_shares({0.5, 0.25, 0.25}, 101);
  EXPECT_EQ(a[0] + a[1] + a[2], 101u);
  EXPECT_EQ(a[0], 51u);
}

}  // namespace
