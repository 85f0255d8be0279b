// Uniform allocation (StreamingLLM, H2O, SnapKV): the same token count for every layer.
#include <algorithm>

#include "policy/allocation.h"

namespace kvsdk::policy {

std::vector<uint64_t> allocate_uniform(const std::vector<uint64_t>& lengths, uint64_t capacity) {
  const size_t L = lengths.size();
  std::vector<uint64_t> out(L, 0);
  // Water-filling: repeatedly share what is left among the layers that still have room.
  uint64_t left = capacity;
  while (left > 0) {
    size_t open = 0;
    for (size_t i = 0; i < L; ++i) open += out[i] < lengths[i];
    if (open == 0) break;
    const uint64_t share = left / open;
    if (share == 0) {
      // Fewer tokens than open layers: one each to the first layers with room.
      for (size_t i = 0; i < L && left > 0; ++i) {
        if (out[i] < lengths[i]) ++out[i], --left;
      }
      break;
    }
    for (size_t i = 0; i < L; ++i) {
      const uint64_t add = std::min(share, lengths[i] - out[i]);
      out[i] += add;
      left -= add;
    }
  }
  return out;
}

std::vector<uint64_t> allocate_by_shares(const std::vector<double>& shares, uint64_t capacity) {
  const size_t L = shares.size();
  std::vector<uint64_t> out(L, 0);
  double total = 0;
  for (double s : shares) total += s;
  if (L == 0 || total <= 0) return out;
  std::vector<std::pair<double, size_t>> rem(L);
  uint64_t used = 0;
  for (size_t i = 0; i < L; ++i) {
    const double exact = double(capacity) * (shares[i] / total);
    out[i] = std::min<uint64_t>(capacity, uint64_t(exact));
    used += out[i];
    rem[i] = {exact - double(out[i]), i};
  }
  std::sort(rem.begin(), rem.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first
                                                                          : a.second < b.second; });
  for (size_t j = 0; used < capacity && j < L; ++j, ++used) ++out[rem[j].second];
  while (used > capacity) {  // float rounding above: take back from the largest
    auto it = std::max_element(out.begin(), out.end());
    --*it;
    --used;
  }
  return out;
}

}  // namespace kvsdk::policy
