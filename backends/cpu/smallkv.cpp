#include "smallkv.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attention.h"
#include "portable_math.h"
#include "target_clones.h"

namespace kvsdk::cpu {

namespace {
// Orders scores with NaN ranked last, so a corrupt score never breaks the sort's ordering.
float rank_key(float x) { return x == x ? x : -std::numeric_limits<float>::infinity(); }
}  // namespace

namespace {

// Softmax of one query row over keys visible at q_position, into p [n] (0 where masked).
void softmax_row(const float* q, int32_t q_position, const float* k, const int32_t* positions,
                 size_t n, size_t dim, float scale, std::vector<double>& p) {
  p.assign(n, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < n; ++t) {
    if (positions[t] > q_position) continue;
    p[t] = double(dot_f32(q, k + t * dim, dim)) * scale;
    mx = std::max(mx, p[t]);
  }
  if (mx == -std::numeric_limits<double>::infinity()) {
    p.assign(n, 0.0);
    return;
  }
  double z = 0;
  for (size_t t = 0; t < n; ++t) {
    // Portable exp (portable_math.h): these probabilities accumulate into saved importance.
    p[t] = positions[t] > q_position ? 0.0 : pmath::exp(p[t] - mx);
    z += p[t];
  }
  for (double& x : p) x /= z;
}

}  // namespace

void smallkv_accumulated_attention(const float* q, const int32_t* q_positions, size_t n_q,
                                   const float* k, const int32_t* positions, size_t n,
                                   size_t dim, float scale, float* out) {
  std::vector<double> acc(n, 0.0), p;
  for (size_t r = 0; r < n_q; ++r) {
    softmax_row(q + r * dim, q_positions[r], k, positions, n, dim, scale, p);
    for (size_t t = 0; t < n; ++t) acc[t] += p[t];
  }
  for (size_t t = 0; t < n; ++t) out[t] = float(acc[t]);
}

void smallkv_softmax_rows(const float* q, const int32_t* q_positions, size_t n_rows,
                          const float* k, const int32_t* positions, size_t n, size_t dim,
                          float scale, float* out) {
  std::vector<double> p;
  for (size_t r = 0; r < n_rows; ++r) {
    softmax_row(q + r * dim, q_positions[r], k, positions, n, dim, scale, p);
    for (size_t t = 0; t < n; ++t) out[r * n + t] = float(p[t]);
  }
}

void smallkv_proxy_weights(const float* q, const int32_t* q_positions, size_t n_rows,
                           const float* k, const int32_t* positions, size_t n, size_t dim,
                           float scale, const int32_t* wanted, size_t n_wanted, float* out) {
  // Position -> row, by sorting the proxy's rows once (its rows need not be position-ordered).
  std::vector<uint32_t> by_pos(n);
  std::iota(by_pos.begin(), by_pos.end(), 0u);
  std::sort(by_pos.begin(), by_pos.end(),
            [&](uint32_t a, uint32_t b) { return positions[a] < positions[b]; });
  std::vector<int64_t> row_of(n_wanted, -1);
  for (size_t j = 0; j < n_wanted; ++j) {
    const auto it = std::lower_bound(by_pos.begin(), by_pos.end(), wanted[j],
                                     [&](uint32_t row, int32_t p) { return positions[row] < p; });
    if (it != by_pos.end() && positions[*it] == wanted[j]) row_of[j] = *it;
  }
  std::vector<double> p;
  for (size_t r = 0; r < n_rows; ++r) {
    softmax_row(q + r * dim, q_positions[r], k, positions, n, dim, scale, p);
    for (size_t j = 0; j < n_wanted; ++j) {
      out[r * n_wanted + j] = row_of[j] < 0 ? 0.0f : float(p[size_t(row_of[j])]);
    }
  }
}

std::vector<uint32_t> smallkv_topk(const float* scores, size_t n, size_t k) {
  std::vector<uint32_t> order, out;
  smallkv_topk(scores, n, k, order, out);
  return out;
}

void smallkv_topk(const float* scores, size_t n, size_t k, std::vector<uint32_t>& idx,
                  std::vector<uint32_t>& out) {
  k = std::min(k, n);
  idx.resize(n);
  std::iota(idx.begin(), idx.end(), 0u);
  // The comparator is a strict total order (ties: lower index), so the k first elements after
  // nth_element are exactly partial_sort's, in another order; they are sorted by index below.
  const auto before = [&](uint32_t a, uint32_t b) {
    const float sa = rank_key(scores[a]), sb = rank_key(scores[b]);
    return sa > sb || (sa == sb && a < b);
  };
  if (k > 0 && k < n) std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), before);
  out.assign(idx.begin(), idx.begin() + k);
  std::sort(out.begin(), out.end());
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

namespace {

// Capacity for `n` elements, grown by half at a time (reused buffers settle after a few calls).
template <class T>
void reserve_growing(std::vector<T>& v, size_t n) {
  if (v.capacity() < n) v.reserve(std::max(n, v.capacity() + v.capacity() / 2));
}

}  // namespace

SmallKvSelection smallkv_select(const float* proxy_scores, size_t n_tokens,
                                const SmallKvSplit& s) {
  return smallkv_select(proxy_scores, nullptr, n_tokens, s);
}

SmallKvSelection smallkv_select(const float* proxy_scores, const uint8_t* has_key, size_t n_tokens,
                                const SmallKvSplit& s) {
  SmallKvSelection sel;
  SmallKvSelectScratch scratch;
  smallkv_select(proxy_scores, has_key, n_tokens, s, scratch, sel);
  return sel;
}

void smallkv_select(const float* proxy_scores, const uint8_t* has_key, size_t n_tokens,
                    const SmallKvSplit& s, SmallKvSelectScratch& scratch, SmallKvSelection& sel) {
  auto keyed = [&](size_t t) { return has_key == nullptr || has_key[t] != 0; };
  // 0: evicted, 1: full (recent or critical), 2: marginal.
  std::vector<uint8_t>& kind = scratch.kind;
  reserve_growing(kind, n_tokens);
  kind.assign(n_tokens, 0);
  // The recent window: the newest tokens that still have their keys.
  size_t n_recent = 0;
  for (size_t t = n_tokens; t-- > 0 && n_recent < s.recent;) {
    if (keyed(t)) {
      kind[t] = 1;
      ++n_recent;
    }
  }
  // The other tokens ranked by the proxy's scores (ties: the older token first, NaN last). In
  // that ranking the first `critical` tokens with a key are critical, and the first `marginal`
  // of the tokens left are marginal: two selections of the top of a total order (O(n) each),
  // the same tokens as walking the fully sorted ranking.
  const auto before = [&](uint32_t a, uint32_t b) {
    const float sa = rank_key(proxy_scores[a]), sb = rank_key(proxy_scores[b]);
    return sa > sb || (sa == sb && a < b);
  };
  std::vector<uint32_t>& cand = scratch.cand;
  cand.clear();
  reserve_growing(cand, n_tokens);
  for (size_t t = 0; t < n_tokens; ++t) {
    if (kind[t] == 0 && keyed(t)) cand.push_back(uint32_t(t));
  }
  const auto top = [&](size_t k) {  // the k first of cand in the ranking, marked as `mark`
    k = std::min(k, cand.size());
    if (k > 0 && k < cand.size()) {
      std::nth_element(cand.begin(), cand.begin() + long(k - 1), cand.end(), before);
    }
    return k;
  };
  const size_t n_crit = top(s.critical);
  for (size_t i = 0; i < n_crit; ++i) kind[cand[i]] = 1;
  cand.clear();
  for (size_t t = 0; t < n_tokens; ++t) {
    if (kind[t] == 0) cand.push_back(uint32_t(t));
  }
  const size_t n_marg = top(s.marginal);
  for (size_t i = 0; i < n_marg; ++i) kind[cand[i]] = 2;
  sel.full.clear();
  sel.marginal.clear();
  reserve_growing(sel.full, n_tokens);
  reserve_growing(sel.marginal, n_tokens);
  for (size_t t = 0; t < n_tokens; ++t) {
    if (kind[t] == 1) sel.full.push_back(uint32_t(t));
    if (kind[t] == 2) sel.marginal.push_back(uint32_t(t));
  }
}

void smallkv_attend(const float* q, const int32_t* q_positions, size_t n_rows, size_t dim,
                    float scale, const float* k_full, const float* v_full,
                    const int32_t* full_positions, size_t n_full, const float* v_marginal,
                    const int32_t* marginal_positions, size_t n_marginal,
                    const float* proxy_weights, float* out) {
  AttentionScratch scratch;
  smallkv_attend(q, q_positions, n_rows, dim, scale, k_full, v_full, full_positions, n_full,
                 v_marginal, marginal_positions, n_marginal, proxy_weights, out, scratch);
}

void smallkv_attend(const float* q, const int32_t* q_positions, size_t n_rows, size_t dim,
                    float scale, const float* k_full, const float* v_full,
                    const int32_t* full_positions, size_t n_full, const float* v_marginal,
                    const int32_t* marginal_positions, size_t n_marginal,
                    const float* proxy_weights, float* out, AttentionScratch& scratch) {
  OnlineAttention attn(q, q_positions, n_rows, dim, scale, scratch);
  attn.add_chunk(k_full, v_full, full_positions, n_full);
  attn.finish(out);
  smallkv_add_marginal(q_positions, n_rows, dim, v_marginal, marginal_positions, n_marginal,
                       proxy_weights, n_marginal, out);
}

// Cloned per x86-64 SIMD level (target_clones.h): the elementwise loops over d vectorize, with the
// same bits in every clone.
KVSDK_TARGET_CLONES
void smallkv_add_marginal(const int32_t* q_positions, size_t n_rows, size_t dim,
                          const float* v_marginal, const int32_t* marginal_positions,
                          size_t n_marginal, const float* proxy_weights, size_t weights_stride,
                          float* out) {
  for (size_t r = 0; r < n_rows; ++r) {
    const float* w = proxy_weights + r * weights_stride;
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
