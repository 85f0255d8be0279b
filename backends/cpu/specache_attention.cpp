#include "specache_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "fast_chunk_attention.h"
#include "dequant16.h"
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

#if KVSDK_DEQUANT16

// Quantized rows [first, first + count) (all below lowbit.quantized_tokens()).
template <uint32_t B>
KVSDK_CLONE_INLINE void read_quantized(const KiviHeadStore& lowbit, size_t first, size_t count,
                                       float* k, float* v, SpeCacheSelectScratch& sc) {
  const size_t dim = lowbit.head_dim(), row_bytes = dim * B / 8, vecs = dim / 16;
  const size_t G = lowbit.config().group, v_groups = dim / G;
  float* par = at_least(sc.params, 2 * std::max(dim, kSpeCacheChunk * v_groups)).data();
  if (k) {
    const std::vector<uint32_t>& ragged = lowbit.block_token_counts();
    // The key block of token `first`, and its first token.
    size_t block = 0, block_first = 0;
    if (ragged.empty()) {
      block = first / G;
      block_first = block * G;
    } else {
      while (block_first + ragged[block] <= first) block_first += ragged[block++];
    }
    const uint8_t* codes = lowbit.key_codes().data();
    for (size_t t = first; t < first + count;) {
      const size_t size = ragged.empty() ? G : ragged[block];
      const size_t end = std::min(first + count, block_first + size);
      f16_to_f32_array(lowbit.key_scales().data() + block * dim, par, dim);
      f16_to_f32_array(lowbit.key_zeros().data() + block * dim, par + dim, dim);
      for (; t < end; ++t) {
        float* o = k + (t - first) * dim;
        const uint8_t* row = codes + t * row_bytes;
        for (size_t i = 0; i < vecs; ++i) {
          Floats16 scale, zero;
          load16(par + 16 * i, scale);
          load16(par + dim + 16 * i, zero);
          dequant16<B>(row + i * 2 * B, scale, zero, o + 16 * i);
        }
      }
      block_first += size;
      ++block;
    }
  }
  if (v) {
    // Each group's scale and zero point, for every token of the chunk at once.
    for (size_t t0 = first; t0 < first + count; t0 += kSpeCacheChunk) {
      const size_t c = std::min(kSpeCacheChunk, first + count - t0), m = c * v_groups;
      f16_to_f32_array(lowbit.value_scales().data() + t0 * v_groups, par, m);
      f16_to_f32_array(lowbit.value_zeros().data() + t0 * v_groups, par + m, m);
      for (size_t t = 0; t < c; ++t) {
        float* o = v + (t0 + t - first) * dim;
        const uint8_t* row = lowbit.value_codes().data() + (t0 + t) * row_bytes;
        for (size_t i = 0; i < vecs; ++i) {
          const size_t g = t * v_groups + 16 * i / G;
          dequant16<B>(row + i * 2 * B, Floats16{} + par[g], Floats16{} + par[m + g],
                       o + 16 * i);
        }
      }
    }
  }
}
#endif

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

KVSDK_TARGET_CLONES  // elementwise vector code: the same bits in every clone
void specache_read_rows(const KiviHeadStore& lowbit, size_t first, size_t count, float* k,
                        float* v, SpeCacheSelectScratch& sc) {
  const size_t dim = lowbit.head_dim(), G = lowbit.config().group;
  const uint32_t bits = lowbit.config().bits;
  const size_t quant_end = std::min(first + count, lowbit.quantized_tokens());
#if KVSDK_DEQUANT16
  const bool fast = (bits == 1 || bits == 2) && dim % 16 == 0 && G % 16 == 0 && dim % G == 0;
#else
  const bool fast = false;
#endif
  if (!fast) return lowbit.read_rows(first, count, k, v);
  size_t t = first;
#if KVSDK_DEQUANT16
  if (t < quant_end) {
    if (bits == 1) read_quantized<1>(lowbit, t, quant_end - t, k, v, sc);
    else read_quantized<2>(lowbit, t, quant_end - t, k, v, sc);
    t = quant_end;
  }
#endif
  if (t < first + count) lowbit.read_rows(t, first + count - t, k ? k + (t - first) * dim : nullptr,
                                          v ? v + (t - first) * dim : nullptr);  // exact rows
}

KVSDK_TARGET_CLONES  // the elementwise loops (subtract, sums, divisions) vectorize wider
void specache_select_fast(float* scores, size_t group, size_t n, size_t k,
                          SpeCacheSelectScratch& sc, std::vector<uint32_t>& tokens,
                          std::vector<float>* avg_probs) {
  tokens.clear();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float>& avg = avg_probs ? *avg_probs : sc.avg;
  reserve_for_growth(avg, n);
  avg.assign(n, 0.0f);
  if (n == 0) return;
  for (size_t h = 0; h < group; ++h) {
    float* s = scores + h * n;
    // The max in 16 independent lanes (exact in any order; a serial max chain was ~1/5 of this
    // function).
    float m16[16];
    std::fill_n(m16, 16, neg_inf);
    size_t t0 = 0;
    for (; t0 + 16 <= n; t0 += 16) {
      for (size_t j = 0; j < 16; ++j) m16[j] = m16[j] < s[t0 + j] ? s[t0 + j] : m16[j];
    }
    float mx = neg_inf;
    for (size_t j = 0; j < 16; ++j) mx = mx < m16[j] ? m16[j] : mx;
    for (; t0 < n; ++t0) mx = mx < s[t0] ? s[t0] : mx;
    if (mx == neg_inf) continue;  // nothing visible to this head
    for (size_t t = 0; t < n; ++t) s[t] -= mx;
    fast::exp_f32(s, n, s);  // -inf -> 0
    // z in double, 4 lanes by t mod 4 summed (0 + 1) + (2 + 3), then the tail in order: one
    // fixed order (the reference sums in token order; the difference is ~1e-16 relative).
    double z4[4] = {0, 0, 0, 0};
    size_t t = 0;
    for (; t + 4 <= n; t += 4) {
      for (size_t j = 0; j < 4; ++j) z4[j] += s[t + j];
    }
    double z = (z4[0] + z4[1]) + (z4[2] + z4[3]);
    for (; t < n; ++t) z += s[t];
    for (size_t u = 0; u < n; ++u) avg[u] += float(s[u] / z / double(group));
  }
  if (k > 0) specache_topk(avg.data(), n, k, sc, tokens);
}

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
    specache_read_rows(lowbit, first, c, chunk, nullptr, sc);
    fast::dot_scores(q.q, rows, chunk, c, dim, q.scale, low + first, n);
    mask(q, pos + first, c, low + first, n);
  }
  if (low != att) std::copy_n(low, rows * n, att);
  // The fetched keys' scores, up to a chunk of them at a time (each token's dot product is the
  // same in any batch), scattered over their low-bit scores.
  const size_t nf = fetched.tokens.size();
  float* fs = at_least(sc.fetched_scores, rows * std::min(kSpeCacheChunk, nf)).data();
  for (size_t i0 = 0; i0 < nf; i0 += kSpeCacheChunk) {
    const size_t c = std::min(kSpeCacheChunk, nf - i0);
    f16_to_f32_array(&fetched.k[i0 * dim], chunk, c * dim);  // exact
    fast::dot_scores(q.q, rows, chunk, c, dim, q.scale, fs, c);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < c; ++i) {
        const size_t t = fetched.tokens[i0 + i];
        att[r * n + t] = q.positions && pos[t] > q.positions[r] ? neg_inf : fs[r * c + i];
      }
    }
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
    specache_read_rows(lowbit, first, c, nullptr, chunk, sc);
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
