// The fixed-order lane reductions of the SIMD kernels (fast_attention.cpp,
// fast_chunk_attention.cpp, spindlekv_attention.cpp) and their shared dot-product tile, in one
// place: "16 virtual lanes" (lane l holds channels c = l mod 16;
// one AVX-512 vector = 2 AVX2 = 4 SSE4/NEON = 16 scalar vectors) summed by one fixed tree,
// l + l+8, then l + l+4, l + l+2, l + l+1, so every Highway target gives the same bits
// (fast_attention.h explains why snapshots need that).
//
// A Highway per-target header: include it after <hwy/highway.h> in a file compiled once per
// target (hwy/foreach_target.h); the toggle guard below re-enables it for each target.
#if defined(KVSDK_FAST_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSDK_FAST_LANES_INL_H_
#undef KVSDK_FAST_LANES_INL_H_
#else
#define KVSDK_FAST_LANES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace kvsdk {
namespace cpu {
namespace fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr size_t kL = hn::MaxLanes(DF());  // lanes of one vector: 16, 8, 4 or 1
static_assert(16 % kL == 0, "16 virtual lanes must be whole vectors");
constexpr size_t kN = 16 / kL;              // vectors per 16 virtual lanes

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

#if HWY_TARGET != HWY_SCALAR
// Where Tree16 leaves token t: feeding token t's vector at slot kTreeSlot[t] makes lane t of the
// result token t's sum (the shuffles below interleave tokens; the map is its own inverse).
constexpr size_t kTreeSlot[16] = {0, 4, 2, 6, 1, 5, 3, 7, 8, 12, 10, 14, 9, 13, 11, 15};

// Reduce16 of 16 tokens at once (16-lane vectors only): the same tree (l + l+8, l + l+4,
// l + l+2, l + l+1) run on pairs of tokens at a time, so each level costs two shuffles and one
// add for 16 lanes of work instead of per-token extracts. Also used for int32 (any order is exact).
template <class D>
HWY_INLINE hn::Vec<D> Tree16(D d, const hn::Vec<D>* t) {
  using V = hn::Vec<D>;
  const hn::Repartition<uint64_t, D> d64;
  V u[8], v[4], w[2];
  for (size_t j = 0; j < 8; ++j) {  // l + l+8: token 2j in the low half, 2j+1 in the high half
    u[j] = hn::Add(hn::ConcatLowerLower(d, t[2 * j + 1], t[2 * j]),
                   hn::ConcatUpperUpper(d, t[2 * j + 1], t[2 * j]));
  }
  for (size_t j = 0; j < 4; ++j) {  // l + l+4: one token per 128-bit block
    const V x = hn::OddEvenBlocks(u[2 * j + 1], u[2 * j]);
    const V y = hn::SwapAdjacentBlocks(hn::OddEvenBlocks(u[2 * j], u[2 * j + 1]));
    v[j] = hn::Add(x, y);
  }
  for (size_t j = 0; j < 2; ++j) {  // l + l+2: two tokens per block
    const auto a = hn::BitCast(d64, v[2 * j]), b = hn::BitCast(d64, v[2 * j + 1]);
    w[j] = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, a, b)),
                   hn::BitCast(d, hn::InterleaveUpper(d64, a, b)));
  }
  return hn::Add(hn::ConcatEven(d, w[1], w[0]), hn::ConcatOdd(d, w[1], w[0]));  // l + l+1
}
#endif

// dots[r][t] = q_r . k_t for n_tok keys [n_tok][dim] and a tile of RT query rows (each key row
// loaded once for the tile), by the 16 virtual lanes and the fixed tree, tail channels past the
// last multiple of 16 added after the tree in order. On 16-lane targets whole groups of 16 tokens
// are reduced together (Tree16: the same tree, so the same bits as token by token).
template <size_t RT>
HWY_INLINE void DotTile(const float* k, size_t n_tok, size_t dim, const float* const* q,
                        float* const* dots) {
  const DF d;
  const size_t full = dim / 16 * 16;
  size_t t = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kL == 16) {
    for (; t + 16 <= n_tok; t += 16) {
      const float* kb = k + t * dim;
      for (size_t r = 0; r < RT; ++r) {
        const float* qr = q[r];
        VF tv[16];  // slot s holds token kTreeSlot[s] (the map is its own inverse)
        for (size_t s = 0; s < 16; ++s) tv[s] = hn::Zero(d);
        for (size_t c = 0; c < full; c += 16) {
          const VF qv = hn::LoadU(d, qr + c);
          const float* kc = kb + c;
          for (size_t s = 0; s < 16; ++s) {
            tv[s] = hn::Add(tv[s], hn::Mul(qv, hn::LoadU(d, kc + kTreeSlot[s] * dim)));
          }
        }
        hn::StoreU(Tree16(d, tv), d, dots[r] + t);
        for (size_t i = 0; full < dim && i < 16; ++i) {
          for (size_t c = full; c < dim; ++c) dots[r][t + i] += qr[c] * kb[i * dim + c];
        }
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
      dots[r][t] = dot;
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

}  // namespace HWY_NAMESPACE
}  // namespace fast
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
