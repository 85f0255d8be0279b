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

// sc[r][t] = (q_r . k_t) * scale for a tile of RT rows (DotTile, then the scale elementwise),
// or -inf where the token is in the row's future (tok_pos null: nothing masked).
template <size_t RT>
HWY_INLINE void ScoresTile(const float* k, size_t n_tok, size_t dim, const float* const* q,
                           const int32_t* tok_pos, const int32_t* row_pos, float scale,
                           float* const* sc) {
  DotTile<RT>(k, n_tok, dim, q, sc);
  const DF d;
  const hn::RebindToSigned<DF> di;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < RT; ++r) {
    float* s = sc[r];
    size_t t = 0;
    for (; t + kL <= n_tok; t += kL) {
      VF x = hn::Mul(hn::LoadU(d, s + t), hn::Set(d, scale));
      if (tok_pos) {
        const auto future =
            hn::RebindMask(d, hn::Gt(hn::LoadU(di, tok_pos + t), hn::Set(di, row_pos[r])));
        x = hn::IfThenElse(future, hn::Set(d, neg_inf), x);
      }
      hn::StoreU(x, d, s + t);
    }
    for (; t < n_tok; ++t) s[t] = tok_pos && tok_pos[t] > row_pos[r] ? neg_inf : s[t] * scale;
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

}  // namespace kvsdk::cpu::fast
#endif  // HWY_ONCE
