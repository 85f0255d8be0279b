#include "specache_attention.h"

#include <algorithm>
#include <limits>

#include "fast_chunk_attention.h"
#include "target_clones.h"
#include "util/growth.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

namespace {

// -inf for the tokens [first, first + c) that row r may not see.
void mask(const fast::Queries& q, const int32_t* key_pos, size_t c, float* scores,
          size_t stride) {
  if (!q.positions) return;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < q.n_rows; ++r) {  // row by row: contiguous, so it vectorizes
    const int32_t qp = q.positions[r];
    float* s = scores + r * stride;
    for (size_t t = 0; t < c; ++t) s[t] = key_pos[t] > qp ? neg_inf : s[t];
  }
}

// o[j] += p[t] * v[t * stride + j] for j < W, token by token (tokens with p 0 add nothing).
// (Forced inline into each clone of the caller, so it vectorizes for that clone's target.)
#if defined(__GNUC__)
#define KVSDK_CLONE_INLINE __attribute__((always_inline)) inline
#else
#define KVSDK_CLONE_INLINE inline
#endif
// o_r[j] += p_r[t] * v[t * stride + j] for j < W and RT rows at once (each value row read once for the tile): per row and channel
// the same sum in the same token order (rows whose p is 0 skip the token), so the same bits.
template <size_t W, size_t RT>
KVSDK_CLONE_INLINE void accumulate_rows(const float* const* p, const float* v, size_t c,
                                        size_t stride, float* const* o) {
  float acc[RT][W];
  for (size_t r = 0; r < RT; ++r) std::copy_n(o[r], W, acc[r]);
  for (size_t t = 0; t < c; ++t) {
    const float* vt = v + t * stride;
    for (size_t r = 0; r < RT; ++r) {
      const float w = p[r][t];
      if (w == 0.0f) continue;  // masked or underflowed
      for (size_t j = 0; j < W; ++j) acc[r][j] += w * vt[j];
    }
  }
  for (size_t r = 0; r < RT; ++r) std::copy_n(acc[r], W, o[r]);
}

// Channels [0, dim) of RT rows: 64 at a time, then 16, then the rest per row.
template <size_t RT>
KVSDK_CLONE_INLINE void accumulate_tile(const float* const* p, const float* chunk, size_t c,
                                        size_t dim, float* const* o) {
  size_t d0 = 0;
  float* od[RT];
  for (; d0 + 64 <= dim; d0 += 64) {
    for (size_t r = 0; r < RT; ++r) od[r] = o[r] + d0;
    accumulate_rows<64, RT>(p, chunk + d0, c, dim, od);
  }
  for (; d0 + 16 <= dim; d0 += 16) {
    for (size_t r = 0; r < RT; ++r) od[r] = o[r] + d0;
    accumulate_rows<16, RT>(p, chunk + d0, c, dim, od);
  }
  for (size_t r = 0; r < RT && d0 < dim; ++r) {
    for (size_t t = 0; t < c; ++t) {
      if (p[r][t] == 0.0f) continue;
      for (size_t d = d0; d < dim; ++d) o[r][d] += p[r][t] * chunk[t * dim + d];
    }
  }
}

// max of s[0, n) (n > 0): exact in any order, so 16 independent lanes (vectorizable).
KVSDK_CLONE_INLINE float max_of(const float* s, size_t n) {
  float m[16];
  std::fill_n(m, 16, -std::numeric_limits<float>::infinity());
  size_t t = 0;
  for (; t + 16 <= n; t += 16) {
    for (size_t j = 0; j < 16; ++j) m[j] = m[j] < s[t + j] ? s[t + j] : m[j];
  }
  for (; t < n; ++t) m[0] = m[0] < s[t] ? s[t] : m[0];
  float mx = m[0];
  for (size_t j = 1; j < 16; ++j) mx = mx < m[j] ? m[j] : mx;
  return mx;
}

// s[t] -= mx, then the sum of exp: the sum in 16 lanes by t mod 16, reduced by the fixed tree
// l + l+8, l + l+4, l + l+2, l + l+1, then the tail tokens in order (one order on every target).
KVSDK_CLONE_INLINE float lane_sum(const float* s, size_t n) {
  float l[16] = {};
  size_t t = 0;
  for (; t + 16 <= n; t += 16) {
    for (size_t j = 0; j < 16; ++j) l[j] += s[t + j];
  }
  for (size_t w = 8; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) l[j] += l[j + w];
  }
  float sum = l[0];
  for (; t < n; ++t) sum += s[t];
  return sum;
}

}  // namespace

KVSDK_TARGET_CLONES  // the per-channel loops vectorize wider; elementwise, so the same bits
void specache_attend_fast(const fast::Queries& q, const KiviHeadStore& lowbit,
                          const SpeCacheFetched& fetched, SpeCacheSelectScratch& sc, float* out,
                          float* lowbit_scores) {
  const size_t n = lowbit.size(), dim = q.dim, rows = q.n_rows;
  std::fill_n(out, rows * dim, 0.0f);
  if (n == 0) return;
  const int32_t* pos = lowbit.positions().data();
  float* chunk = at_least(sc.k_chunk, std::min(kSpeCacheChunk, n) * dim).data();
  float* att = at_least(sc.attention, rows * n + rows).data();  // weights, then each row's sum
  float* low = lowbit_scores ? lowbit_scores : att;

  // 1. Keys: the low-bit scores, then the attention's copy with the fetched keys' scores.
  for (size_t first = 0; first < n; first += kSpeCacheChunk) {
    const size_t c = std::min(kSpeCacheChunk, n - first);
    lowbit.read_rows(first, c, chunk, nullptr);
    fast::dot_scores(q.q, rows, chunk, c, dim, q.scale, low + first, n);
    mask(q, pos + first, c, low + first, n);
  }
  if (low != att) std::copy_n(low, rows * n, att);
  for (size_t i = 0; i < fetched.tokens.size(); ++i) {
    const size_t t = fetched.tokens[i];
    f16_to_f32_array(&fetched.k[i * dim], chunk, dim);  // exact
    fast::dot_scores(q.q, rows, chunk, 1, dim, q.scale, att + t, n);
    mask(q, pos + t, 1, att + t, n);
  }

  // 2. Softmax weights per row (unnormalized: exp(score - max)), and their sums.
  float* sums = att + rows * n;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    float* s = att + r * n;
    const float mx = max_of(s, n);
    sums[r] = 0.0f;
    if (mx == neg_inf) continue;  // sees nothing: stays zero
    for (size_t t = 0; t < n; ++t) s[t] -= mx;
    fast::exp_f32(s, n, s);  // -inf -> 0
    sums[r] = lane_sum(s, n);
  }

  // 3. Values: each chunk dequantized once, fetched rows substituted, accumulated per channel.
  size_t next = 0;  // first fetched entry not yet substituted (both lists ascend)
  for (size_t first = 0; first < n; first += kSpeCacheChunk) {
    const size_t c = std::min(kSpeCacheChunk, n - first);
    lowbit.read_rows(first, c, nullptr, chunk);
    while (next < fetched.tokens.size() && fetched.tokens[next] < first + c) {
      f16_to_f32_array(&fetched.v[next * dim], chunk + (fetched.tokens[next] - first) * dim, dim);
      ++next;
    }
    // Tiles of up to 4 rows (each value row read once per tile), W channels at a time in local
    // accumulators (kept in registers across the tokens), each channel summing its products in
    // token order.
    for (size_t r0 = 0; r0 < rows;) {
      const size_t rt = std::min<size_t>(4, rows - r0);
      const float* p[4];
      float* o[4];
      for (size_t r = 0; r < rt; ++r) {
        p[r] = att + (r0 + r) * n + first;
        o[r] = out + (r0 + r) * dim;
      }
      switch (rt) {
        case 4: accumulate_tile<4>(p, chunk, c, dim, o); break;
        case 3: accumulate_tile<3>(p, chunk, c, dim, o); break;
        case 2: accumulate_tile<2>(p, chunk, c, dim, o); break;
        default: accumulate_tile<1>(p, chunk, c, dim, o); break;
      }
      r0 += rt;
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    if (sums[r] == 0.0f) continue;
    float* o = out + r * dim;
    for (size_t d = 0; d < dim; ++d) o[d] /= sums[r];
  }
}

}  // namespace kvsdk::cpu
