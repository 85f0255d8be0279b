// Optimized decode attention (see fast_attention.h for the contract and the determinism scheme).
// This file is compiled once per Highway target: hwy/foreach_target.h re-includes it with
// HWY_TARGET set to each target, and HWY_DYNAMIC_DISPATCH picks the best one at run time.
//
// Targets: every attainable one (HWY_COMPILE_ALL_ATTAINABLE), so the scalar fallback is built and
// tested on aarch64 too, minus SSSE3 (SSE4 covers 128-bit x86; any x86-64-v2 CPU has it) and the
// SVE family, whose vector length is only known at run time: the 16 virtual lanes below need a
// compile-time lane count, and NEON serves the aarch64 devices we target (Jetson Orin has no SVE).
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fast_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "fast_attention.h"
#include "kivi_quant.h"
#include "util/half.h"

#ifndef KVSDK_FAST_ATTENTION_ONCE
#define KVSDK_FAST_ATTENTION_ONCE
namespace kvsdk::cpu::fast {
// Tokens per softmax segment: scores of a segment are computed for every row before its values
// are accumulated, so the running max changes at most once per segment (one rescale of acc).
constexpr size_t kChunk = 64;

// Offsets of every buffer inside the scratch floats.
struct Layout {
  size_t m, l, acc, zacc, sc, qs, qz, zf, ws, vsf, vzf, total;
  Layout(size_t n_rows, size_t dim, size_t ng) {
    size_t o = 0;
    const auto take = [&o](size_t n) { const size_t at = o; o += n; return at; };
    m = take(n_rows);                // running max score per row
    l = take(n_rows);                // running sum of exp(score - max) per row
    acc = take(n_rows * dim);        // running weighted sum of values (codes for KIVI)
    zacc = take(n_rows * ng);        // KIVI: running sum of p * value zero point, per group
    sc = take(n_rows * kChunk);      // scores, then probabilities, of one segment
    qs = take(n_rows * dim);         // KIVI: q * key scale of the current block
    qz = take(n_rows);               // KIVI: q . key zero of the current block
    zf = take(dim);                  // KIVI: key zero points of the block in f32
    ws = take(n_rows * kChunk * ng); // KIVI: p * value scale per token and group
    vsf = take(kChunk * ng);         // KIVI: value scales / zeros of a segment in f32
    vzf = take(kChunk * ng);
    total = o;
  }
};
}  // namespace kvsdk::cpu::fast
#endif

HWY_BEFORE_NAMESPACE();
namespace kvsdk {
namespace cpu {
namespace fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
constexpr size_t kL = hn::MaxLanes(DF());  // lanes of one vector: 16, 8, 4 or 1
static_assert(16 % kL == 0, "16 virtual lanes must be whole vectors");
constexpr size_t kN = 16 / kL;              // vectors per 16 virtual lanes

// ---- fixed-order reductions ----------------------------------------------------------------
// Sum of the lanes of one vector by the tree l + l+L/2, recursively (same order on every width).
#if HWY_TARGET == HWY_SCALAR
template <class D>
HWY_INLINE float ReduceVec(D, hn::Vec<D> v) {
  return hn::GetLane(v);  // one lane (the tree ran across the 16 vectors in Reduce16)
}
#else
template <class D>
HWY_INLINE float ReduceVec(D d, hn::Vec<D> v) {
  constexpr size_t L = hn::MaxLanes(d);
  if constexpr (L == 4) {
    const hn::Vec<D> w = hn::Add(v, hn::Shuffle1032(v));  // lanes 0+2, 1+3, ..
    return hn::GetLane(hn::Add(w, hn::Shuffle2301(w)));   // (0+2) + (1+3)
  } else {
    const hn::Half<D> dh;
    return ReduceVec(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}
#endif

// Sum of 16 virtual lanes held as kN vectors: l + l+8 first, then l + l+4, ... .
HWY_INLINE float Reduce16(const VF* a) {
  VF b[kN];
  for (size_t j = 0; j < kN; ++j) b[j] = a[j];
  for (size_t n = kN; n > 1; n /= 2) {
    for (size_t i = 0; i < n / 2; ++i) b[i] = hn::Add(b[i], b[i + n / 2]);
  }
  return ReduceVec(DF(), b[0]);
}

// a . b over dim floats: 16 virtual lanes, the fixed tree, then the tail channels in order.
HWY_INLINE float Dot16(const float* a, const float* b, size_t dim) {
  const DF d;
  VF acc[kN];
  for (size_t j = 0; j < kN; ++j) acc[j] = hn::Zero(d);
  const size_t full = dim / 16 * 16;
  for (size_t c = 0; c < full; c += 16) {
    for (size_t j = 0; j < kN; ++j) {
      acc[j] = hn::Add(acc[j], hn::Mul(hn::LoadU(d, a + c + j * kL), hn::LoadU(d, b + c + j * kL)));
    }
  }
  float s = Reduce16(acc);
  for (size_t c = full; c < dim; ++c) s += a[c] * b[c];
  return s;
}

// ---- deterministic exp ------------------------------------------------------------------------
// Cephes' expf: x = n ln2 + r (Cody-Waite, ln2 split so n * kLn2Hi is exact), a degree-6
// polynomial in r evaluated by separate multiplies and adds (no FMA), times 2^n assembled in the
// exponent bits. Below -87 the result is 0 (exp(-87) ~ 1.6e-38, next to f32's smallest normal);
// this also maps -inf (masked tokens, the initial max) to 0.
HWY_INLINE VF ExpVec(VF x) {
  const DF d;
  const DI di;
  const auto under = hn::Lt(x, hn::Set(d, -87.0f));
  x = hn::Min(hn::Max(x, hn::Set(d, -87.0f)), hn::Set(d, 88.0f));
  const VF n = hn::Floor(hn::Add(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, 0.5f)));
  VF r = hn::Sub(x, hn::Mul(n, hn::Set(d, 0.693359375f)));
  r = hn::Sub(r, hn::Mul(n, hn::Set(d, -2.12194440e-4f)));
  VF p = hn::Set(d, 1.9875691500e-4f);
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.3981999507e-3f));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 8.3334519073e-3f));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 4.1665795894e-2f));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.6666665459e-1f));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 5.0000001201e-1f));
  p = hn::Add(hn::Add(hn::Mul(p, hn::Mul(r, r)), r), hn::Set(d, 1.0f));
  const auto e = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  return hn::IfThenZeroElse(under, hn::Mul(p, hn::BitCast(d, e)));
}

// Elementwise, so any split into vectors gives the same bits; the tail goes through a padded
// vector of its own.
HWY_INLINE void ExpArray(const float* x, size_t n, float* out) {
  const DF d;
  size_t i = 0;
  for (; i + kL <= n; i += kL) hn::StoreU(ExpVec(hn::LoadU(d, x + i)), d, out + i);
  if (i < n) {
    HWY_ALIGN float buf[kL] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(ExpVec(hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (n - i), out + i);
  }
}

void ExpF32Impl(const float* x, size_t n, float* out) { ExpArray(x, n, out); }

// ---- row sources: 16 channels of one token row as kN f32 vectors ------------------------------
struct F16Rows {
  const uint16_t* base;  // [tokens][dim]
  size_t dim;
  HWY_INLINE void Load(size_t t, size_t c, VF* out) const {
    const DF d;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* p = reinterpret_cast<const hwy::float16_t*>(base + t * dim + c);
    for (size_t j = 0; j < kN; ++j) out[j] = hn::PromoteTo(d, hn::LoadU(dh, p + j * kL));
  }
  // f16 -> f32 is exact, so the portable scalar conversion gives Load's bits (finite values).
  HWY_INLINE float Scalar(size_t t, size_t c) const { return f16_to_f32(base[t * dim + c]); }
};

// Per-lane right shifts that bring lane l's code (bits l*B .. l*B+B-1 of the 16-code chunk,
// packed LSB-first) to bit 0 of the 32-bit word holding it.
HWY_ALIGN constexpr uint32_t kShift1[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
HWY_ALIGN constexpr uint32_t kShift2[16] = {0,  2,  4,  6,  8,  10, 12, 14,
                                            16, 18, 20, 22, 24, 26, 28, 30};
HWY_ALIGN constexpr uint32_t kShift4[16] = {0, 4, 8, 12, 16, 20, 24, 28,
                                            0, 4, 8, 12, 16, 20, 24, 28};

template <uint32_t B>
struct CodeRows {
  const uint8_t* base;  // [tokens][row_bytes], B-bit codes packed LSB-first
  size_t row_bytes;
  HWY_INLINE void Load(size_t t, size_t c, VF* out) const {
    const DF d;
    const DI di;
    const uint8_t* p = base + t * row_bytes + c * B / 8;  // 16 codes = 2B whole bytes
    if constexpr (B == 8) {
      const hn::Rebind<uint8_t, DI> d8;
      for (size_t j = 0; j < kN; ++j) out[j] = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, p + j * kL)));
    } else {
      const DU du;
      const auto mask = hn::Set(du, (1u << B) - 1u);
      uint32_t w[2] = {0, 0};
      std::memcpy(w, p, 2 * B);  // exactly the chunk's bytes (little-endian: byte i = bits 8i..)
      const uint32_t* shifts = B == 1 ? kShift1 : B == 2 ? kShift2 : kShift4;
#if HWY_CAP_GE512
      if constexpr (B == 4) {  // one 16-lane vector spans both words
        const hn::Half<DU> dh;
        const auto lo = hn::Set(dh, w[0]) >> hn::Load(dh, shifts);
        const auto hi = hn::Set(dh, w[1]) >> hn::Load(dh, shifts + 8);
        out[0] = hn::ConvertTo(d, hn::BitCast(di, hn::And(hn::Combine(du, hi, lo), mask)));
        return;
      }
#endif
      for (size_t j = 0; j < kN; ++j) {
        const uint32_t word = w[(j * kL * B) / 32];  // all lanes of vector j share one word
        const auto v = hn::Set(du, word) >> hn::LoadU(du, shifts + j * kL);
        out[j] = hn::ConvertTo(d, hn::BitCast(di, hn::And(v, mask)));
      }
    }
  }
  HWY_INLINE float Scalar(size_t t, size_t c) const {
    const uint8_t byte = base[t * row_bytes + c * B / 8];
    return float((byte >> (c * B % 8)) & ((1u << B) - 1u));
  }
};

// ---- the three steps of one segment, for a tile of RT rows ------------------------------------
// Scores: sc[r][t] = (bias[r] + qv[r] . k[t]) * scale, or -inf where the token is in the row's
// future. Each key chunk is loaded (converted/unpacked) once for all RT rows.
template <size_t RT, class KSrc>
HWY_INLINE void ScoresTile(const KSrc& ks, size_t n_tok, size_t dim, const float* const* qv,
                           const float* bias, const int32_t* tok_pos, const int32_t* row_pos,
                           float scale, float* const* sc) {
  const DF d;
  const size_t full = dim / 16 * 16;
  for (size_t t = 0; t < n_tok; ++t) {
    VF acc[RT][kN];
    for (size_t r = 0; r < RT; ++r)
      for (size_t j = 0; j < kN; ++j) acc[r][j] = hn::Zero(d);
    for (size_t c = 0; c < full; c += 16) {
      VF kv[kN];
      ks.Load(t, c, kv);
      for (size_t r = 0; r < RT; ++r) {
        for (size_t j = 0; j < kN; ++j) {
          acc[r][j] = hn::Add(acc[r][j], hn::Mul(hn::LoadU(d, qv[r] + c + j * kL), kv[j]));
        }
      }
    }
    for (size_t r = 0; r < RT; ++r) {
      float dot = Reduce16(acc[r]);
      for (size_t c = full; c < dim; ++c) dot += qv[r][c] * ks.Scalar(t, c);
      sc[r][t] = tok_pos[t] > row_pos[r] ? -std::numeric_limits<float>::infinity()
                                         : (bias[r] + dot) * scale;
    }
  }
}

// Values: acc[r][c] += w[r][t * wstride + c / group] * v[t][c] for every token in order. With
// group a multiple of 16 a chunk has one weight (broadcast); otherwise weights go per lane.
template <size_t RT, class VSrc>
HWY_INLINE void ValuesTile(const VSrc& vs, size_t n_tok, size_t dim, const float* const* w,
                           size_t wstride, size_t group, float* const* acc) {
  const DF d;
  const size_t full = dim / 16 * 16;
  const bool broadcast = group % 16 == 0;
  for (size_t c = 0; c < full; c += 16) {
    VF a[RT][kN];
    for (size_t r = 0; r < RT; ++r)
      for (size_t j = 0; j < kN; ++j) a[r][j] = hn::LoadU(d, acc[r] + c + j * kL);
    for (size_t t = 0; t < n_tok; ++t) {
      VF vv[kN];
      vs.Load(t, c, vv);
      for (size_t r = 0; r < RT; ++r) {
        const float* wt = w[r] + t * wstride;
        if (broadcast) {
          const VF wv = hn::Set(d, wt[c / group]);
          for (size_t j = 0; j < kN; ++j) a[r][j] = hn::Add(a[r][j], hn::Mul(wv, vv[j]));
        } else {
          HWY_ALIGN float lanes[16];
          for (size_t l = 0; l < 16; ++l) lanes[l] = wt[(c + l) / group];
          for (size_t j = 0; j < kN; ++j) {
            a[r][j] = hn::Add(a[r][j], hn::Mul(hn::Load(d, lanes + j * kL), vv[j]));
          }
        }
      }
    }
    for (size_t r = 0; r < RT; ++r)
      for (size_t j = 0; j < kN; ++j) hn::StoreU(a[r][j], d, acc[r] + c + j * kL);
  }
  for (size_t c = full; c < dim; ++c) {
    for (size_t t = 0; t < n_tok; ++t) {
      const float x = vs.Scalar(t, c);
      for (size_t r = 0; r < RT; ++r) acc[r][c] += w[r][t * wstride + c / group] * x;
    }
  }
}

// Runs f(first_row, integral_constant<RT>) over tiles of 8, 4, 2, 1 rows: the tile size is a
// compile-time constant so accumulators stay in registers; rows are independent, so tiling never
// changes a result.
template <class F>
HWY_INLINE void ForTiles(size_t n, F&& f) {
  size_t r = 0;
  for (; r + 8 <= n; r += 8) f(r, std::integral_constant<size_t, 8>());
  if (r + 4 <= n) f(r, std::integral_constant<size_t, 4>()), r += 4;
  if (r + 2 <= n) f(r, std::integral_constant<size_t, 2>()), r += 2;
  if (r < n) f(r, std::integral_constant<size_t, 1>());
}

// Softmax state over the scratch buffers.
struct State {
  const Queries* q;
  size_t ng;     // value groups (KIVI) or 1
  size_t vgroup;  // channels per value group (KIVI's G) or dim
  float *m, *l, *acc, *zacc, *sc, *qs, *qz, *zf, *ws, *vsf, *vzf;

  State(const Queries& queries, size_t n_groups, size_t group_channels, Scratch& scratch)
      : q(&queries), ng(n_groups), vgroup(group_channels) {
    const Layout lay(q->n_rows, q->dim, ng);
    float* b = scratch.data(lay.total);
    m = b + lay.m, l = b + lay.l, acc = b + lay.acc, zacc = b + lay.zacc, sc = b + lay.sc;
    qs = b + lay.qs, qz = b + lay.qz, zf = b + lay.zf, ws = b + lay.ws;
    vsf = b + lay.vsf, vzf = b + lay.vzf;
    std::fill(m, m + q->n_rows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + q->n_rows, 0.0f);
    std::fill(acc, acc + q->n_rows * q->dim, 0.0f);
    std::fill(zacc, zacc + q->n_rows * ng, 0.0f);
  }

  // Scores of n_tok tokens for every row (qv = q, or q * key scale with bias q . key zero).
  template <class KSrc>
  void Scores(const KSrc& ks, size_t n_tok, const float* qv_rows, const float* bias,
              const int32_t* tok_pos) {
    const size_t dim = q->dim;
    ForTiles(q->n_rows, [&](size_t r0, auto rt) {
      constexpr size_t RT = decltype(rt)::value;
      const float* qv[RT];
      float* s[RT];
      float b[RT];
      for (size_t r = 0; r < RT; ++r) {
        qv[r] = qv_rows + (r0 + r) * dim;
        s[r] = sc + (r0 + r) * kChunk;
        b[r] = bias ? bias[r0 + r] : 0.0f;
      }
      ScoresTile<RT>(ks, n_tok, dim, qv, b, tok_pos, q->positions + r0, q->scale, s);
    });
  }

  // Online softmax update: turns the segment's scores into probabilities p = exp(s - max) and
  // rescales the running sums when the max grows. Sums run token by token (fixed order).
  void Softmax(size_t n_tok) {
    const size_t dim = q->dim;
    for (size_t r = 0; r < q->n_rows; ++r) {
      float* s = sc + r * kChunk;
      float cmax = -std::numeric_limits<float>::infinity();
      for (size_t t = 0; t < n_tok; ++t) cmax = std::max(cmax, s[t]);
      if (cmax == -std::numeric_limits<float>::infinity()) {  // nothing visible: p = 0
        std::fill(s, s + n_tok, 0.0f);
        continue;
      }
      if (cmax > m[r]) {
        float x = m[r] - cmax, alpha;  // -inf at first: alpha = 0
        ExpArray(&x, 1, &alpha);
        l[r] *= alpha;
        float* a = acc + r * dim;
        for (size_t c = 0; c < dim; ++c) a[c] *= alpha;
        for (size_t g = 0; g < ng; ++g) zacc[r * ng + g] *= alpha;
        m[r] = cmax;
      }
      for (size_t t = 0; t < n_tok; ++t) s[t] -= m[r];  // -inf stays -inf -> p = 0
      ExpArray(s, n_tok, s);
      for (size_t t = 0; t < n_tok; ++t) l[r] += s[t];
    }
  }

  // acc += weights * values (weights: p, or p * value scale per group with wstride groups).
  template <class VSrc>
  void Values(const VSrc& vs, size_t n_tok, const float* w_rows, size_t w_row_stride,
              size_t wstride, size_t group) {
    const size_t dim = q->dim;
    ForTiles(q->n_rows, [&](size_t r0, auto rt) {
      constexpr size_t RT = decltype(rt)::value;
      const float* w[RT];
      float* a[RT];
      for (size_t r = 0; r < RT; ++r) {
        w[r] = w_rows + (r0 + r) * w_row_stride;
        a[r] = acc + (r0 + r) * dim;
      }
      ValuesTile<RT>(vs, n_tok, dim, w, wstride, group, a);
    });
  }

  // Exact f16 rows [first, first + n) of k/v.
  void F16Segments(const uint16_t* k, const uint16_t* v, const int32_t* pos, size_t n) {
    const size_t dim = q->dim;
    for (size_t s0 = 0; s0 < n; s0 += kChunk) {
      const size_t len = std::min(kChunk, n - s0);
      Scores(F16Rows{k + s0 * dim, dim}, len, q->q, nullptr, pos + s0);
      Softmax(len);
      Values(F16Rows{v + s0 * dim, dim}, len, sc, kChunk, 1, dim);
    }
  }

  void Finish(float* out) const {
    const size_t dim = q->dim;
    for (size_t r = 0; r < q->n_rows; ++r) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      for (size_t c = 0; c < dim; ++c) {
        out[r * dim + c] = (acc[r * dim + c] + zacc[r * ng + c / vgroup]) * inv;
      }
    }
  }
};

void AttendF16Impl(const Queries& q, const uint16_t* k, const uint16_t* v,
                   const int32_t* positions, size_t n_tokens, Scratch& scratch, float* out) {
  State st(q, 1, q.dim, scratch);
  st.F16Segments(k, v, positions, n_tokens);
  st.Finish(out);  // zacc stays 0 for f16 rows
}

// Quantized tokens of a KIVI store, B-bit codes: block by block (a key block shares per-channel
// scale/zero, so q * scale and q . zero are formed once per block and row).
template <uint32_t B>
void KiviQuantized(State& st, const KiviHeadStore& store) {
  const Queries& q = *st.q;
  const size_t dim = q.dim, G = store.config().group, ng = st.ng;
  const size_t row_bytes = kivi_packed_bytes(dim, B);
  const std::vector<uint32_t>& counts = store.block_token_counts();
  const uint8_t* kc = store.key_codes().data();
  const uint8_t* vc = store.value_codes().data();
  const uint16_t* ks = store.key_scales().data();
  const uint16_t* kz = store.key_zeros().data();
  const uint16_t* vsc = store.value_scales().data();
  const uint16_t* vz = store.value_zeros().data();
  const int32_t* pos = store.positions().data();
  size_t t0 = 0;
  for (size_t b = 0; t0 < store.quantized_tokens(); ++b) {
    const size_t bsize = counts.empty() ? G : counts[b];
    // f16 -> f32 through the same Highway conversion as the residual rows.
    for (size_t c = 0; c < dim; ++c) st.zf[c] = f16_to_f32(kz[b * dim + c]);
    for (size_t r = 0; r < q.n_rows; ++r) {
      float* qs = st.qs + r * dim;
      const float* qr = q.q + r * dim;
      for (size_t c = 0; c < dim; ++c) qs[c] = qr[c] * f16_to_f32(ks[b * dim + c]);
      st.qz[r] = Dot16(qr, st.zf, dim);
    }
    for (size_t s0 = 0; s0 < bsize; s0 += kChunk) {
      const size_t len = std::min(kChunk, bsize - s0), t = t0 + s0;
      st.Scores(CodeRows<B>{kc + t * row_bytes, row_bytes}, len, st.qs, st.qz, pos + t);
      st.Softmax(len);
      // Value weights p * scale per group, and the zero-point part p * zero, token by token.
      for (size_t i = 0; i < len * ng; ++i) {
        st.vsf[i] = f16_to_f32(vsc[t * ng + i]);
        st.vzf[i] = f16_to_f32(vz[t * ng + i]);
      }
      for (size_t r = 0; r < q.n_rows; ++r) {
        const float* p = st.sc + r * kChunk;
        float* w = st.ws + r * kChunk * ng;
        float* za = st.zacc + r * ng;
        for (size_t i = 0; i < len; ++i) {
          for (size_t g = 0; g < ng; ++g) {
            w[i * ng + g] = p[i] * st.vsf[i * ng + g];
            za[g] += p[i] * st.vzf[i * ng + g];
          }
        }
      }
      st.Values(CodeRows<B>{vc + t * row_bytes, row_bytes}, len, st.ws, kChunk * ng, ng, G);
    }
    t0 += bsize;
  }
}

void AttendKiviImpl(const Queries& q, const KiviHeadStore& store, Scratch& scratch, float* out) {
  const size_t ng = kivi_value_groups(q.dim, store.config().group);
  State st(q, ng, store.config().group, scratch);
  switch (store.config().bits) {
    case 1: KiviQuantized<1>(st, store); break;
    case 2: KiviQuantized<2>(st, store); break;
    case 4: KiviQuantized<4>(st, store); break;
    default: KiviQuantized<8>(st, store); break;
  }
  const size_t nq = store.quantized_tokens();
  st.F16Segments(store.residual_keys().data(), store.residual_values().data(),
                 store.positions().data() + nq, store.residual_tokens());
  st.Finish(out);
}

}  // namespace HWY_NAMESPACE
}  // namespace fast
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "util/error.h"

namespace kvsdk::cpu::fast {

HWY_EXPORT(AttendF16Impl);
HWY_EXPORT(AttendKiviImpl);
HWY_EXPORT(ExpF32Impl);

void Scratch::reserve(size_t n_rows, size_t dim, size_t value_groups) {
  const size_t n = Layout(n_rows, dim, std::max<size_t>(value_groups, 1)).total;
  if (n > buf_.capacity()) buf_.reserve(n);
}

float* Scratch::data(size_t floats) {
  if (floats > buf_.size()) {
    if (floats > buf_.capacity()) buf_.reserve(floats);
    buf_.resize(buf_.capacity());  // within capacity: no allocation
  }
  return buf_.data();
}

void attend_f16(const Queries& qs, const uint16_t* k, const uint16_t* v, const int32_t* positions,
                size_t n_tokens, Scratch& scratch, float* out) {
  if (qs.n_rows == 0 || qs.dim == 0) return;
  HWY_DYNAMIC_DISPATCH(AttendF16Impl)(qs, k, v, positions, n_tokens, scratch, out);
}

void attend_kivi(const Queries& qs, const KiviHeadStore& store, Scratch& scratch, float* out) {
  KVSDK_REQUIRE(store.head_dim() == qs.dim, "attend_kivi: query dim ", qs.dim,
                " != store head_dim ", store.head_dim());
  if (qs.n_rows == 0) return;
  HWY_DYNAMIC_DISPATCH(AttendKiviImpl)(qs, store, scratch, out);
}

void exp_f32(const float* x, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(ExpF32Impl)(x, n, out);
}

std::vector<Target> available_targets() {
  std::vector<Target> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.push_back({t, hwy::TargetName(t)});
  return out;
}

void force_target(int64_t target_bits) { hwy::SetSupportedTargetsForTest(target_bits); }

}  // namespace kvsdk::cpu::fast
#endif  // HWY_ONCE
