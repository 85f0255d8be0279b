// Capacity growth of stored rows: by half of the current capacity at a time (at least what is
// needed), so that appending one token copies a store only now and then (amortized O(1) per
// token) while the spare capacity stays below half of what is stored. Exact-fit growth would copy
// the whole store on every decode step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk {

// The capacity to grow to when `need` elements do not fit `capacity`.
inline size_t grown_capacity(size_t capacity, size_t need) {
  return std::max(need, capacity + capacity / 2);
}

// Makes `v` hold `need` elements without reallocating (contents unchanged; may throw
// std::bad_alloc, leaving `v` as it was).
template <class T, class A>
void reserve_for_growth(std::vector<T, A>& v, size_t need) {
  if (v.capacity() < need) v.reserve(grown_capacity(v.capacity(), need));
}

// The largest x in [0, limit] with fits(x), fits being monotone (true up to some x, false after);
// 0 when none fits. How much spare room a re-layout can give (device stores near their budget).
template <class Fits>
uint64_t largest_fitting(uint64_t limit, const Fits& fits) {
  uint64_t lo = 0, hi = limit;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// `v` with at least `n` elements (scratch: its capacity is reused and it never shrinks).
template <class T>
std::vector<T>& at_least(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v;
}

}  // namespace kvsdk
