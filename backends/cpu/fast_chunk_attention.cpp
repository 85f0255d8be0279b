// Optimized online softmax over f32 chunks (see fast_chunk_attention.h for the contract and the
// determinism scheme, which is fast_attention.h's). Compiled once per Highway target, with the
// same target set as fast_attention.cpp; HWY_DYNAMIC_DISPATCH picks one at run time (and
// fast::force_target restricts it for the tests).
#include "hwy_targets.h"  // the same Highway targets in every SIMD file (see there)

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fast_chunk_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "fast_lanes-inl.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "fast_chunk_attention.h"

#ifndef KVSDK_FAST_CHUNK_ATTENTION_ONCE
#define KVSDK_FAST_CHUNK_ATTENTION_ONCE
namespace kvsdk::cpu::fast {
// Tokens per softmax segment (scores of a segment for every row, then one rescale at most).
constexpr size_t kSegment = 64;
}  // namespace kvsdk::cpu::fast
#endif

HWY_BEFORE_NAMESPACE();
namespace kvsdk {
namespace cpu {
namespace fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// DF, VF, kL, kN, ReduceVec and Reduce16 (the fixed-order reductions, the same as
// fast_attention.cpp's) come from fast_lanes-inl.h.

// sc[r][t] = (q_r . k_t) * scale for a tile of RT rows (each key row loaded once for the tile),
// or -inf where the token is in the row's future (tok_pos null: nothing masked).
template <size_t RT>
HWY_INLINE void ScoresTile(const float* k, size_t n_tok, size_t dim, const float* const* q,
                           const int32_t* tok_pos, const int32_t* row_pos, float scale,
                           float* const* sc) {
  const DF d;
  const size_t full = dim / 16 * 16;
  size_t t = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kL == 16) {
    // 16 tokens at a time, row by row: each token's 16 lanes go to its kTreeSlot, and Tree16
    // reduces the 16 tokens together (the same tree as Reduce16 per token: the same bits), then
    // the tail channels in order, the scale and the mask elementwise.
    const hn::RebindToSigned<DF> di;
    for (; t + 16 <= n_tok; t += 16) {
      const float* kb = k + t * dim;
      for (size_t r = 0; r < RT; ++r) {
        const float* qr = q[r];
        // Slot s holds token kTreeSlot[s] (the map is its own inverse); 16 independent chains.
        VF tv[16];
        for (size_t s = 0; s < 16; ++s) tv[s] = hn::Zero(d);
        for (size_t c = 0; c < full; c += 16) {
          const VF qv = hn::LoadU(d, qr + c);
          const float* kc = kb + c;
          for (size_t s = 0; s < 16; ++s) {
            tv[s] = hn::Add(tv[s], hn::Mul(qv, hn::LoadU(d, kc + kTreeSlot[s] * dim)));
          }
        }
        VF dots = Tree16(d, tv);
        if (full < dim) {
          HWY_ALIGN float x[16];
          hn::Store(dots, d, x);
          for (size_t i = 0; i < 16; ++i) {
            for (size_t c = full; c < dim; ++c) x[i] += qr[c] * kb[i * dim + c];
          }
          dots = hn::Load(d, x);
        }
        dots = hn::Mul(dots, hn::Set(d, scale));
        if (tok_pos) {
          const auto future = hn::RebindMask(
              d, hn::Gt(hn::LoadU(di, tok_pos + t), hn::Set(di, row_pos[r])));
          dots = hn::IfThenElse(future, hn::Set(d, -std::numeric_limits<float>::infinity()), dots);
        }
        hn::StoreU(dots, d, sc[r] + t);
      }
    }
  }
#endif
  for (; t < n_tok; ++t) {
    const float* kt = k + t * dim;
    VF acc[RT][kN];
    for (size_t r = 0; r < RT; ++r)
      for (size_t j = 0; j < kN; ++j) acc[r][j] = hn::Zero(d);
    for (size_t c = 0; c < full; c += 16) {
      VF kv[kN];
      for (size_t j = 0; j < kN; ++j) kv[j] = hn::LoadU(d, kt + c + j * kL);
      for (size_t r = 0; r < RT; ++r) {
        for (size_t j = 0; j < kN; ++j) {
          acc[r][j] = hn::Add(acc[r][j], hn::Mul(hn::LoadU(d, q[r] + c + j * kL), kv[j]));
        }
      }
    }
    for (size_t r = 0; r < RT; ++r) {
      float dot = Reduce16(acc[r]);
      for (size_t c = full; c < dim; ++c) dot += q[r][c] * kt[c];
      sc[r][t] = tok_pos && tok_pos[t] > row_pos[r] ? -std::numeric_limits<float>::infinity()
                                                    : dot * scale;
    }
  }
}

// acc[r][c] += p[r][t] * v[t][c], token by token in order (per channel: no cross-lane sums).
template <size_t RT>
HWY_INLINE void ValuesTile(const float* v, size_t n_tok, size_t dim, const float* const* p,
                           float* const* acc) {
  const DF d;
  const size_t full = dim / 16 * 16;
  for (size_t c = 0; c < full; c += 16) {
    VF a[RT][kN];
    for (size_t r = 0; r < RT; ++r)
      for (size_t j = 0; j < kN; ++j) a[r][j] = hn::LoadU(d, acc[r] + c + j * kL);
    for (size_t t = 0; t < n_tok; ++t) {
      VF vv[kN];
      for (size_t j = 0; j < kN; ++j) vv[j] = hn::LoadU(d, v + t * dim + c + j * kL);
      for (size_t r = 0; r < RT; ++r) {
        const VF w = hn::Set(d, p[r][t]);
        for (size_t j = 0; j < kN; ++j) a[r][j] = hn::Add(a[r][j], hn::Mul(w, vv[j]));
      }
    }
    for (size_t r = 0; r < RT; ++r)
      for (size_t j = 0; j < kN; ++j) hn::StoreU(a[r][j], d, acc[r] + c + j * kL);
  }
  for (size_t c = full; c < dim; ++c) {
    for (size_t t = 0; t < n_tok; ++t) {
      const float x = v[t * dim + c];
      for (size_t r = 0; r < RT; ++r) acc[r][c] += p[r][t] * x;
    }
  }
}

// f(first_row, integral_constant<RT>) over tiles of 8, 4, 3 (a remainder of 3: GQA groups of 3
// load each key or value row once, not in a tile of 2 and one of 1), 2, 1 rows (rows are
// independent, so the tiling never changes a result).
template <class F>
HWY_INLINE void ForTiles(size_t n, F&& f) {
  size_t r = 0;
  for (; r + 8 <= n; r += 8) f(r, std::integral_constant<size_t, 8>());
  if (r + 4 <= n) f(r, std::integral_constant<size_t, 4>()), r += 4;
  if (r + 3 == n) return f(r, std::integral_constant<size_t, 3>());
  if (r + 2 <= n) f(r, std::integral_constant<size_t, 2>()), r += 2;
  if (r < n) f(r, std::integral_constant<size_t, 1>());
}

void Scores(const float* q, size_t n_rows, const float* k, size_t n_tok, size_t dim,
            const int32_t* tok_pos, const int32_t* row_pos, float scale, float* sc,
            size_t stride) {
  ForTiles(n_rows, [&](size_t r0, auto rt) {
    constexpr size_t RT = decltype(rt)::value;
    const float* qr[RT];
    float* s[RT];
    for (size_t r = 0; r < RT; ++r) {
      qr[r] = q + (r0 + r) * dim;
      s[r] = sc + (r0 + r) * stride;
    }
    ScoresTile<RT>(k, n_tok, dim, qr, tok_pos, row_pos ? row_pos + r0 : nullptr, scale, s);
  });
}

void DotScoresImpl(const float* q, size_t n_q, const float* k, size_t n_k, size_t dim,
                   float scale, float* out, size_t out_stride) {
  Scores(q, n_q, k, n_k, dim, nullptr, nullptr, scale, out, out_stride);
}

// One call of ChunkAttention::add_chunk: segments of kSegment tokens, each scored for every row,
// then the online softmax update (one rescale at most), then the values.
void AddChunkImpl(const Queries& q, float* m, float* l, float* acc, float* sc, const float* k,
                  const float* v, const int32_t* pos, size_t n) {
  const size_t dim = q.dim;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t s0 = 0; s0 < n; s0 += kSegment) {
    const size_t len = std::min(kSegment, n - s0);
    const float* ks = k + s0 * dim;
    const float* vs = v + s0 * dim;
    Scores(q.q, q.n_rows, ks, len, dim, pos + s0, q.positions, q.scale, sc, kSegment);
    for (size_t r = 0; r < q.n_rows; ++r) {
      float* s = sc + r * kSegment;
      float cmax = neg_inf;
      for (size_t t = 0; t < len; ++t) cmax = std::max(cmax, s[t]);
      if (cmax == neg_inf) {  // nothing visible in this segment: weights 0
        std::fill(s, s + len, 0.0f);
        continue;
      }
      if (cmax > m[r]) {
        float x = m[r] - cmax, alpha;  // -inf at first: alpha = 0
        exp_f32(&x, 1, &alpha);
        l[r] *= alpha;
        float* a = acc + r * dim;
        for (size_t c = 0; c < dim; ++c) a[c] *= alpha;
        m[r] = cmax;
      }
      for (size_t t = 0; t < len; ++t) s[t] -= m[r];  // -inf stays -inf -> p = 0
      exp_f32(s, len, s);
      for (size_t t = 0; t < len; ++t) l[r] += s[t];
    }
    ForTiles(q.n_rows, [&](size_t r0, auto rt) {
      constexpr size_t RT = decltype(rt)::value;
      const float* p[RT];
      float* a[RT];
      for (size_t r = 0; r < RT; ++r) {
        p[r] = sc + (r0 + r) * kSegment;
        a[r] = acc + (r0 + r) * dim;
      }
      ValuesTile<RT>(vs, len, dim, p, a);
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fast
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "util/growth.h"

namespace kvsdk::cpu::fast {

HWY_EXPORT(AddChunkImpl);
HWY_EXPORT(DotScoresImpl);

ChunkAttention::ChunkAttention(const Queries& q, ChunkScratch& scratch) : q_(q), s_(scratch) {
  // assign() reuses the capacity the buffers already have.
  s_.m.assign(q.n_rows, -std::numeric_limits<float>::infinity());
  s_.l.assign(q.n_rows, 0.0f);
  s_.acc.assign(q.n_rows * q.dim, 0.0f);
  at_least(s_.sc, q.n_rows * kSegment);
}

void ChunkAttention::add_chunk(const float* k, const float* v, const int32_t* positions,
                               size_t n_tokens) {
  if (n_tokens == 0 || q_.n_rows == 0) return;
  HWY_DYNAMIC_DISPATCH(AddChunkImpl)(q_, s_.m.data(), s_.l.data(), s_.acc.data(), s_.sc.data(),
                                     k, v, positions, n_tokens);
}

void ChunkAttention::finish(float* out) const {
  const size_t dim = q_.dim;
  for (size_t r = 0; r < q_.n_rows; ++r) {
    const float inv = s_.l[r] > 0.0f ? 1.0f / s_.l[r] : 0.0f;
    for (size_t c = 0; c < dim; ++c) out[r * dim + c] = s_.acc[r * dim + c] * inv;
  }
}

void dot_scores(const float* q, size_t n_q, const float* k, size_t n_k, size_t dim, float scale,
                float* out, size_t out_stride) {
  if (n_q == 0 || n_k == 0) return;
  HWY_DYNAMIC_DISPATCH(DotScoresImpl)(q, n_q, k, n_k, dim, scale, out, out_stride);
}

}  // namespace kvsdk::cpu::fast
#endif  // HWY_ONCE
