// Selection against a reference: sinks + recent (StreamingLLM), sinks + heavy + recent (H2O),
// top-k with the window kept (SnapKV).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "policy/selection.h"

using kvsdk::policy::select_keep;

namespace {

std::vector<uint32_t> reference(size_t n, size_t k, size_t sinks, size_t recent,
                                const std::vector<float>* scores) {
  std::set<uint32_t> keep;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) keep.insert(uint32_t(i));
    return {keep.begin(), keep.end()};
  }
  const size_t s = std::min(sinks, k), r = std::min(recent, k - s);
  for (size_t i = 0; i < s; ++i) keep.insert(uint32_t(i));
  for (size_t i = n - r; i < n; ++i) keep.insert(uint32_t(i));
  std::vector<uint32_t> mid;
  for (size_t i = s; i < n - r; ++i) mid.push_back(uint32_t(i));
  if (scores) {
    std::stable_sort(mid.begin(), mid.end(),
                     [&](uint32_t a, uint32_t b) { return (*scores)[a] > (*scores)[b]; });
  } else {
    std::reverse(mid.begin(), mid.end());  // newest first
  }
  for (size_t i = 0; i < k - s - r; ++i) keep.insert(mid[i]);
  return {keep.begin(), keep.end()};
}

TEST(Selection, MatchesReferenceOnRandomInputs) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t n = rng() % 60, k = rng() % 70, sinks = rng() % 8, recent = rng() % 20;
    std::vector<float> scores(n);
    // Few distinct values: exercises ties (max pooling produces many).
    for (float& x : scores) x = float(rng() % 5);
    const bool scored = trial % 3 != 0;
    const auto got = select_keep(n, k, sinks, recent, scored ? scores.data() : nullptr);
    const auto want = reference(n, k, sinks, recent, scored ? &scores : nullptr);
    ASSERT_EQ(got, want) << "n=" << n << " k=" << k << " sinks=" << sinks << " recent=" << recent;
    ASSERT_EQ(got.size(), std::min(n, k));
  }
}

TEST(Selection, StreamingKeepsSinksAndNewest) {
  const auto got = select_keep(10, 5, 2, 5, nullptr);
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 7, 8, 9}));
}

}  // namespace
