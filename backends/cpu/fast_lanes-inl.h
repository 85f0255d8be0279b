// The fixed-order lane reductions of the SIMD kernels (fast_attention.cpp,
// fast_chunk_attention.cpp), in one place: "16 virtual lanes" (lane l holds channels c = l mod 16;
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

}  // namespace HWY_NAMESPACE
}  // namespace fast
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
