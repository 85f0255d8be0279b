#include "smallkv.h"

#include <algorithm>
#include <numeric>

#include "attention.h"

namespace kvsdk::cpu {

std::vector<uint32_t> smallkv_topk(const float* scores, size_t n, size_t k) {
  k = std::min(k, n);
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

double smallkv_jaccard(const float* a, const float* b, size_t n, size_t k) {
  const std::vector<uint32_t> ta = smallkv_topk(a, n, k), tb = smallkv_topk(b, n, k);
  std::vector<uint32_t> both;
  std::set_intersection(ta.begin(), ta.end(), tb.begin(), tb.end(), std::back_inserter(both));
  const size_t uni = ta.size() + tb.size() - both.size();
  return uni == 0 ? 1.0 : double(both.size()) / double(uni);
}

std::vector<uint32_t> smallkv_match_heads(const float* large_scores, size_t n_large,
                                          const float* proxy_scores, size_t n_proxy,
                                          size_t n_tokens, size_t k) {
  std::vector<uint32_t> map(n_large, 0);
  for (size_t i = 0; i < n_large; ++i) {
    double best = -1.0;
    for (size_t j = 0; j < n_proxy; ++j) {
      const double s =
          smallkv_jaccard(large_scores + i * n_tokens, proxy_scores + j * n_tokens, n_tokens, k);
      if (s > best) {
        best = s;
        map[i] = uint32_t(j);
      }
    }
  }
  return map;
}

SmallKvSplit smallkv_split_budget(size_t budget_tokens, size_t n_tokens) {
  SmallKvSplit s;
  if (n_tokens <= budget_tokens) {
    s.critical = n_tokens;
    return s;
  }
  // 2x + x + 2x/2 = 4x budget units; the remainder of the division goes to critical tokens.
  const size_t x = budget_tokens / 4;
  s.recent = x;
  s.marginal = 2 * x;
  s.critical = budget_tokens - 4 * x + 2 * x;
  if (s.critical + s.recent + s.marginal > n_tokens) {
    s.marginal = n_tokens - s.critical - s.recent;  // critical + recent <= budget < n_tokens
  }
  return s;
}

SmallKvSelection smallkv_select(const float* proxy_scores, size_t n_tokens,
                                const SmallKvSplit& s) {
  SmallKvSelection sel;
  const size_t recent = std::min(s.recent, n_tokens);
  const size_t older = n_tokens - recent;
  // Rank the older tokens by the proxy's scores; the head of the ranking is critical, the next
  // stretch marginal.
  std::vector<uint32_t> order(older);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return proxy_scores[a] > proxy_scores[b]; });
  const size_t n_crit = std::min(s.critical, older);
  const size_t n_marg = std::min(s.marginal, older - n_crit);
  sel.full.assign(order.begin(), order.begin() + n_crit);
  sel.marginal.assign(order.begin() + n_crit, order.begin() + n_crit + n_marg);
  for (size_t t = older; t < n_tokens; ++t) sel.full.push_back(uint32_t(t));
  std::sort(sel.full.begin(), sel.full.end());
  std::sort(sel.marginal.begin(), sel.marginal.end());
  return sel;
}

void smallkv_attend(const float* q, const int32_t* q_positions, size_t n_rows, size_t dim,
                    float scale, const float* k_full, const float* v_full,
                    const int32_t* full_positions, size_t n_full, const float* v_marginal,
                    const int32_t* marginal_positions, size_t n_marginal,
                    const float* proxy_weights, float* out) {
  OnlineAttention attn(q, q_positions, n_rows, dim, scale);
  attn.add_chunk(k_full, v_full, full_positions, n_full);
  attn.finish(out);
  for (size_t r = 0; r < n_rows; ++r) {
    const float* w = proxy_weights + r * n_marginal;
    double mass = 0;
    for (size_t j = 0; j < n_marginal; ++j) {
      if (marginal_positions[j] <= q_positions[r]) mass += w[j];
    }
    const float keep = float(std::max(0.0, 1.0 - mass));
    float* o = out + r * dim;
    for (size_t d = 0; d < dim; ++d) o[d] *= keep;
    for (size_t j = 0; j < n_marginal; ++j) {
      if (marginal_positions[j] > q_positions[r]) continue;
      const float* vj = v_marginal + j * dim;
      for (size_t d = 0; d < dim; ++d) o[d] += w[j] * vj[d];
    }
  }
}

}  // namespace kvsdk::cpu
