// XKV adaptive allocation, Algorithm 1 of the XKV paper (§IV-B): keep a wait list holding, for
// every layer, the normalised importance of its best token not yet allocated; repeatedly give one
// more token to the layer at the head of the list. Because each layer's gains are sorted
// descending, the greedy choice is globally optimal (the paper's proof by exchange, Eq. (19)-(21)).
#include <algorithm>
#include <functional>
#include <queue>

#include "policy/allocation.h"

namespace kvsdk::policy {

namespace {

struct Greedy {
  std::vector<std::vector<double>> gains;  // per layer: Sort(w_i) descending / Sum(w_i)
  std::vector<uint64_t> alloc;
  // Wait list: (gain of the next token, layer). Highest gain first; on a tie the lower layer.
  using Entry = std::pair<double, size_t>;
  struct Cmp {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, Cmp> wait;

  explicit Greedy(const std::vector<std::vector<float>>& w) : gains(w.size()), alloc(w.size(), 0) {
    for (size_t i = 0; i < w.size(); ++i) {
      double sum = 0;
      for (float x : w[i]) sum += x;
      gains[i].resize(w[i].size());
      for (size_t j = 0; j < w[i].size(); ++j) gains[i][j] = sum > 0 ? double(w[i][j]) / sum : 0.0;
      std::sort(gains[i].begin(), gains[i].end(), std::greater<double>());
      if (!gains[i].empty()) wait.push({gains[i][0], i});
    }
  }
  // Algorithm 1, lines 9-13 / 19-24: take the best entry, grow its layer, refill the wait list.
  bool step(double* gained) {
    if (wait.empty()) return false;
    const Entry e = wait.top();
    wait.pop();
    const size_t i = e.second;
    ++alloc[i];
    if (alloc[i] < gains[i].size()) wait.push({gains[i][alloc[i]], i});
    if (gained) *gained = e.first;
    return true;
  }
};

}  // namespace

std::vector<uint64_t> xkv_allocate_total(const std::vector<std::vector<float>>& w, uint64_t n) {
  Greedy g(w);
  for (uint64_t it = 0; it < n && g.step(nullptr); ++it) {
  }
  return g.alloc;
}

std::vector<uint64_t> xkv_allocate_retention(const std::vector<std::vector<float>>& w,
                                             double target_avg_retention) {
  Greedy g(w);
  const double L = double(w.size());
  double total = 0;
  // R_avg counts a layer with no importance mass as fully retained (nothing to lose), so the
  // target stays reachable; its tokens then bring no gain and are taken last.
  for (size_t i = 0; i < w.size(); ++i) {
    double sum = 0;
    for (float x : w[i]) sum += x;
    if (!(sum > 0)) total += 1.0;
  }
  // A relative tolerance absorbs the rounding of the running sum (the full allocation must reach
  // R_avg = 1).
  while (total / L < target_avg_retention - 1e-12) {
    double gained = 0;
    if (!g.step(&gained)) break;
    total += gained;
  }
  return g.alloc;
}

double xkv_average_retention(const std::vector<std::vector<float>>& w,
                             const std::vector<uint64_t>& n) {
  double r = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    std::vector<float> s(w[i]);
    std::sort(s.begin(), s.end(), std::greater<float>());
    double sum = 0, top = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      sum += s[j];
      if (j < n[i]) top += s[j];
    }
    r += sum > 0 ? top / sum : 1.0;
  }
  return w.empty() ? 1.0 : r / double(w.size());
}

}  // namespace kvsdk::policy
