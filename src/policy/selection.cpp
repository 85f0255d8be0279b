// Sinks + recent window (StreamingLLM), heavy hitters + recent (H2O), top-k of pooled window
// scores with the window kept (SnapKV, PyramidKV, XKV Algorithm 2): one routine, three presets.
#include "policy/selection.h"

#include <algorithm>
#include <numeric>

#include "util/growth.h"

namespace kvsdk::policy {

std::vector<uint32_t> select_keep(size_t n, size_t k, size_t sinks, size_t recent,
                                  const float* scores) {
  std::vector<uint32_t> keep, mid;
  select_keep(n, k, sinks, recent, scores, keep, mid);
  return keep;
}

void select_keep(size_t n, size_t k, size_t sinks, size_t recent, const float* scores,
                 std::vector<uint32_t>& keep, std::vector<uint32_t>& mid) {
  keep.clear();
  if (k >= n) {
    reserve_for_growth(keep, n);
    keep.resize(n);
    std::iota(keep.begin(), keep.end(), 0u);
    return;
  }
  const size_t s = std::min(sinks, k);
  const size_t r = std::min(recent, k - s);
  const size_t mid_begin = s, mid_end = n - r;  // s + r <= k < n, so mid_begin <= mid_end
  const size_t take = k - s - r;
  // Amortized growth: in a steady state (a full cache evicting) candidate counts vary a little
  // from step to step, and only a new maximum beyond the spare capacity allocates.
  reserve_for_growth(keep, k);
  for (size_t i = 0; i < s; ++i) keep.push_back(uint32_t(i));
  if (take > 0) {
    if (scores) {
      reserve_for_growth(mid, n);
      mid.resize(mid_end - mid_begin);
      std::iota(mid.begin(), mid.end(), uint32_t(mid_begin));
      // Highest score first; the older row wins a tie, so the order is total and deterministic.
      std::nth_element(mid.begin(), mid.begin() + (take - 1), mid.end(),
                       [&](uint32_t a, uint32_t b) {
                         return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
                       });
      mid.resize(take);
      std::sort(mid.begin(), mid.end());
      keep.insert(keep.end(), mid.begin(), mid.end());
    } else {
      for (size_t i = mid_end - take; i < mid_end; ++i) keep.push_back(uint32_t(i));
    }
  }
  for (size_t i = mid_end; i < n; ++i) keep.push_back(uint32_t(i));
}

}  // namespace kvsdk::policy
