// Optimized decode attention (see fast_attention.h for the contract and the determinism scheme).
// This file is compiled once per Highway target: hwy/foreach_target.h re-includes it with
// HWY_TARGET set to each target, and HWY_DYNAMIC_DISPATCH picks the best one at run time.
//
// Targets: every attainable one (HWY_COMPILE_ALL_ATTAINABLE), so the scalar fallback is built and
// tested on aarch64 too, plus AVX3_DL (AVX-512 with VNNI and VBMI: Ice Lake and later, Zen 4),
// whose vpdpbusd / vpmultishiftqb carry the KIVI integer dot products; minus SSSE3 (SSE4 covers
// 128-bit x86; any x86-64-v2 CPU has it) and the SVE family, whose vector length is only known at
// run time: the 16 virtual lanes below need a compile-time lane count, and NEON serves the
// aarch64 devices we target (Jetson Orin has no SVE).
//
// Where the time goes (perf, Llama-like head: 4 query rows, head_dim 128, Zen 4): the f16 kernel
// is bound by reading the rows (the fixed reduction tree runs transposed over 16 tokens instead
// of per token; rows are prefetched a segment ahead). KIVI runs its dot products on integer codes
// (vpdpbusd) decoded in registers, with one token per lane for keys and one value group's 16
// channels per vector for values, so neither needs a horizontal reduction or per-lane weights.
// At 32k tokens (KIVI-2; perf, and each step knocked out in turn): value dots (with the value
// sums added to acc) ~30%, key dots ~27%, value weights ~15% (a third of it widening and
// transposing the value scales and zeros), per-block query codes ~15%, softmax ~9%; the dots
// are bound by vpdpbusd (2 per row, channel quad and token: 15- and 14-bit codes take a high
// and a low byte; 32 per token and KV head, about a third of the time on Zen 4 at 1 per cycle). Code rows are prefetched a segment ahead a
// few lines at a time (waiting on them was a quarter of the value dots), scales two blocks or
// one segment ahead.
#include "hwy_targets.h"  // the same Highway targets in every SIMD file (see there)

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fast_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "fast_lanes-inl.h"

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
constexpr size_t kSeg = 64;
// Integer ranges of the KIVI dot products (see the header): query codes are signed 15-bit (an
// 8-bit signed high part and a 7-bit low part for vpdpbusd); value weights are unsigned 14-bit
// (high and low bytes) or, with KiviConfig::weight_bits 7, one byte.
constexpr int32_t kQMax = 16383;
constexpr int32_t WeightMax(bool wide) { return wide ? 16383 : 127; }
// Below this a query block or a weight column is treated as zero (its reciprocal would overflow).
constexpr float kTiny = 1e-30f;

// Offsets (bytes, 64-aligned) of every buffer inside the scratch.
struct Layout {
  size_t m, lv, acc, zv, sc, tile, tails, krow, qsb, zf, kf, qz, dq, qmx, q16, qhi, qlo, kb, vb,
      vs, vz, vtmp, wq, dv, winv, whi, wlo, ii, total;
  Layout(size_t R, size_t D, size_t ng) {
    size_t o = 0;
    const auto take = [&o](size_t bytes) {
      const size_t at = o;
      o += (bytes + 63) / 64 * 64;
      return at;
    };
    const size_t f = sizeof(float);
    m = take(R * f);                      // running max score per row
    lv = take(R * 16 * f);                // running sum of p per row, 16 virtual lanes
    acc = take(R * D * f);                // running weighted sum of values
    zv = take(R * ng * 16 * f);           // KIVI: running sum of p * value zero, 16 lanes
    sc = take(R * kSeg * f);              // scores, then probabilities, of one segment
    tile = take(R * 16 * 16 * f);         // 16 tokens' 16-lane partial dots per row
    tails = take(R * 16 * f);             // their channels past the last multiple of 16
    krow = take(D * f);                   // one f16 key row in f32
    qsb = take(R * D * f);                // KIVI: q * key scale of the block
    zf = take(D * f);                     // KIVI: key zeros of the block in f32
    kf = take(D * f);                     // KIVI: key scales of the block in f32
    qz = take(R * f);                     // KIVI: q . key zero of the block
    dq = take(R * f);                     // KIVI: step of the row's query codes
    qmx = take(R * f);                    // KIVI: max |q * key scale|, then its reciprocal step
    q16 = take(R * D * 2);                // KIVI: query codes (int16)
    qhi = take(R * D);                    // KIVI: their high (signed) and low 7-bit bytes
    qlo = take(R * D);
    kb = take(kSeg * D);                  // KIVI: key codes of a segment, one byte each
    vb = take(kSeg * D);                  // KIVI: value codes of a segment, one byte each
    vs = take(ng * kSeg * f);             // KIVI: value scales [group][token] in f32
    vz = take(ng * kSeg * f);             // KIVI: value zeros [group][token]
    vtmp = take(2 * ng * kSeg * f);       // KIVI: both as stored, [token][group]
    wq = take(R * ng * kSeg * 4);         // KIVI: value weight codes [row][group][token]
    dv = take(R * ng * f);                // KIVI: their step per row and group
    winv = take(R * ng * f);              // KIVI: its reciprocal (AVX3_DL weights)
    whi = take(R * ng * (kSeg / 4) * 4);  // KIVI: weight code bytes, 4 tokens per dword
    wlo = take(R * ng * (kSeg / 4) * 4);
    ii = take(R * D * 4);                 // KIVI: integer value sums of a segment
    total = o;
  }
};
}  // namespace kvsdk::cpu::fast
#endif

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3_DL
// Highway 1.0.3's AVX3_DL target string names the VEX AVX-VNNI; the EVEX form is what we use.
#pragma GCC target("avx512vnni")
#endif
namespace kvsdk {
namespace cpu {
namespace fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DI = hn::RebindToSigned<DF>;
using VI = hn::Vec<DI>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// DF, VF, kL, kN, ReduceVec and Reduce16 (the fixed-order reductions) come from fast_lanes-inl.h.

HWY_INLINE float Reduce16(const float* lanes) {
  VF a[kN];
  for (size_t j = 0; j < kN; ++j) a[j] = hn::LoadU(DF(), lanes + j * kL);
  return Reduce16(a);
}

// kTreeSlot and Tree16 (Reduce16 of 16 tokens at once) come from fast_lanes-inl.h too.

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

HWY_INLINE float Exp1(float x) {
  float y;
  ExpArray(&x, 1, &y);
  return y;
}

void ExpF32Impl(const float* x, size_t n, float* out) { ExpArray(x, n, out); }

// round(x) as floor(x + 0.5): +, floor and a conversion of an integral value, so every target
// (including the scalar one, whose NearestInt adds its own bias) gives the same integer.
HWY_INLINE VI RoundToInt(VF x) {
  return hn::ConvertTo(DI(), hn::Floor(hn::Add(x, hn::Set(DF(), 0.5f))));
}

// ---- softmax state ----------------------------------------------------------------------------
struct State {
  const Queries* q;
  size_t R, D;
  size_t ng;      // value groups (KIVI) or 1
  size_t vgroup;  // channels per value group (KIVI's G) or dim
  uint8_t* base;
  Layout lay;
  float *m, *lv, *acc, *zv, *sc, *tile;
  const KiviTaps* taps = nullptr;  // SpeCache's score copies and exclusions (fast_attention.h)
  size_t tap_base = 0;             // store index of the f16 rows' first token (the residual)
  bool scores_only = false;        // kivi_scores: no softmax, no values

  State(const Queries& queries, size_t n_groups, size_t group_channels, Scratch& scratch)
      : q(&queries), R(queries.n_rows), D(queries.dim), ng(n_groups), vgroup(group_channels),
        lay(R, D, ng) {
    base = reinterpret_cast<uint8_t*>(scratch.data((lay.total + 3) / 4));
    m = F(lay.m), lv = F(lay.lv), acc = F(lay.acc), zv = F(lay.zv), sc = F(lay.sc);
    tile = F(lay.tile);
    std::fill(m, m + R, kNegInf);
    std::fill(lv, lv + R * 16, 0.0f);
    std::fill(acc, acc + R * D, 0.0f);
    std::fill(zv, zv + R * ng * 16, 0.0f);
    std::fill(tile, tile + R * 256, 0.0f);  // Tree16 reads all 16 slots of a partial tile
  }
  float* F(size_t off) const { return reinterpret_cast<float*>(base + off); }

  // The taps of scores sc[r][off, off + n), which belong to store tokens token .. token + n - 1:
  // copied out, then excluded tokens set to -inf (the softmax then gives them p = 0).
  void Tap(size_t token, size_t off, size_t n) const {
    for (size_t r = 0; r < R; ++r) {
      float* s = sc + r * kSeg + off;
      if (taps->scores) std::copy_n(s, n, taps->scores + r * taps->scores_stride + token);
      if (!taps->exclude) continue;
      const uint8_t* x = taps->exclude + token;
      for (size_t i = 0; i < n; ++i) s[i] = x[i] ? kNegInf : s[i];
    }
  }
  template <class T>
  T* At(size_t off) const {
    return reinterpret_cast<T*>(base + off);
  }

  // Online softmax update for the segment's scores sc[r][0..n): probabilities p = exp(s - max)
  // replace them (pads up to a multiple of 16 become 0), and the running sums are rescaled when
  // the max grows. The sum of p runs in 16 virtual lanes (token i of the segment -> lane i % 16).
  HWY_NOINLINE void Softmax(size_t n) {
    const DF d;
    const size_t n16 = (n + 15) / 16 * 16;
    for (size_t r = 0; r < R; ++r) {
      float* s = sc + r * kSeg;
      std::fill(s + n, s + n16, kNegInf);
      VF mx = hn::Set(d, kNegInf);
      for (size_t i = 0; i < n16; i += kL) mx = hn::Max(mx, hn::LoadU(d, s + i));
      const float cmax = hn::GetLane(hn::MaxOfLanes(d, mx));  // max is exact in any order
      if (cmax == kNegInf) {  // nothing visible: p = 0
        std::fill(s, s + n16, 0.0f);
        continue;
      }
      if (cmax > m[r]) {
        Rescale(r, Exp1(m[r] - cmax));  // -inf at first: alpha = 0
        m[r] = cmax;
      }
      const VF mv = hn::Set(d, m[r]);
      float* l = lv + r * 16;
      VF la[kN];  // the lane sums in registers (same adds in the same order as in memory)
      for (size_t j = 0; j < kN; ++j) la[j] = hn::LoadU(d, l + j * kL);
      for (size_t i = 0; i < n16; i += 16) {
        for (size_t j = 0; j < kN; ++j) {
          const VF p = ExpVec(hn::Sub(hn::LoadU(d, s + i + j * kL), mv));  // -inf -> 0
          hn::StoreU(p, d, s + i + j * kL);
          la[j] = hn::Add(la[j], p);
        }
      }
      for (size_t j = 0; j < kN; ++j) hn::StoreU(la[j], d, l + j * kL);
    }
  }

  void Rescale(size_t r, float alpha) {
    const DF d;
    const VF a = hn::Set(d, alpha);
    const auto scale = [&](float* x, size_t n) {
      size_t i = 0;
      for (; i + kL <= n; i += kL) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), a), d, x + i);
      for (; i < n; ++i) x[i] *= alpha;
    };
    scale(acc + r * D, D);
    scale(lv + r * 16, 16);
    scale(zv + r * ng * 16, ng * 16);
  }

  // The partial state of every row: max, sum of p (the fixed tree over the 16 lanes), and acc
  // with the zero-point sums folded in (acc + sum p z of the channel's group).
  void Emit(const PartialState& out) const {
    for (size_t r = 0; r < R; ++r) {
      out.max[r] = m[r];
      out.sum[r] = Reduce16(lv + r * 16);
      float* o = out.acc + r * D;
      const float* a = acc + r * D;
      for (size_t g = 0; g < ng; ++g) {
        const float z = Reduce16(zv + (r * ng + g) * 16);
        const size_t c1 = std::min(D, (g + 1) * vgroup);
        for (size_t c = g * vgroup; c < c1; ++c) o[c] = a[c] + z;
      }
    }
  }
};

// ---- exact f16 rows ---------------------------------------------------------------------------
// Where the f16 kernels read token i's row, and its scale. DenseRows: rows [n][D] in order, each
// used as stored (the exact tier). SlotRows (fast_attention.h's ScaledF16Rows): token i's row
// found through its slot, either a stored row times a per-row scale (its score is
// (q . row) * scale_i * q.scale, its value weight p * scale_i) or a direct row used as stored.
struct DenseRows {
  static constexpr bool kScaled = false;
  const uint16_t* p;
  size_t D;
  HWY_INLINE const uint16_t* row(size_t i) const { return p + i * D; }
  HWY_INLINE float scale(size_t) const { return 1.0f; }
  HWY_INLINE DenseRows from(size_t i) const { return {p + i * D, D}; }
};

struct SlotRows {
  static constexpr bool kScaled = true;
  const uint32_t* slot;
  const uint16_t* scaled;
  const float* scales;
  const uint16_t* direct;
  size_t D;
  HWY_INLINE const uint16_t* row(size_t i) const {
    const uint32_t s = slot[i];
    return (s & kDirectRow) ? direct + size_t(s & ~kDirectRow) * D : scaled + size_t(s) * D;
  }
  HWY_INLINE float scale(size_t i) const {
    const uint32_t s = slot[i];
    return (s & kDirectRow) ? 1.0f : scales[s];
  }
  HWY_INLINE SlotRows from(size_t i) const { return {slot + i, scaled, scales, direct, D}; }
};

// Requests one f16 row's cache lines (a hint: never faults, never changes results).
HWY_INLINE void PrefetchRow(const uint16_t* row, size_t D) {
  const auto* p = reinterpret_cast<const uint8_t*>(row);
  for (size_t b = 0; b < D * 2; b += 64) hwy::Prefetch(p + b);
}

// 16 virtual lanes of q . k for RT rows and one token (key row kf in f32): lane l sums channels
// c = l mod 16 in channel order starting from 0; the rows' chains are interleaved so the adds
// overlap. With 16-lane vectors the lanes go to the tile for Tree16, else Reduce16 runs here.
template <size_t RT>
HWY_INLINE void DotRows(State& st, const float* kf, const uint16_t* row, size_t r0, size_t i0,
                        size_t i, size_t full) {
  const DF d;
  const size_t D = st.D;
  VF acc[RT][kN];
  for (size_t r = 0; r < RT; ++r)
    for (size_t j = 0; j < kN; ++j) acc[r][j] = hn::Zero(d);
  for (size_t c = 0; c < full; c += 16) {
    for (size_t j = 0; j < kN; ++j) {
      const VF kv = hn::Load(d, kf + c + j * kL);
      for (size_t r = 0; r < RT; ++r) {
        const VF qv = hn::LoadU(d, st.q->q + (r0 + r) * D + c + j * kL);
        acc[r][j] = hn::Add(acc[r][j], hn::Mul(qv, kv));
      }
    }
  }
  for (size_t r = 0; r < RT; ++r) {
#if HWY_TARGET != HWY_SCALAR
    if constexpr (kL == 16) {
      hn::Store(acc[r][0], d, st.tile + ((r0 + r) * 16 + kTreeSlot[i]) * 16);
    } else {
      st.sc[(r0 + r) * kSeg + i0 + i] = Reduce16(acc[r]);
    }
#else
    st.sc[(r0 + r) * kSeg + i0 + i] = Reduce16(acc[r]);
#endif
    const float* qr = st.q->q + (r0 + r) * D;
    float t = 0.0f;  // channels past the last multiple of 16, after the tree (as Dot16)
    for (size_t c = full; c < D; ++c) t += qr[c] * f16_to_f32(row[c]);
    st.F(st.lay.tails)[(r0 + r) * 16 + i] = t;
  }
}

// Scores of tokens [0, n) of a segment: sc[r][i] = (q_r . k_i) * scale, -inf in a row's future.
// Each key row is converted once for all rows; with 16-lane vectors the 16-lane partial sums of
// 16 tokens are parked in `tile` and reduced together by Tree16.
template <class Rows>
HWY_NOINLINE void ScoresF16(State& st, const Rows& k, const int32_t* pos, size_t n,
                            size_t ahead) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t D = st.D, R = st.R, full = D / 16 * 16;
  const Queries& q = *st.q;
  float* kf = st.F(st.lay.krow);
  float* tails = st.F(st.lay.tails);
  for (size_t i0 = 0; i0 < n; i0 += 16) {
    const size_t cnt = std::min<size_t>(16, n - i0);
    for (size_t i = 0; i < cnt; ++i) {
      const uint16_t* row = k.row(i0 + i);
      if (i0 + i < ahead) PrefetchRow(k.row(i0 + i + kSeg), D);
      for (size_t c = 0; c < full; c += kL) {
        hn::Store(hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row + c))),
                  d, kf + c);
      }
      size_t r0 = 0;
      for (; r0 + 4 <= R; r0 += 4) DotRows<4>(st, kf, row, r0, i0, i, full);
      switch (R - r0) {  // the rows left in one tile (independent chains overlap)
        case 3: DotRows<3>(st, kf, row, r0, i0, i, full); break;
        case 2: DotRows<2>(st, kf, row, r0, i0, i, full); break;
        case 1: DotRows<1>(st, kf, row, r0, i0, i, full); break;
        default: break;
      }
    }
    for (size_t r = 0; r < R; ++r) {
      float* s = st.sc + r * kSeg + i0;
#if HWY_TARGET != HWY_SCALAR
      if constexpr (kL == 16) {
        VF tv[16];
        for (size_t i = 0; i < 16; ++i) tv[i] = hn::Load(d, st.tile + (r * 16 + i) * 16);
        hn::StoreU(Tree16(d, tv), d, s);
      }
#endif
      const int32_t qp = q.positions ? q.positions[r] : INT32_MAX;
      for (size_t i = 0; i < cnt; ++i) {
        float dot = full < D ? s[i] + tails[r * 16 + i] : s[i];
        if constexpr (Rows::kScaled) dot *= k.scale(i0 + i);
        s[i] = pos[i0 + i] > qp ? kNegInf : dot * q.scale;
      }
    }
  }
}

// acc[r][c] += p[r][i] * v[i][c] for the segment's tokens in order (per channel, so no
// cross-lane order). CH vectors of channels per row stay in registers while the tokens stream.
template <size_t CH, class Rows>
HWY_INLINE void ValuesF16Chunk(State& st, const Rows& v, size_t n, size_t c0, size_t ahead) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t D = st.D;
  for (size_t r0 = 0; r0 < st.R; r0 += 4) {
    const size_t rt = std::min<size_t>(4, st.R - r0);
    VF a[4][CH];
    for (size_t r = 0; r < rt; ++r)
      for (size_t j = 0; j < CH; ++j) a[r][j] = hn::LoadU(d, st.acc + (r0 + r) * D + c0 + j * kL);
    for (size_t i = 0; i < n; ++i) {
      VF vv[CH];
      if (c0 == 0 && r0 == 0 && i < ahead) PrefetchRow(v.row(i + kSeg), D);
      const auto* row = reinterpret_cast<const hwy::float16_t*>(v.row(i) + c0);
      for (size_t j = 0; j < CH; ++j) vv[j] = hn::PromoteTo(d, hn::LoadU(dh, row + j * kL));
      for (size_t r = 0; r < rt; ++r) {
        const VF p = hn::Set(d, st.sc[(r0 + r) * kSeg + i]);
        for (size_t j = 0; j < CH; ++j) a[r][j] = hn::Add(a[r][j], hn::Mul(p, vv[j]));
      }
    }
    for (size_t r = 0; r < rt; ++r)
      for (size_t j = 0; j < CH; ++j) hn::StoreU(a[r][j], d, st.acc + (r0 + r) * D + c0 + j * kL);
  }
}

template <class Rows>
HWY_INLINE void ValuesF16(State& st, const Rows& v, size_t n, size_t ahead) {
  const size_t D = st.D;
  constexpr size_t CH = kL == 1 ? 1 : 64 / kL;  // 64 channels per pass (4 AVX-512 vectors)
  size_t c = 0;
  for (; c + CH * kL <= D; c += CH * kL) ValuesF16Chunk<CH>(st, v, n, c, ahead);
  for (; c + kL <= D; c += kL) ValuesF16Chunk<1>(st, v, n, c, ahead);
  for (; c < D; ++c) {
    for (size_t i = 0; i < n; ++i) {
      const float x = f16_to_f32(v.row(i)[c]);
      for (size_t r = 0; r < st.R; ++r) st.acc[r * D + c] += st.sc[r * kSeg + i] * x;
    }
  }
}

// Requests the cache lines of [p, p + bytes) clipped to end (a hint: never faults, never changes
// results).
HWY_INLINE void Prefetch(const uint8_t* p, size_t bytes, const uint8_t* end) {
  if (p >= end) return;
  const uint8_t* stop = std::min(p + bytes, end);
  for (; p < stop; p += 64) hwy::Prefetch(p);
}

// Scaled value rows: the weights p (already summed into the softmax state) times each token's
// value scale, in place (elementwise: the same bits on every target).
template <class Rows>
HWY_INLINE void ScaleWeights(State& st, const Rows& v, size_t n) {
  if constexpr (Rows::kScaled) {
    HWY_ALIGN float w[kSeg];
    for (size_t i = 0; i < n; ++i) w[i] = v.scale(i);
    for (size_t r = 0; r < st.R; ++r) {
      float* s = st.sc + r * kSeg;
      for (size_t i = 0; i < n; ++i) s[i] *= w[i];
    }
  }
}

// Rows [0, n) of k/v (DenseRows or SlotRows), in segments of kSeg.
template <class Rows>
void RowSegments(State& st, const Rows& k, const Rows& v, const int32_t* pos, size_t n) {
  for (size_t s0 = 0; s0 < n; s0 += kSeg) {
    const size_t len = std::min(kSeg, n - s0);
    // Rows of the next segment are requested while this one is computed (kSeg tokens ahead).
    const size_t ahead = std::min(kSeg, n - std::min(n, s0 + kSeg));
    const Rows ks = k.from(s0), vs = v.from(s0);
    ScoresF16(st, ks, pos + s0, len, ahead);
    if (st.taps) st.Tap(st.tap_base + s0, 0, len);
    if (st.scores_only) continue;
    st.Softmax(len);
    ScaleWeights(st, vs, len);
    ValuesF16(st, vs, len, ahead);
  }
}

// f16 rows [0, n) of k/v, in segments of kSeg.
void F16Segments(State& st, const uint16_t* k, const uint16_t* v, const int32_t* pos, size_t n) {
  RowSegments(st, DenseRows{k, st.D}, DenseRows{v, st.D}, pos, n);
}

// ---- KIVI: codes to bytes ---------------------------------------------------------------------
// One token row of B-bit codes (packed LSB-first) to one byte per channel, channel order.
template <uint32_t B>
HWY_INLINE void UnpackRow(const uint8_t* p, size_t D, uint8_t* out) {
  if constexpr (B == 8) {
    std::memcpy(out, p, D);
  } else {
    constexpr uint32_t per = 8 / B, mask = (1u << B) - 1u;
    const size_t full = D / per;
    for (size_t i = 0; i < full; ++i) {
      const uint32_t x = p[i];
      for (uint32_t k = 0; k < per; ++k) out[i * per + k] = uint8_t((x >> (k * B)) & mask);
    }
    for (size_t c = full * per; c < D; ++c) out[c] = uint8_t((p[c / per] >> (c % per * B)) & mask);
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// The same with vpmultishiftqb: each output byte picks its 8-bit window from its qword, so 64
// channels cost one load, one qword permute and one AND. Needs D % 64 == 0.
template <uint32_t B>
struct Vbmi {
  alignas(64) uint8_t ctl[64];
  alignas(64) uint64_t src[8];
  constexpr Vbmi() : ctl(), src() {
    for (uint32_t s = 0; s < 8; ++s) {
      src[s] = 8 * s * B / 64;  // source qword of output qword s
      for (uint32_t i = 0; i < 8; ++i) ctl[8 * s + i] = uint8_t((8 * s * B) % 64 + i * B);
    }
  }
};

// 64 channels of one row from their 8B packed bytes.
template <uint32_t B>
HWY_INLINE __m512i Decode64(const uint8_t* chunk, __m512i ctl, __m512i src, __m512i mask) {
  if constexpr (B == 8) {
    return _mm512_loadu_si512(chunk);
  } else {
    __m512i x;
    if constexpr (B == 1) {
      uint64_t w;
      std::memcpy(&w, chunk, 8);
      x = _mm512_set1_epi64(int64_t(w));
    } else if constexpr (B == 2) {
      x = _mm512_permutexvar_epi64(
          src, _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk))));
    } else {
      x = _mm512_permutexvar_epi64(
          src, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk))));
    }
    return _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, x), mask);
  }
}

template <uint32_t B>
struct Decoder {
  __m512i ctl, src, mask;
  Decoder() {
    static constexpr Vbmi<B> kT;
    ctl = _mm512_load_si512(kT.ctl);
    src = _mm512_load_si512(kT.src);
    mask = _mm512_set1_epi8(char(B == 8 ? 0xFF : (1u << B) - 1u));
  }
  HWY_INLINE __m512i operator()(const uint8_t* chunk) const {
    return Decode64<B>(chunk, ctl, src, mask);
  }
};

#endif

// ---- KIVI: the quantized blocks ---------------------------------------------------------------
struct KiviView {
  size_t D, G, ng, row_bytes;
  const uint8_t *kc, *vc;
  const uint16_t *ks, *kz, *vsc, *vz;
  const int32_t* pos;
  bool vnni;  // AVX3_DL integer layout applies (D 64, 128 or 256, G % 32 == 0)
  bool wide;  // weight_bits 14: value weights as high and low bytes (7: one byte)
  const uint16_t *ks_end, *kz_end;
  const uint8_t *kc_end, *vc_end;
  const uint16_t *vs_end, *vz_end;
};

// f16 -> f32 of n values (exact; the vector conversion where whole vectors fit).
HWY_INLINE void WidenF16(const uint16_t* x, size_t n, float* out) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  size_t i = 0;
  for (; i + kL <= n; i += kL) {
    hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(x + i))), d,
               out + i);
  }
  for (; i < n; ++i) out[i] = f16_to_f32(x[i]);
}

// The AVX3_DL lane kernels (QueryCodesVnni, KeyDotsLanes, WeightsVnni, ValueDotsLanes).
#include "fast_attention_vnni-inl.h"

// Per block and row: query codes Q = round(q * key scale / dq) in [-kQMax, kQMax], with
// dq = max |q * scale| / kQMax, and the exact-float bias q . key zero.
HWY_NOINLINE void PrepareKeyBlock(State& st, const KiviView& kv, size_t b) {
  const DF d;
  const DI di;
  const hn::Rebind<int16_t, DI> d16;
  const hn::Rebind<int8_t, DI> d8;
  const size_t D = st.D, full = D / kL * kL;
  float* zf = st.F(st.lay.zf);
  float* kf = st.F(st.lay.kf);
  float* qs = st.F(st.lay.qsb);
  WidenF16(kv.kz + b * D, D, zf);
  WidenF16(kv.ks + b * D, D, kf);
  // The scales and zeros two blocks ahead: touched once per block, too sparse a stream for the
  // hardware prefetcher to lead (one block ahead still left loads waiting at 32k tokens).
  Prefetch(reinterpret_cast<const uint8_t*>(kv.kz + (b + 2) * D), D * 2,
           reinterpret_cast<const uint8_t*>(kv.kz_end));
  Prefetch(reinterpret_cast<const uint8_t*>(kv.ks + (b + 2) * D), D * 2,
           reinterpret_cast<const uint8_t*>(kv.ks_end));
  float* qz = st.F(st.lay.qz);
  float* dq = st.F(st.lay.dq);
  int16_t* q16 = st.At<int16_t>(st.lay.q16);
  int8_t* qhi = st.At<int8_t>(st.lay.qhi);
  int8_t* qlo = st.At<int8_t>(st.lay.qlo);
#if HWY_TARGET == HWY_AVX3_DL
  if (kv.vnni) {
    switch (D) {
      case 64: QueryCodesVnni<4>(st, kf); break;
      case 128: QueryCodesVnni<8>(st, kf); break;
      default: QueryCodesVnni<16>(st, kf); break;  // 256 (kv.vnni)
    }
    for (size_t r = 0; r < st.R; ++r) qz[r] = Dot16(st.q->q + r * D, zf, D);
    return;
  }
#endif
  // Three passes over the rows, so the rows' dependency chains (max, divide, round) overlap.
  float* mx = st.F(st.lay.qmx);
  for (size_t r = 0; r < st.R; ++r) {
    const float* qr = st.q->q + r * D;
    float* q = qs + r * D;
    VF mxv = hn::Zero(d);
    for (size_t c = 0; c < full; c += kL) {
      const VF x = hn::Mul(hn::LoadU(d, qr + c), hn::Load(d, kf + c));
      hn::StoreU(x, d, q + c);  // rows of odd dims are not vector-aligned
      mxv = hn::Max(mxv, hn::Abs(x));
    }
    float m = hn::GetLane(hn::MaxOfLanes(d, mxv));  // max is exact in any order
    for (size_t c = full; c < D; ++c) {
      q[c] = qr[c] * kf[c];
      m = std::max(m, std::fabs(q[c]));
    }
    mx[r] = m;
  }
  for (size_t r = 0; r < st.R; ++r) {
    const bool zero = !(mx[r] >= kTiny);
    dq[r] = zero ? 0.0f : mx[r] * (1.0f / float(kQMax));  // a multiply: same bits everywhere
    mx[r] = zero ? 0.0f : float(kQMax) / mx[r];          // now the reciprocal step
  }
  for (size_t r = 0; r < st.R; ++r) {
    const float* q = qs + r * D;
    const VF iv = hn::Set(d, mx[r]);
    int16_t* o16 = q16 + r * D;
    int8_t* ohi = qhi + r * D;
    int8_t* olo = qlo + r * D;
    for (size_t c = 0; c < full; c += kL) {
      VI v = RoundToInt(hn::Mul(hn::LoadU(d, q + c), iv));
      v = hn::Min(hn::Max(v, hn::Set(di, -kQMax)), hn::Set(di, kQMax));
      if (kv.vnni) {
        // x = 128 hi + lo with lo in [0, 127] (arithmetic shift): vpdpbusd's signed bytes.
#if HWY_TARGET == HWY_AVX3_DL
        _mm_storeu_si128(reinterpret_cast<__m128i*>(ohi + c),
                         _mm512_cvtepi32_epi8(_mm512_srai_epi32(v.raw, 7)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(olo + c),
                         _mm512_cvtepi32_epi8(_mm512_and_si512(v.raw, _mm512_set1_epi32(127))));
#else
        hn::StoreU(hn::DemoteTo(d8, hn::ShiftRight<7>(v)), d8, ohi + c);
        hn::StoreU(hn::DemoteTo(d8, hn::And(v, hn::Set(di, 127))), d8, olo + c);
#endif
      } else {
        hn::StoreU(hn::DemoteTo(d16, v), d16, o16 + c);
      }
    }
    for (size_t c = full; c < D; ++c) {
      HWY_ALIGN float one[kL] = {};
      one[0] = q[c];
      VI v = RoundToInt(hn::Mul(hn::Load(d, one), iv));
      v = hn::Min(hn::Max(v, hn::Set(di, -kQMax)), hn::Set(di, kQMax));
      const int32_t x = hn::GetLane(v);
      o16[c] = int16_t(x);
      ohi[c] = int8_t(x >> 7);
      olo[c] = int8_t(x & 127);
    }
  }
  for (size_t r = 0; r < st.R; ++r) qz[r] = Dot16(st.q->q + r * D, zf, D);
}

// Integer key dots I[r][i] = sum_c Q[r][c] code[i][c] of the segment's tokens, as floats into
// sc (exact: |I| < 2^31 by kQMax; float conversion rounds identically everywhere).
HWY_NOINLINE void KeyDotsGeneric(State& st, size_t off, size_t n) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Rebind<uint8_t, decltype(d16)> d8;
  const hn::RebindToUnsigned<decltype(d16)> du16;
  constexpr size_t L16 = hn::MaxLanes(d16);
  const size_t D = st.D, full = D / L16 * L16;
  const uint8_t* kb = st.At<uint8_t>(st.lay.kb) + off * D;
  const int16_t* q16 = st.At<int16_t>(st.lay.q16);
  for (size_t r = 0; r < st.R; ++r) {
    const int16_t* qr = q16 + r * D;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* code = kb + i * D;
      auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
      for (size_t c = 0; c < full; c += L16) {
        const auto cv = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(d8, code + c)));
        s0 = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, qr + c), cv, s0, s1);
      }
      int32_t t = hn::GetLane(hn::SumOfLanes(d32, hn::RearrangeToOddPlusEven(s0, s1)));
      for (size_t c = full; c < D; ++c) t += int32_t(qr[c]) * int32_t(code[c]);
      st.sc[r * kSeg + off + i] = float(t);
    }
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// The same with vpdpbusd (codes unsigned bytes x query signed bytes, 4 products per int32 lane):
// the high bytes first, then acc * 128, then the low bytes, so acc = sum (128 hi + lo) code. The
// 16-lane sums of 16 tokens are reduced together (Tree16 on int32; any order is exact).
// Key codes are decoded straight into registers from the packed rows (no byte buffer).
template <size_t NC, uint32_t B, size_t RT>  // NC = D / 64 chunks, RT rows: all in registers
HWY_INLINE void KeyDotsTile(State& st, const uint8_t* packed, size_t row_bytes, size_t off,
                            size_t n, size_t r0) {
  const size_t D = NC * 64;
  const Decoder<B> dec;
  const int8_t* qhi = st.At<int8_t>(st.lay.qhi) + r0 * D;
  const int8_t* qlo = st.At<int8_t>(st.lay.qlo) + r0 * D;
  __m512i qh[RT][NC], ql[RT][NC];
  for (size_t r = 0; r < RT; ++r) {
    for (size_t c = 0; c < NC; ++c) {
      qh[r][c] = _mm512_loadu_si512(qhi + r * D + 64 * c);
      ql[r][c] = _mm512_loadu_si512(qlo + r * D + 64 * c);
    }
  }
  int32_t* tile = reinterpret_cast<int32_t*>(st.tile);
  const DI di;
  for (size_t i0 = 0; i0 < n; i0 += 16) {
    const size_t cnt = std::min<size_t>(16, n - i0);
    for (size_t i = 0; i < 16; ++i) {
      const uint8_t* code = packed + (i0 + std::min(i, cnt - 1)) * row_bytes;
      __m512i cv[NC];
      for (size_t c = 0; c < NC; ++c) cv[c] = dec(code + 8 * B * c);
      for (size_t r = 0; r < RT; ++r) {
        // Independent high and low sums (short dependency chains), then 128 hi + lo.
        __m512i h = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cv[0], qh[r][0]);
        __m512i l = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cv[0], ql[r][0]);
        for (size_t c = 1; c < NC; ++c) {
          h = _mm512_dpbusd_epi32(h, cv[c], qh[r][c]);
          l = _mm512_dpbusd_epi32(l, cv[c], ql[r][c]);
        }
        _mm512_store_si512(tile + ((r0 + r) * 16 + kTreeSlot[i]) * 16,
                           _mm512_add_epi32(_mm512_slli_epi32(h, 7), l));
      }
    }
    for (size_t r = r0; r < r0 + RT; ++r) {
      VI tv[16];
      for (size_t i = 0; i < 16; ++i) tv[i] = hn::Load(di, tile + (r * 16 + i) * 16);
      const VF f = hn::ConvertTo(DF(), Tree16(di, tv));
      float* out = st.sc + r * kSeg + off + i0;
      if (cnt == 16) {
        hn::StoreU(f, DF(), out);
      } else {
        HWY_ALIGN float buf[16];
        hn::Store(f, DF(), buf);
        std::copy(buf, buf + cnt, out);
      }
    }
  }
}

template <size_t NC, uint32_t B>
HWY_INLINE void KeyDotsVnniT(State& st, const uint8_t* packed, size_t row_bytes, size_t off,
                             size_t n) {
  // Tiles of 4 rows, then one tile of the 1 to 3 left (each tile decodes the codes again).
  size_t r0 = 0;
  for (; r0 + 4 <= st.R; r0 += 4) KeyDotsTile<NC, B, 4>(st, packed, row_bytes, off, n, r0);
  switch (st.R - r0) {
    case 3: return KeyDotsTile<NC, B, 3>(st, packed, row_bytes, off, n, r0);
    case 2: return KeyDotsTile<NC, B, 2>(st, packed, row_bytes, off, n, r0);
    case 1: return KeyDotsTile<NC, B, 1>(st, packed, row_bytes, off, n, r0);
    default: return;
  }
}

// False for head dims without a specialization (the caller takes the generic path).
template <uint32_t B>
HWY_NOINLINE bool KeyDotsVnni(State& st, const uint8_t* packed, size_t row_bytes, size_t off,
                              size_t n, const uint8_t* end) {
  if (row_bytes % 32 == 0 && (st.D == 64 || st.D == 128 || st.D == 256)) {
    KeyDotsLanes<B>(st, packed, off, n, end);
    return true;
  }
  switch (st.D) {
    case 64: return KeyDotsVnniT<1, B>(st, packed, row_bytes, off, n), true;
    case 128: return KeyDotsVnniT<2, B>(st, packed, row_bytes, off, n), true;
    case 256: return KeyDotsVnniT<4, B>(st, packed, row_bytes, off, n), true;
    default: return false;
  }
}
#endif

// Scores from the integer dots: (q . zero + dq * I) * scale, -inf in a row's future.
HWY_INLINE void KeyScores(State& st, const int32_t* pos, size_t off, size_t n) {
  const DF d;
  const DI di;
  const float* qz = st.F(st.lay.qz);
  const float* dq = st.F(st.lay.dq);
  const size_t full = n / kL * kL;
  for (size_t r = 0; r < st.R; ++r) {
    float* s = st.sc + r * kSeg + off;
    const int32_t rp = st.q->positions[r];
    const VF z = hn::Set(d, qz[r]), step = hn::Set(d, dq[r]), scale = hn::Set(d, st.q->scale);
    for (size_t i = 0; i < full; i += kL) {
      const VF x = hn::Mul(hn::Add(z, hn::Mul(step, hn::LoadU(d, s + i))), scale);
      const auto future = hn::RebindMask(d, hn::Gt(hn::LoadU(di, pos + i), hn::Set(di, rp)));
      hn::StoreU(hn::IfThenElse(future, hn::Set(d, kNegInf), x), d, s + i);
    }
    for (size_t i = full; i < n; ++i) {
      s[i] = pos[i] > rp ? kNegInf : (qz[r] + dq[r] * s[i]) * st.q->scale;
    }
  }
}

// Value weights of the segment: w = p * value scale per row, group and token, quantized per row
// and group to W = round(w / dv) in [0, wmax] (dv = max w / wmax, wmax = WeightMax(kv.wide));
// and the zero-point part p * value zero summed in the 16 virtual lanes of zv.
HWY_NOINLINE void ValueWeights(State& st, const KiviView& kv, size_t t0, size_t n) {
  const DF d;
  const DI di;
  const size_t ng = st.ng, n16 = (n + 15) / 16 * 16;
  float* vs = st.F(st.lay.vs);
  float* vz = st.F(st.lay.vz);
  float* tmp = st.F(st.lay.vtmp);  // [token][group] as stored, then transposed
  WidenF16(kv.vsc + t0 * ng, n * ng, tmp);
  WidenF16(kv.vz + t0 * ng, n * ng, tmp + kSeg * ng);
  // The next segment's scales and zeros (loads of these waited on memory at 32k tokens).
  Prefetch(reinterpret_cast<const uint8_t*>(kv.vsc + (t0 + kSeg) * ng), kSeg * ng * 2,
           reinterpret_cast<const uint8_t*>(kv.vs_end));
  Prefetch(reinterpret_cast<const uint8_t*>(kv.vz + (t0 + kSeg) * ng), kSeg * ng * 2,
           reinterpret_cast<const uint8_t*>(kv.vz_end));
  size_t done = 0;
  if (ng == 4) {  // head_dim 128, G 32: de-interleave with vector loads
    for (; done + kL <= n; done += kL) {
      VF a0, a1, a2, a3;
      hn::LoadInterleaved4(d, tmp + done * 4, a0, a1, a2, a3);
      hn::StoreU(a0, d, vs + done), hn::StoreU(a1, d, vs + kSeg + done);
      hn::StoreU(a2, d, vs + 2 * kSeg + done), hn::StoreU(a3, d, vs + 3 * kSeg + done);
      hn::LoadInterleaved4(d, tmp + kSeg * ng + done * 4, a0, a1, a2, a3);
      hn::StoreU(a0, d, vz + done), hn::StoreU(a1, d, vz + kSeg + done);
      hn::StoreU(a2, d, vz + 2 * kSeg + done), hn::StoreU(a3, d, vz + 3 * kSeg + done);
    }
  }
  for (size_t g = 0; g < ng; ++g) {
    for (size_t i = done; i < n; ++i) {
      vs[g * kSeg + i] = tmp[i * ng + g];
      vz[g * kSeg + i] = tmp[kSeg * ng + i * ng + g];
    }
    std::fill(vs + g * kSeg + n, vs + g * kSeg + n16, 0.0f);
    std::fill(vz + g * kSeg + n, vz + g * kSeg + n16, 0.0f);
  }
#if HWY_TARGET == HWY_AVX3_DL
  if (kv.vnni) {  // straight to the bytes the vpdpbusd value kernels read
    WeightsVnni(st, vs, vz, n16, kv.wide);
    return;
  }
#endif
  int32_t* wq = st.At<int32_t>(st.lay.wq);
  float* dv = st.F(st.lay.dv);
  const int32_t wmax = WeightMax(kv.wide);
  HWY_ALIGN float w[kSeg];
  for (size_t r = 0; r < st.R; ++r) {
    const float* p = st.sc + r * kSeg;  // probabilities, 0 past n
    for (size_t g = 0; g < ng; ++g) {
      VF mx = hn::Zero(d);
      float* z = st.zv + (r * ng + g) * 16;
      for (size_t i = 0; i < n16; i += kL) {
        const VF pv = hn::LoadU(d, p + i);
        const VF wv = hn::Mul(pv, hn::LoadU(d, vs + g * kSeg + i));
        hn::Store(wv, d, w + i);
        mx = hn::Max(mx, wv);
        float* zl = z + i % 16;
        hn::StoreU(hn::Add(hn::LoadU(d, zl), hn::Mul(pv, hn::LoadU(d, vz + g * kSeg + i))), d, zl);
      }
      const float m = hn::GetLane(hn::MaxOfLanes(d, mx));
      const bool zero = !(m >= kTiny);
      dv[r * ng + g] = zero ? 0.0f : m * (1.0f / float(wmax));
      const VF inv = hn::Set(d, zero ? 0.0f : float(wmax) / m);
      int32_t* out = wq + (r * ng + g) * kSeg;
      for (size_t i = 0; i < n16; i += kL) {
        VI v = RoundToInt(hn::Mul(hn::Load(d, w + i), inv));
        v = hn::Min(hn::Max(v, hn::Zero(di)), hn::Set(di, wmax));
        hn::StoreU(v, di, out + i);
      }
    }
  }
}

// Integer value sums II[r][c] = sum_i W[r][g(c)][i] code[i][c] over the segment (natural order).
HWY_NOINLINE void ValueDotsGeneric(State& st, size_t n) {
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  const size_t D = st.D, G = st.vgroup, ng = st.ng;
  const uint8_t* vb = st.At<uint8_t>(st.lay.vb);
  const int32_t* wq = st.At<int32_t>(st.lay.wq);
  int32_t* ii = st.At<int32_t>(st.lay.ii);
  for (size_t r = 0; r < st.R; ++r) {
    for (size_t g = 0; g < ng; ++g) {
      const int32_t* W = wq + (r * ng + g) * kSeg;
      const size_t c1 = std::min(D, (g + 1) * G);
      size_t c = g * G;
      for (; c + kL <= c1; c += kL) {
        VI a = hn::Zero(di);
        for (size_t i = 0; i < n; ++i) {
          const VI code = hn::PromoteTo(di, hn::LoadU(d8, vb + i * D + c));
          a = hn::Add(a, hn::Mul(hn::Set(di, W[i]), code));
        }
        hn::StoreU(a, di, ii + r * D + c);
      }
      for (; c < c1; ++c) {
        int32_t a = 0;
        for (size_t i = 0; i < n; ++i) a += W[i] * int32_t(vb[i * D + c]);
        ii[r * D + c] = a;
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// RT rows of ValueDotsVnni for the 64 channels at c0: high and low weight bytes in one pass over
// the quads (independent accumulators), then 128 hi + lo, stored in channel order.
template <bool Wide, size_t RT>
HWY_INLINE void ValueRowsTile(State& st, const __m512i (*x)[4], size_t nq, size_t r0, size_t c0,
                              size_t g0, size_t g1, __mmask16 m1) {
  const size_t ng = st.ng;
  const uint32_t* whi = st.At<uint32_t>(st.lay.whi);
  const uint32_t* wlo = st.At<uint32_t>(st.lay.wlo);
  __m512i h[RT][4], l[RT][4];
  for (size_t r = 0; r < RT; ++r) {
    for (int m = 0; m < 4; ++m) h[r][m] = l[r][m] = _mm512_setzero_si512();
  }
  for (size_t qd = 0; qd < nq; ++qd) {
    for (size_t r = 0; r < RT; ++r) {
      const size_t b0 = ((r0 + r) * ng + g0) * (kSeg / 4) + qd;
      const size_t b1 = ((r0 + r) * ng + g1) * (kSeg / 4) + qd;
      const __m512i wl =
          _mm512_mask_set1_epi32(_mm512_set1_epi32(int(wlo[b0])), m1, int(wlo[b1]));
      if constexpr (Wide) {
        const __m512i wh =
            _mm512_mask_set1_epi32(_mm512_set1_epi32(int(whi[b0])), m1, int(whi[b1]));
        for (int m = 0; m < 4; ++m) h[r][m] = _mm512_dpbusd_epi32(h[r][m], x[qd][m], wh);
      }
      for (int m = 0; m < 4; ++m) l[r][m] = _mm512_dpbusd_epi32(l[r][m], x[qd][m], wl);
    }
  }
  int32_t* ii = st.At<int32_t>(st.lay.ii);
  for (size_t r = 0; r < RT; ++r) {
    int32_t* o = ii + (r0 + r) * st.D + c0;
    for (int m = 0; m < 4; ++m) {  // block L of vector m holds channels 16 L + 4 m + 0..3
      const __m512i a =
          Wide ? _mm512_add_epi32(_mm512_slli_epi32(h[r][m], 7), l[r][m]) : l[r][m];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 4 * m), _mm512_extracti32x4_epi32(a, 0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 + 4 * m),
                       _mm512_extracti32x4_epi32(a, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 + 4 * m),
                       _mm512_extracti32x4_epi32(a, 2));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 48 + 4 * m),
                       _mm512_extracti32x4_epi32(a, 3));
    }
  }
}

// The same with vpdpbusd: 4 tokens' codes of one channel per int32 lane. Per 64 channels and 4
// tokens, the byte rows are interleaved (unpack 8 then 16 bits), which leaves channel
// 16 L + 4 m + j (128-bit block L of vector m, dword j) in lane 4 L + j of vector m; the weight
// dword of a lane is its group's 4 token weights (G % 32 == 0: one group per 16 channels).
// Value codes are decoded straight from the packed rows into registers.
template <uint32_t B, bool Wide>
HWY_NOINLINE void ValueDotsVnni(State& st, const uint8_t* packed, size_t row_bytes, size_t n) {
  const size_t D = st.D, G = st.vgroup, ng = st.ng, nq = (n + 3) / 4;
  const Decoder<B> dec;
  // The weight bytes (whi, wlo) come from ValueWeights (WeightBytesVnni).
  alignas(64) __m512i x[kSeg / 4][4];
  for (size_t c0 = 0; c0 < D; c0 += 64) {
    for (size_t qd = 0; qd < nq; ++qd) {
      __m512i tk[4];
      for (size_t k = 0; k < 4; ++k) {  // pad tokens decode as zeros (their weights are 0 too)
        const size_t i = 4 * qd + k;
        tk[k] = i < n ? dec(packed + i * row_bytes + c0 * B / 8) : _mm512_setzero_si512();
      }
      const __m512i t0 = tk[0], t1 = tk[1], t2 = tk[2], t3 = tk[3];
      const __m512i a = _mm512_unpacklo_epi8(t0, t1), bb = _mm512_unpackhi_epi8(t0, t1);
      const __m512i c = _mm512_unpacklo_epi8(t2, t3), dd = _mm512_unpackhi_epi8(t2, t3);
      x[qd][0] = _mm512_unpacklo_epi16(a, c);   // channels 16L + 0..3
      x[qd][1] = _mm512_unpackhi_epi16(a, c);   // 16L + 4..7
      x[qd][2] = _mm512_unpacklo_epi16(bb, dd); // 16L + 8..11
      x[qd][3] = _mm512_unpackhi_epi16(bb, dd); // 16L + 12..15
    }
    // Groups of the four 16-channel blocks: G % 32 == 0, so at most two distinct.
    const size_t g0 = c0 / G, g1 = (c0 + 48) / G;
    __mmask16 m1 = 0;
    for (uint32_t L = 0; L < 4; ++L) {
      if ((c0 + 16 * L) / G != g0) m1 = __mmask16(m1 | (0xFu << (4 * L)));
    }
    size_t r = 0;
    for (; r + 2 <= st.R; r += 2) ValueRowsTile<Wide, 2>(st, x, nq, r, c0, g0, g1, m1);
    for (; r < st.R; ++r) ValueRowsTile<Wide, 1>(st, x, nq, r, c0, g0, g1, m1);
  }
}
#endif

// acc[r][c] += dv[r][g(c)] * II[r][c]: the segment's value sums back to floats (elementwise).
HWY_INLINE void AddValueSums(State& st) {
  const DF d;
  const size_t D = st.D, G = st.vgroup, ng = st.ng;
  const int32_t* ii = st.At<int32_t>(st.lay.ii);
  const float* dv = st.F(st.lay.dv);
  for (size_t r = 0; r < st.R; ++r) {
    for (size_t g = 0; g < ng; ++g) {
      const float s = dv[r * ng + g];
      if (s == 0.0f) continue;  // no weight in this group (same decision on every target)
      const VF sv = hn::Set(d, s);
      const size_t c1 = std::min(D, (g + 1) * G);
      float* a = st.acc + r * D;
      size_t c = g * G;
      for (; c + kL <= c1; c += kL) {
        const VF x = hn::ConvertTo(d, hn::LoadU(DI(), ii + r * D + c));
        hn::StoreU(hn::Add(hn::LoadU(d, a + c), hn::Mul(sv, x)), d, a + c);
      }
      for (; c < c1; ++c) a[c] += s * float(ii[r * D + c]);
    }
  }
}

// Keys of tokens [t, t + n) of one block, at offset `off` of the segment: codes to bytes,
// integer dots with the block's query codes, scores.
template <uint32_t B>
HWY_INLINE void KeyRun(State& st, const KiviView& kv, size_t t, size_t off, size_t n) {
  const size_t D = st.D;
  uint8_t* kb = st.At<uint8_t>(st.lay.kb);
#if HWY_TARGET == HWY_AVX3_DL
  const bool done = kv.vnni && KeyDotsVnni<B>(st, kv.kc + t * kv.row_bytes, kv.row_bytes, off, n,
                                              kv.kc_end);
#else
  const bool done = false;
#endif
  if (!done) {  // the same integers, through a byte buffer and 16-bit multiply-adds
    for (size_t i = 0; i < n; ++i) {
      UnpackRow<B>(kv.kc + (t + i) * kv.row_bytes, D, kb + (off + i) * D);
    }
    KeyDotsGeneric(st, off, n);
  }
  KeyScores(st, kv.pos + t, off, n);
  if (st.taps) st.Tap(t, off, n);
}

// The segment [t, t + n) once its scores are in: softmax, value weights, integer value sums.
template <uint32_t B, bool Wide>
HWY_INLINE void ValueSegment(State& st, const KiviView& kv, size_t t, size_t n) {
  st.Softmax(n);
  ValueWeights(st, kv, t, n);
#if HWY_TARGET == HWY_AVX3_DL
  const bool done = kv.vnni;
  if (done && kv.row_bytes % 16 == 0) {
    // Adds its sums to acc itself (AddValueSums fused into its last step).
    return ValueDotsLanes<B, Wide>(st, kv.vc + t * kv.row_bytes, n, kv.vc_end);
  } else if (done) {
    ValueDotsVnni<B, Wide>(st, kv.vc + t * kv.row_bytes, kv.row_bytes, n);
  }
#else
  const bool done = false;
#endif
  if (!done) {  // the same integers, through a byte buffer
    const size_t D = st.D;
    uint8_t* vb = st.At<uint8_t>(st.lay.vb);
    for (size_t i = 0; i < n; ++i) UnpackRow<B>(kv.vc + (t + i) * kv.row_bytes, D, vb + i * D);
    ValueDotsGeneric(st, n);
  }
  AddValueSums(st);
}

// Quantized tokens [first, last) of the store in segments of kSeg tokens from `first` (a segment
// may span key blocks: each block's run of tokens uses the query codes of that block, formed once
// per block and row).
template <uint32_t B, bool Wide>
void KiviQuantized(State& st, const KiviHeadStore& store, size_t first, size_t last) {
  const size_t D = st.D, G = store.config().group;
  const KiviView kv{D,
                    G,
                    st.ng,
                    kivi_packed_bytes(D, B),
                    store.key_codes().data(),
                    store.value_codes().data(),
                    store.key_scales().data(),
                    store.key_zeros().data(),
                    store.value_scales().data(),
                    store.value_zeros().data(),
                    store.positions().data(),
                    // Only the head dims with vpdpbusd key kernels: PrepareKeyBlock then writes
                    // the byte codes alone, which the generic key dots do not read.
                    HWY_TARGET == HWY_AVX3_DL && (D == 64 || D == 128 || D == 256) &&
                        G % 32 == 0,
                    Wide,
                    store.key_scales().data() + store.key_scales().size(),
                    store.key_zeros().data() + store.key_zeros().size(),
                    store.key_codes().data() + store.key_codes().size(),
                    store.value_codes().data() + store.value_codes().size(),
                    store.value_scales().data() + store.value_scales().size(),
                    store.value_zeros().data() + store.value_zeros().size()};
  const std::vector<uint32_t>& counts = store.block_token_counts();
  size_t seg = first, fill = 0;  // current segment start and tokens in it
  size_t t0 = 0;
  for (size_t b = 0; t0 < last; ++b) {
    const size_t bsize = counts.empty() ? G : counts[b];
    size_t lo = std::max(first, t0);
    const size_t hi = std::min(last, t0 + bsize);
    if (lo < hi) PrepareKeyBlock(st, kv, b);
    while (lo < hi) {
      const size_t take = std::min(hi - lo, kSeg - fill);
      KeyRun<B>(st, kv, lo, fill, take);
      lo += take;
      fill += take;
      if (fill == kSeg) {
        if (!st.scores_only) ValueSegment<B, Wide>(st, kv, seg, fill);
        seg += fill;
        fill = 0;
      }
    }
    t0 += bsize;
  }
  if (fill > 0 && !st.scores_only) ValueSegment<B, Wide>(st, kv, seg, fill);
}

// KiviQuantized with the store's weight width (KiviConfig::weight_bits, checked by the store).
template <uint32_t B>
void KiviQuantizedWeights(State& st, const KiviHeadStore& store, size_t first, size_t last) {
  if (store.config().weight_bits == 7) {
    KiviQuantized<B, false>(st, store, first, last);
  } else {
    KiviQuantized<B, true>(st, store, first, last);
  }
}

// ---- entry points -----------------------------------------------------------------------------
void AttendF16PartialImpl(const Queries& q, const uint16_t* k, const uint16_t* v,
                          const int32_t* positions, size_t first, size_t count, Scratch& scratch,
                          const PartialState& out) {
  State st(q, 1, q.dim, scratch);
  F16Segments(st, k + first * q.dim, v + first * q.dim, positions + first, count);
  st.Emit(out);
}

void AttendScaledF16Impl(const Queries& q, const ScaledF16Rows& k, const ScaledF16Rows& v,
                         const int32_t* positions, size_t n_tokens, const uint16_t* pk,
                         const uint16_t* pv, const int32_t* ppos, size_t n_pending,
                         Scratch& scratch, const PartialState& out) {
  State st(q, 1, q.dim, scratch);
  const size_t D = q.dim;
  RowSegments(st, SlotRows{k.slots, k.scaled, k.scales, k.direct, D},
              SlotRows{v.slots, v.scaled, v.scales, v.direct, D}, positions, n_tokens);
  F16Segments(st, pk, pv, ppos, n_pending);
  st.Emit(out);
}

// Tokens [first, first + count) of a KIVI store into `st` (attend_kivi_partial, kivi_scores).
void KiviRange(State& st, const Queries& q, const KiviHeadStore& store, size_t first,
               size_t count) {
  const size_t nq = store.quantized_tokens(), last = first + count;
  if (first < nq) {
    switch (store.config().bits) {
      case 1: KiviQuantizedWeights<1>(st, store, first, std::min(last, nq)); break;
      case 2: KiviQuantizedWeights<2>(st, store, first, std::min(last, nq)); break;
      case 4: KiviQuantizedWeights<4>(st, store, first, std::min(last, nq)); break;
      default: KiviQuantizedWeights<8>(st, store, first, std::min(last, nq)); break;
    }
  }
  if (last > nq) {
    const size_t r0 = std::max(first, nq) - nq;
    st.tap_base = nq + r0;
    F16Segments(st, store.residual_keys().data() + r0 * q.dim,
                store.residual_values().data() + r0 * q.dim, store.positions().data() + nq + r0,
                last - nq - r0);
  }
}

void AttendKiviPartialImpl(const Queries& q, const KiviHeadStore& store, size_t first,
                           size_t count, Scratch& scratch, const PartialState& out,
                           const KiviTaps* taps) {
  const size_t G = store.config().group, ng = kivi_value_groups(q.dim, G);
  State st(q, ng, G, scratch);
  st.taps = taps;
  KiviRange(st, q, store, first, count);
  st.Emit(out);
}

void KiviScoresImpl(const Queries& q, const KiviHeadStore& store, Scratch& scratch,
                    const KiviTaps& taps) {
  const size_t G = store.config().group, ng = kivi_value_groups(q.dim, G);
  State st(q, ng, G, scratch);
  st.taps = &taps;
  st.scores_only = true;
  KiviRange(st, q, store, 0, store.size());
}

void F16ScoresImpl(const Queries& q, const uint16_t* k, const int32_t* positions, size_t n,
                   Scratch& scratch, const KiviTaps& taps) {
  State st(q, 1, q.dim, scratch);
  st.taps = &taps;
  st.scores_only = true;
  F16Segments(st, k, k, positions, n);  // (no values read: scores only)
}

// Parts in order: m = max m_i, e_i = exp(m_i - m), sum = sum_i e_i l_i, acc = sum_i e_i acc_i
// (part 0 first), out = acc * (1 / sum). One part gives e = 1 exactly, so the full-range path
// and a one-part merge agree bit for bit.
void MergeImpl(const PartialState* parts, size_t n_parts, size_t n_rows, size_t dim, float* out) {
  const DF d;
  for (size_t r = 0; r < n_rows; ++r) {
    float m = kNegInf;
    for (size_t i = 0; i < n_parts; ++i) m = std::max(m, parts[i].max[r]);
    float* o = out + r * dim;
    if (m == kNegInf) {
      std::fill(o, o + dim, 0.0f);
      continue;
    }
    float l = 0.0f;
    for (size_t i = 0; i < n_parts; ++i) {
      const float e = parts[i].max[r] == kNegInf ? 0.0f : Exp1(parts[i].max[r] - m);
      l = i == 0 ? parts[i].sum[r] * e : l + parts[i].sum[r] * e;
      const float* a = parts[i].acc + r * dim;
      const VF ev = hn::Set(d, e);
      size_t c = 0;
      for (; c + kL <= dim; c += kL) {
        const VF x = hn::Mul(hn::LoadU(d, a + c), ev);
        hn::StoreU(i == 0 ? x : hn::Add(hn::LoadU(d, o + c), x), d, o + c);
      }
      for (; c < dim; ++c) o[c] = i == 0 ? a[c] * e : o[c] + a[c] * e;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const VF iv = hn::Set(d, inv);
    size_t c = 0;
    for (; c + kL <= dim; c += kL) hn::StoreU(hn::Mul(hn::LoadU(d, o + c), iv), d, o + c);
    for (; c < dim; ++c) o[c] *= inv;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fast
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "util/error.h"

namespace kvsdk::cpu::fast {

HWY_EXPORT(AttendF16PartialImpl);
HWY_EXPORT(AttendKiviPartialImpl);
HWY_EXPORT(KiviScoresImpl);
HWY_EXPORT(F16ScoresImpl);
HWY_EXPORT(AttendScaledF16Impl);
HWY_EXPORT(MergeImpl);
HWY_EXPORT(ExpF32Impl);

namespace {
size_t scratch_bytes(size_t n_rows, size_t dim, size_t value_groups) {
  // + 64: data() aligns the start; + the partial state of the whole-range entry points.
  return Layout(n_rows, dim, std::max<size_t>(value_groups, 1)).total + 64 +
         (2 * n_rows + n_rows * dim) * sizeof(float);
}

// The whole-range entry points keep their partial state at the end of the scratch.
struct OwnPartial {
  PartialState st;
  OwnPartial(Scratch& s, size_t n_rows, size_t dim, size_t value_groups) {
    const size_t at = (Layout(n_rows, dim, std::max<size_t>(value_groups, 1)).total + 3) / 4;
    float* p = s.data(at + 2 * n_rows + n_rows * dim) + at;
    st = {p, p + n_rows, p + 2 * n_rows};
  }
};
}  // namespace

void Scratch::reserve(size_t n_rows, size_t dim, size_t value_groups) {
  const size_t n = scratch_bytes(n_rows, dim, value_groups);
  if (n > buf_.capacity()) buf_.reserve(n);
}

float* Scratch::data(size_t floats) {
  const size_t bytes = floats * sizeof(float) + 64;
  if (bytes > buf_.size()) {
    if (bytes > buf_.capacity()) buf_.reserve(bytes);
    buf_.resize(buf_.capacity());  // within capacity: no allocation
  }
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf_.data());
  return reinterpret_cast<float*>(buf_.data() + ((64 - p % 64) % 64));
}

void attend_f16_partial(const Queries& qs, const uint16_t* k, const uint16_t* v,
                        const int32_t* positions, size_t first, size_t count, Scratch& scratch,
                        const PartialState& out) {
  if (qs.n_rows == 0 || qs.dim == 0) return;
  HWY_DYNAMIC_DISPATCH(AttendF16PartialImpl)(qs, k, v, positions, first, count, scratch, out);
}

void attend_kivi_partial(const Queries& qs, const KiviHeadStore& store, size_t first,
                         size_t count, Scratch& scratch, const PartialState& out,
                         const KiviTaps* taps) {
  KVSDK_REQUIRE(store.head_dim() == qs.dim, "attend_kivi: query dim ", qs.dim,
                " != store head_dim ", store.head_dim());
  KVSDK_REQUIRE(first <= store.size() && count <= store.size() - first,
                "attend_kivi_partial: tokens [", first, ", ", first + count, ") past ",
                store.size());
  if (qs.n_rows == 0) return;
  HWY_DYNAMIC_DISPATCH(AttendKiviPartialImpl)(qs, store, first, count, scratch, out, taps);
}

void kivi_scores(const Queries& qs, const KiviHeadStore& store, Scratch& scratch, float* scores,
                 size_t stride) {
  KVSDK_REQUIRE(store.head_dim() == qs.dim, "kivi_scores: query dim ", qs.dim,
                " != store head_dim ", store.head_dim());
  if (qs.n_rows == 0) return;
  KiviTaps taps;
  taps.scores = scores;
  taps.scores_stride = stride;
  HWY_DYNAMIC_DISPATCH(KiviScoresImpl)(qs, store, scratch, taps);
}

void f16_scores(const Queries& qs, const uint16_t* k, const int32_t* positions, size_t n_tokens,
                Scratch& scratch, float* scores, size_t stride) {
  if (qs.n_rows == 0 || qs.dim == 0 || n_tokens == 0) return;
  KiviTaps taps;
  taps.scores = scores;
  taps.scores_stride = stride;
  HWY_DYNAMIC_DISPATCH(F16ScoresImpl)(qs, k, positions, n_tokens, scratch, taps);
}

void merge_partials(const PartialState* parts, size_t n_parts, size_t n_rows, size_t dim,
                    float* out) {
  HWY_DYNAMIC_DISPATCH(MergeImpl)(parts, n_parts, n_rows, dim, out);
}

void attend_f16(const Queries& qs, const uint16_t* k, const uint16_t* v, const int32_t* positions,
                size_t n_tokens, Scratch& scratch, float* out) {
  if (qs.n_rows == 0 || qs.dim == 0) return;
  const OwnPartial own(scratch, qs.n_rows, qs.dim, 1);
  HWY_DYNAMIC_DISPATCH(AttendF16PartialImpl)(qs, k, v, positions, 0, n_tokens, scratch, own.st);
  HWY_DYNAMIC_DISPATCH(MergeImpl)(&own.st, 1, qs.n_rows, qs.dim, out);
}

void attend_kivi(const Queries& qs, const KiviHeadStore& store, Scratch& scratch, float* out) {
  KVSDK_REQUIRE(store.head_dim() == qs.dim, "attend_kivi: query dim ", qs.dim,
                " != store head_dim ", store.head_dim());
  if (qs.n_rows == 0) return;
  const size_t ng = kivi_value_groups(qs.dim, store.config().group);
  const OwnPartial own(scratch, qs.n_rows, qs.dim, ng);
  HWY_DYNAMIC_DISPATCH(AttendKiviPartialImpl)(qs, store, 0, store.size(), scratch, own.st,
                                              nullptr);
  HWY_DYNAMIC_DISPATCH(MergeImpl)(&own.st, 1, qs.n_rows, qs.dim, out);
}

void attend_scaled_f16(const Queries& qs, const ScaledF16Rows& k, const ScaledF16Rows& v,
                       const int32_t* positions, size_t n_tokens, const uint16_t* pending_k,
                       const uint16_t* pending_v, const int32_t* pending_positions,
                       size_t n_pending, Scratch& scratch, float* out) {
  if (qs.n_rows == 0 || qs.dim == 0) return;
  const OwnPartial own(scratch, qs.n_rows, qs.dim, 1);
  HWY_DYNAMIC_DISPATCH(AttendScaledF16Impl)(qs, k, v, positions, n_tokens, pending_k, pending_v,
                                            pending_positions, n_pending, scratch, own.st);
  HWY_DYNAMIC_DISPATCH(MergeImpl)(&own.st, 1, qs.n_rows, qs.dim, out);
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
