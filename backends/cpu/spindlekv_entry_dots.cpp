// spindle_entry_dots (spindlekv_entry_dots.h): dot_f32's four partial sums are the four lanes of
// a 128-bit block, so a vector of kL lanes scores kL / 4 entries at once, one per block: the
// row's four channels i..i+3 are broadcast to every block (LoadDup128), and each block takes its
// entry's four channels, converted from f16 in registers. Each lane adds its products in channel
// order, exactly as dot_f32's scalar sums do; the tail channels and the final
// (s0 + s1) + (s2 + s3) are scalar. Compiled once per Highway target (hwy_targets.h); no FMA
// (the build passes -ffp-contract=off).
#include "hwy_targets.h"  // the same Highway targets in every SIMD file (see there)

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "spindlekv_entry_dots.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "spindlekv_entry_dots.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace kvsdk {
namespace cpu {
namespace spindle_dots {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One entry's result from its four lane sums: the tail channels [body, dim) into the first in
// order, then (s0 + s1) + (s2 + s3), as dot_f32.
HWY_INLINE void Finish(const float* x, const uint16_t* c, size_t body, size_t dim, const float* s,
                       const float* ss, float* dot, float* sq) {
  float s0 = s[0], q0 = sq ? ss[0] : 0.0f;
  for (size_t i = body; i < dim; ++i) {
    const float v = f16_to_f32(c[i]);
    s0 += x[i] * v;
    q0 += v * v;
  }
  *dot = (s0 + s[1]) + (s[2] + s[3]);
  if (sq) *sq = (q0 + ss[1]) + (ss[2] + ss[3]);
}

#if HWY_TARGET != HWY_SCALAR
using D4 = hn::Full128<float>;

HWY_INLINE hn::Vec<D4> Load4(const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, D4> dh;
  return hn::PromoteTo(D4(), hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

// Entries [e, e + B) in one vector of 4 B lanes (block b: entry e + b).
template <size_t B, bool kSquares>
HWY_INLINE void Blocks(const float* x, const uint16_t* c, size_t e, size_t dim, float* dot,
                       float* sq) {
  using D = hn::CappedTag<float, 4 * B>;
  const D d;
  const size_t body = dim / 4 * 4;
  auto ad = hn::Zero(d), as = hn::Zero(d);
  for (size_t i = 0; i < body; i += 4) {
    hn::Vec<D> cv;
    if constexpr (B == 1) {
      cv = Load4(c + e * dim + i);
    } else if constexpr (B == 2) {
      cv = hn::Combine(d, Load4(c + (e + 1) * dim + i), Load4(c + e * dim + i));
    } else {
      static_assert(B == 4, "16 lanes at most");
      const hn::Half<D> dh;
      cv = hn::Combine(d, hn::Combine(dh, Load4(c + (e + 3) * dim + i), Load4(c + (e + 2) * dim + i)),
                       hn::Combine(dh, Load4(c + (e + 1) * dim + i), Load4(c + e * dim + i)));
    }
    const auto xv = hn::LoadDup128(d, x + i);
    ad = hn::Add(ad, hn::Mul(xv, cv));
    if (kSquares) as = hn::Add(as, hn::Mul(cv, cv));
  }
  HWY_ALIGN float s[4 * B], ss[4 * B];
  hn::Store(ad, d, s);
  hn::Store(as, d, ss);
  for (size_t b = 0; b < B; ++b) {
    Finish(x, c + (e + b) * dim, body, dim, s + 4 * b, ss + 4 * b, dot + e + b,
           kSquares ? sq + e + b : nullptr);
  }
}

template <bool kSquares>
HWY_INLINE void Entries(const float* x, const uint16_t* c, size_t n_e, size_t dim, float* dot,
                        float* sq) {
  constexpr size_t kB = hn::MaxLanes(hn::ScalableTag<float>()) / 4;  // entries per vector
  size_t e = 0;
  if constexpr (kB >= 4) {
    for (; e + 4 <= n_e; e += 4) Blocks<4, kSquares>(x, c, e, dim, dot, sq);
  }
  if constexpr (kB >= 2) {
    for (; e + 2 <= n_e; e += 2) Blocks<2, kSquares>(x, c, e, dim, dot, sq);
  }
  for (; e < n_e; ++e) Blocks<1, kSquares>(x, c, e, dim, dot, sq);
}
#else
template <bool kSquares>
HWY_INLINE void Entries(const float* x, const uint16_t* c, size_t n_e, size_t dim, float* dot,
                        float* sq) {
  const size_t body = dim / 4 * 4;
  for (size_t e = 0; e < n_e; ++e) {
    const uint16_t* ce = c + e * dim;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t i = 0; i < body; i += 4) {
      for (size_t j = 0; j < 4; ++j) {
        const float v = f16_to_f32(ce[i + j]);
        s[j] += x[i + j] * v;
        if (kSquares) ss[j] += v * v;
      }
    }
    Finish(x, ce, body, dim, s, ss, dot + e, kSquares ? sq + e : nullptr);
  }
}
#endif

void EntryDotsImpl(const float* x, const uint16_t* c, size_t n_e, size_t dim, float* dot,
                   float* sq) {
  if (sq) {
    Entries<true>(x, c, n_e, dim, dot, sq);
  } else {
    Entries<false>(x, c, n_e, dim, dot, nullptr);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace spindle_dots
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvsdk::cpu {
namespace spindle_dots {
HWY_EXPORT(EntryDotsImpl);
}  // namespace spindle_dots

void spindle_entry_dots(const float* x, const uint16_t* c, size_t n_entries, size_t dim,
                        float* dot, float* sq) {
  if (n_entries == 0) return;
  HWY_DYNAMIC_DISPATCH(spindle_dots::EntryDotsImpl)(x, c, n_entries, dim, dot, sq);
}

}  // namespace kvsdk::cpu
#endif  // HWY_ONCE
