// SIMD scoring kernel: attention_column_sums with the bits of attention_column_sums_reference
// (see attention_scores.h for why the bits must match, and for the scheme).
//
// Per block of rows (all 128 rows of a Llama-3-8B window group at once, up to 64 MiB of logits):
//  1. logits: keys come in chunks of 256 (the loader converts them to f32 rows), are transposed
//     to [channel][key], and a register tile of RT rows x KB vectors of keys accumulates
//     q[c] * k[c] (q broadcast, one key per lane) into the reference's four partial sums
//     (channel c goes to sum c mod 4, the channels past the last multiple of 4 to sum 0), then
//     (s0 + s1) + (s2 + s3), times scale, -inf where the key is in the row's future. Each lane
//     performs exactly dot_f32's operations in dot_f32's order. Running row maxima ride along
//     (a max is exact in any order; NaN logits are skipped, as std::max skips them).
//  2. probabilities: p = exp_f32(logit - max) elementwise (f64 lanes, pmath::exp's operations),
//     and each row's sum of p key by key, in key order, as the reference adds them (8 rows at
//     once, one scalar chain each).
//  3. columns: col_sums[t] += p * (1 / sum), row after row in row order, keys in SIMD lanes.
//  Passes 2 and 3 run 8 rows at a time, so the rows' probabilities stay in L2 between them.
// Compiled once per Highway target (hwy/foreach_target.h re-includes this file), with the same
// target set as fast_attention.cpp; HWY_DYNAMIC_DISPATCH picks the best one at run time.
#include "hwy_targets.h"  // the same Highway targets in every SIMD file (see there)

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_scores_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "attention_scores.h"
#include "portable_math.h"

#ifndef KVSDK_ATTENTION_SCORES_SIMD_ONCE
#define KVSDK_ATTENTION_SCORES_SIMD_ONCE
namespace kvsdk::cpu::colsum {
// Keys per loader call (the reference's chunk) and per transposed chunk; a multiple of every
// vector width (16 f32 lanes at most).
constexpr size_t kChunkKeys = 256;
// Floats between channels of a transposed chunk: the chunk plus 16, so that the channels are not
// 1 KiB apart (a power-of-two stride put the 64 channels a key is stored to in 4 L1 sets, more
// lines than the sets' ways: the transpose's stores then missed).
constexpr size_t kKtStride = kChunkKeys + 16;
// Largest logits block held at once (floats), as in the reference: 64 MiB.
constexpr size_t kMaxLogits = size_t(16) << 20;
// Keys per step of passes 2 and 3 (one row's slice stays in L1 for both of its passes).
constexpr size_t kSliceKeys = 512;
// Rows whose sums run side by side in pass 2 (independent scalar chains).
constexpr size_t kSumRows = 8;
}  // namespace kvsdk::cpu::colsum
#endif

HWY_BEFORE_NAMESPACE();
namespace kvsdk {
namespace cpu {
namespace colsum {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

// ---- exp_f32 of portable_math, in f64 lanes ----------------------------------------------------
// (Not on the emulated fallbacks: their DemoteTo saturates to FLT_MAX where IEEE conversion, and
// the reference, give inf; they call the scalar function instead.)
#if HWY_HAVE_FLOAT64 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
using DD = hn::ScalableTag<double>;
using DDU = hn::RebindToUnsigned<DD>;
using DFH = hn::Rebind<float, DD>;  // the f32 vector with DD's lane count
using VD = hn::Vec<DD>;

// pmath::exp(x) for x promoted from f32, the same operations in the same order; the branches of
// the scalar code become lane selects:
//  - |x| <= ln2/2 takes k = 0; pmath's k == 0 formula 1 - ((r c)/(c - 2) - r) equals the general
//    one 1 - ((lo - (r c)/(2 - c)) - hi) when lo = 0 and hi = r (a / -b = -(a / b) exactly, and
//    the two differ at most in the sign of a zero that is then subtracted from r != 0);
//  - ldexp(y, k) is y * 2^k, exact: clamping x to [-200, 200] keeps 2^k normal, and every x the
//    clamp moves has an f32 result of 0 (x < -200: below 2^-150) or inf (x > 200) either way;
//  - |x| < 2^-28 gives 1 + x; NaN is passed through by the caller.
HWY_INLINE VD ExpF64(VD x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kInvLn2 = 1.44269504088896338700e+00;
  constexpr double P1 = 1.66666666666666019037e-01, P2 = -2.77777777770155933842e-03,
                   P3 = 6.61375632143793436117e-05, P4 = -1.65339022054652515390e-06,
                   P5 = 4.13813679705723846039e-08;
  const DD d;
  const DDU du;
  x = hn::Min(hn::Max(x, hn::Set(d, -200.0)), hn::Set(d, 200.0));
  const VD ax = hn::Abs(x);
  const VD k = hn::IfThenElseZero(
      hn::Gt(ax, hn::Set(d, 0.5 * kLn2Hi)),
      hn::Floor(hn::Add(hn::Mul(x, hn::Set(d, kInvLn2)), hn::Set(d, 0.5))));
  const VD hi = hn::Sub(x, hn::Mul(k, hn::Set(d, kLn2Hi)));
  const VD lo = hn::Mul(k, hn::Set(d, kLn2Lo));
  const VD r = hn::Sub(hi, lo);
  const VD t = hn::Mul(r, r);
  VD p = hn::Add(hn::Set(d, P4), hn::Mul(t, hn::Set(d, P5)));
  p = hn::Add(hn::Set(d, P3), hn::Mul(t, p));
  p = hn::Add(hn::Set(d, P2), hn::Mul(t, p));
  p = hn::Add(hn::Set(d, P1), hn::Mul(t, p));
  const VD c = hn::Sub(r, hn::Mul(t, p));
  const VD q = hn::Div(hn::Mul(r, c), hn::Sub(hn::Set(d, 2.0), c));
  const VD y = hn::Sub(hn::Set(d, 1.0), hn::Sub(hn::Sub(lo, q), hi));
  // 2^k from the exponent bits: k + 1023 + 2^52 holds k + 1023 in its low mantissa bits.
  const VD pow2 = hn::BitCast(
      d, hn::ShiftLeft<52>(hn::BitCast(du, hn::Add(k, hn::Set(d, 1023.0 + 0x1p52)))));
  return hn::IfThenElse(hn::Lt(ax, hn::Set(d, 0x1p-28)), hn::Add(hn::Set(d, 1.0), x),
                        hn::Mul(y, pow2));
}

// out[i] = exp_f32(x[i] - m) for i < n (m = 0 for a plain exp); in place is fine.
HWY_INLINE void ExpShifted(const float* x, float m, size_t n, float* out) {
  const DD dd;
  const DFH df;
  const size_t N = hn::Lanes(dd);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto xf = hn::Sub(hn::LoadU(df, x + i), hn::Set(df, m));
    const auto e = hn::DemoteTo(df, ExpF64(hn::PromoteTo(dd, xf)));
    hn::StoreU(hn::IfThenElse(hn::IsNaN(xf), xf, e), df, out + i);
  }
  for (; i < n; ++i) out[i] = pmath::exp_f32(x[i] - m);
}
#else
HWY_INLINE void ExpShifted(const float* x, float m, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = pmath::exp_f32(x[i] - m);
}
#endif

void ExpArrayImpl(const float* x, size_t n, float* out) { ExpShifted(x, 0.0f, n, out); }

// ---- pass 1: logits --------------------------------------------------------------------------
// Register tile: RT rows x KB vectors of keys, 4 partial sums each (RT * KB * 4 accumulators).
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
constexpr size_t kRT = 2, kKB = 1;
#elif HWY_CAP_GE512 || HWY_ARCH_ARM
// 32 vector registers: 16 accumulators. (Measured on the 2-core AVX-512 build machine: 4 x 1
// was at least as fast as 3 x 2, 2 x 2 and 6 x 1; the machine was too shared to rank them finer.)
constexpr size_t kRT = 4, kKB = 1;
#else
constexpr size_t kRT = 3, kKB = 1;  // 16 vector registers (AVX2, SSE4): 12 accumulators
#endif

// Logits of rows q[0..RT) against the KB * N keys at kt (transposed: channel c of key i at
// kt[c * kKtStride + i]) with positions kpos; keys from `valid` on are padding (-inf). Stores
// to out[r][0 .. KB * N) and folds the logits into row_max[r] (one vector per row).
template <size_t RT, size_t KB>
HWY_INLINE void LogitsTile(const float* const* q, const int32_t* row_pos, size_t dim, float scale,
                           const float* kt, const int32_t* kpos, size_t valid, float* const* out,
                           float* const* row_max) {
  const DF d;
  const DI di;
  const size_t N = hn::Lanes(d);
  VF acc[RT][KB][4];
  for (size_t r = 0; r < RT; ++r)
    for (size_t b = 0; b < KB; ++b)
      for (size_t j = 0; j < 4; ++j) acc[r][b][j] = hn::Zero(d);
  size_t c = 0;
  for (; c + 4 <= dim; c += 4) {
    for (size_t j = 0; j < 4; ++j) {
      VF kv[KB];
      for (size_t b = 0; b < KB; ++b) kv[b] = hn::LoadU(d, kt + (c + j) * kKtStride + b * N);
      for (size_t r = 0; r < RT; ++r) {
        const VF qv = hn::Set(d, q[r][c + j]);
        for (size_t b = 0; b < KB; ++b) acc[r][b][j] = hn::Add(acc[r][b][j], hn::Mul(qv, kv[b]));
      }
    }
  }
  for (; c < dim; ++c) {  // dot_f32's tail: into the first partial sum, in channel order
    VF kv[KB];
    for (size_t b = 0; b < KB; ++b) kv[b] = hn::LoadU(d, kt + c * kKtStride + b * N);
    for (size_t r = 0; r < RT; ++r) {
      const VF qv = hn::Set(d, q[r][c]);
      for (size_t b = 0; b < KB; ++b) acc[r][b][0] = hn::Add(acc[r][b][0], hn::Mul(qv, kv[b]));
    }
  }
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const VF vscale = hn::Set(d, scale);
  for (size_t b = 0; b < KB; ++b) {
    const auto kp = hn::LoadU(di, kpos + b * N);
    const auto pad = hn::Not(hn::FirstN(d, valid > b * N ? valid - b * N : 0));
    for (size_t r = 0; r < RT; ++r) {
      const VF dot = hn::Add(hn::Add(acc[r][b][0], acc[r][b][1]),
                             hn::Add(acc[r][b][2], acc[r][b][3]));
      const auto future = hn::RebindMask(d, hn::Gt(kp, hn::Set(di, row_pos[r])));
      const VF logit = hn::IfThenElse(hn::Or(future, pad), neg_inf, hn::Mul(dot, vscale));
      hn::StoreU(logit, d, out[r] + b * N);
      const VF m = hn::LoadU(d, row_max[r]);
      hn::StoreU(hn::Max(m, hn::IfThenElse(hn::IsNaN(logit), neg_inf, logit)), d, row_max[r]);
    }
  }
}

// Runs f(first_row, integral_constant<RT>) over tiles of kRT rows, then the remainder.
template <class F>
HWY_INLINE void ForRowTiles(size_t n, F&& f) {
  size_t r = 0;
  for (; r + kRT <= n; r += kRT) f(r, std::integral_constant<size_t, kRT>());
  if constexpr (kRT > 2) {
    if (r + 2 <= n) f(r, std::integral_constant<size_t, 2>()), r += 2;
  }
  if (r < n) f(r, std::integral_constant<size_t, 1>());
}

// Channel-major copy of a chunk: kt[c][i] = keys[i][c]; keys past n are 0.
//
// Pure data movement (the logits' bits do not depend on it), but at decode, where a few query
// rows (one token's heads) are scored against every kept key, an element-by-element transpose
// took about 70% of the logits pass (perf of the demo's `h2o` row): it is done here in 4 x 4
// blocks of 128-bit vectors, 4 keys x 4 channels per 4 loads, 8 shuffles and 4 stores.
HWY_INLINE void Transpose(const float* keys, size_t n, size_t dim, float* kt) {
  size_t n4 = 0, dim4 = 0;  // the keys and channels the vector blocks cover
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<float> d4;
  n4 = n / 4 * 4;
  dim4 = dim / 4 * 4;
  for (size_t i = 0; i < n4; i += 4) {
    const float* r = keys + i * dim;
    for (size_t c = 0; c < dim4; c += 4) {
      const auto r0 = hn::LoadU(d4, r + c), r1 = hn::LoadU(d4, r + dim + c);
      const auto r2 = hn::LoadU(d4, r + 2 * dim + c), r3 = hn::LoadU(d4, r + 3 * dim + c);
      const auto lo01 = hn::InterleaveLower(d4, r0, r1), lo23 = hn::InterleaveLower(d4, r2, r3);
      const auto hi01 = hn::InterleaveUpper(d4, r0, r1), hi23 = hn::InterleaveUpper(d4, r2, r3);
      float* out = kt + c * kKtStride + i;
      hn::StoreU(hn::ConcatLowerLower(d4, lo23, lo01), d4, out);
      hn::StoreU(hn::ConcatUpperUpper(d4, lo23, lo01), d4, out + kKtStride);
      hn::StoreU(hn::ConcatLowerLower(d4, hi23, hi01), d4, out + 2 * kKtStride);
      hn::StoreU(hn::ConcatUpperUpper(d4, hi23, hi01), d4, out + 3 * kKtStride);
    }
  }
#endif
  // The channels past dim4 of the blocked keys, then the keys past n4.
  for (size_t i = 0; i < n4; ++i) {
    for (size_t c = dim4; c < dim; ++c) kt[c * kKtStride + i] = keys[i * dim + c];
  }
  constexpr size_t kB = 8;  // 8 x 8 blocks: reads and writes both stay within few lines
  for (size_t i0 = n4; i0 < n; i0 += kB) {
    const size_t ni = std::min(kB, n - i0);
    for (size_t c0 = 0; c0 < dim; c0 += kB) {
      const size_t nc = std::min(kB, dim - c0);
      for (size_t c = c0; c < c0 + nc; ++c) {
        for (size_t i = i0; i < i0 + ni; ++i) kt[c * kKtStride + i] = keys[i * dim + c];
      }
    }
  }
  if (n < kChunkKeys) {
    for (size_t c = 0; c < dim; ++c) {
      std::fill(kt + c * kKtStride + n, kt + c * kKtStride + kChunkKeys, 0.0f);
    }
  }
}

// ---- the kernel --------------------------------------------------------------------------------
// Floats per logits row: whole key chunks (tiles store whole vectors), plus 16 so that rows are
// not 4 KiB apart (a power-of-two stride maps every row's stores to the same cache set).
HWY_INLINE size_t LogitsStride(size_t n_keys) {
  return (n_keys + kChunkKeys - 1) / kChunkKeys * kChunkKeys + 16;
}

// Sizes the scratch for blocks of `rows` rows of `stride` logits.
HWY_INLINE void FitScratch(ColumnSumsScratch& s, size_t rows, size_t stride, size_t dim) {
  const auto fit = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  fit(s.logits, rows * stride);
  fit(s.keys, kChunkKeys * dim);
  fit(s.keys_t, kKtStride * dim);
  fit(s.key_pos, kChunkKeys);
  fit(s.row_max, rows * hn::Lanes(DF()));
}

// Pass 1: logits of rows q[0, nr) into s.logits (row r at r * stride), one key chunk at a time
// (each key loaded and transposed once for all rows), and the rows' maxima into s.row_max.
void Logits(const float* q, const int32_t* rpos, size_t nr, size_t dim, float scale,
            const KeyChunkLoader& load_keys, const int32_t* key_pos, size_t n_keys,
            size_t stride, ColumnSumsScratch& s) {
  const size_t N = hn::Lanes(DF());
  std::fill(s.row_max.begin(), s.row_max.begin() + nr * N,
            -std::numeric_limits<float>::infinity());
  for (size_t t0 = 0; t0 < n_keys; t0 += kChunkKeys) {
    const size_t nt = std::min(kChunkKeys, n_keys - t0);
    load_keys(t0, nt, s.keys.data());
    Transpose(s.keys.data(), nt, dim, s.keys_t.data());
    if (key_pos) {
      std::copy_n(key_pos + t0, nt, s.key_pos.begin());
    } else {
      std::fill_n(s.key_pos.begin(), nt, 0);
    }
    std::fill(s.key_pos.begin() + nt, s.key_pos.begin() + kChunkKeys,
              std::numeric_limits<int32_t>::max());
    for (size_t i0 = 0; i0 < nt; i0 += kKB * N) {
      ForRowTiles(nr, [&](size_t r, auto rt) {
        constexpr size_t RT = decltype(rt)::value;
        const float* qr[RT];
        float* out[RT];
        float* mx[RT];
        for (size_t i = 0; i < RT; ++i) {
          qr[i] = q + (r + i) * dim;
          out[i] = s.logits.data() + (r + i) * stride + t0 + i0;
          mx[i] = s.row_max.data() + (r + i) * N;
        }
        LogitsTile<RT, kKB>(qr, rpos + r, dim, scale, s.keys_t.data() + i0,
                            s.key_pos.data() + i0, nt - i0, out, mx);
      });
    }
  }
}

void ColumnSumsImpl(const float* q_rows, const int32_t* row_pos, size_t n_rows, size_t dim,
                    float scale, const KeyChunkLoader& load_keys, const int32_t* key_pos,
                    size_t n_keys, float* col_sums, ColumnSumsScratch& s) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t rows_per_block = std::max<size_t>(1, std::min(n_rows, kMaxLogits / n_keys));
  const size_t stride = LogitsStride(n_keys);
  FitScratch(s, rows_per_block, stride, dim);
  static const float kZeros[kSliceKeys] = {};

  for (size_t r0 = 0; r0 < n_rows; r0 += rows_per_block) {
    const size_t nr = std::min(rows_per_block, n_rows - r0);
    Logits(q_rows + r0 * dim, row_pos + r0, nr, dim, scale, load_keys, key_pos, n_keys, stride,
           s);
    // Passes 2 and 3, kSumRows rows at a time (their probabilities stay in L2 between the two).
    for (size_t r = 0; r < nr; r += kSumRows) {
      const size_t rows = std::min(kSumRows, nr - r);
      float* p[kSumRows];
      float m[kSumRows], sum[kSumRows] = {}, inv[kSumRows];
      for (size_t i = 0; i < kSumRows; ++i) {
        m[i] = neg_inf;
        p[i] = i < rows ? s.logits.data() + (r + i) * stride : nullptr;
        if (i >= rows) continue;
        const float* v = s.row_max.data() + (r + i) * N;
        for (size_t l = 0; l < N; ++l) m[i] = std::max(m[i], v[l]);
      }
      // Pass 2: p = exp(logit - max) in place, and each row's sum key by key.
      for (size_t t0 = 0; t0 < n_keys; t0 += kSliceKeys) {
        const size_t nt = std::min(kSliceKeys, n_keys - t0);
        const float* ps[kSumRows];
        for (size_t i = 0; i < kSumRows; ++i) {
          ps[i] = kZeros;  // rows past the block, or that see no key: sums of zeros, unused
          if (i >= rows || m[i] == neg_inf) continue;
          ExpShifted(p[i] + t0, m[i], nt, p[i] + t0);
          ps[i] = p[i] + t0;
        }
        for (size_t t = 0; t < nt; ++t) {
          for (size_t i = 0; i < kSumRows; ++i) sum[i] += ps[i][t];
        }
      }
      // Pass 3: into the columns, row after row in row order (rows that see no key skipped).
      size_t n_seeing = 0;
      const float* pr[kSumRows];
      for (size_t i = 0; i < rows; ++i) {
        if (m[i] == neg_inf) continue;
        pr[n_seeing] = p[i];
        inv[n_seeing++] = 1.0f / sum[i];
      }
      if (n_seeing == 0) continue;
      VF vinv[kSumRows];
      for (size_t i = 0; i < n_seeing; ++i) vinv[i] = hn::Set(d, inv[i]);
      size_t t = 0;
      for (; t + N <= n_keys; t += N) {
        VF c = hn::LoadU(d, col_sums + t);
        for (size_t i = 0; i < n_seeing; ++i) c = hn::Add(c, hn::Mul(hn::LoadU(d, pr[i] + t), vinv[i]));
        hn::StoreU(c, d, col_sums + t);
      }
      for (; t < n_keys; ++t) {
        for (size_t i = 0; i < n_seeing; ++i) col_sums[t] += pr[i][t] * inv[i];
      }
    }
  }
}

// Benchmark hook: pass 1 alone, unmasked, every row in one block.
const float* LogitsImpl(const float* q_rows, size_t n_rows, size_t dim, float scale,
                        const KeyChunkLoader& load_keys, size_t n_keys, ColumnSumsScratch& s,
                        size_t* stride) {
  *stride = LogitsStride(n_keys);
  FitScratch(s, n_rows, *stride, dim);
  const std::vector<int32_t> sees_all(n_rows, std::numeric_limits<int32_t>::max());
  Logits(q_rows, sees_all.data(), n_rows, dim, scale, load_keys, nullptr, n_keys, *stride, s);
  return s.logits.data();
}

}  // namespace HWY_NAMESPACE
}  // namespace colsum
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvsdk::cpu {

namespace colsum {
HWY_EXPORT(ColumnSumsImpl);
HWY_EXPORT(ExpArrayImpl);
HWY_EXPORT(LogitsImpl);
}  // namespace colsum

void attention_column_sums(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                           size_t head_dim, float scale, const KeyChunkLoader& load_keys,
                           const int32_t* key_pos, size_t n_keys, float* col_sums,
                           ColumnSumsScratch& scratch) {
  if (n_rows == 0 || n_keys == 0) return;
  HWY_DYNAMIC_DISPATCH(colsum::ColumnSumsImpl)(q_rows, row_pos, n_rows, head_dim, scale,
                                               load_keys, key_pos, n_keys, col_sums, scratch);
}

void attention_column_sums(const float* q_rows, const int32_t* row_pos, size_t n_rows,
                           size_t head_dim, float scale, const KeyChunkLoader& load_keys,
                           const int32_t* key_pos, size_t n_keys, float* col_sums) {
  ColumnSumsScratch scratch;
  attention_column_sums(q_rows, row_pos, n_rows, head_dim, scale, load_keys, key_pos, n_keys,
                        col_sums, scratch);
}

void portable_exp_f32_array(const float* x, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(colsum::ExpArrayImpl)(x, n, out);
}

const float* attention_logits(const float* q_rows, size_t n_rows, size_t head_dim, float scale,
                              const KeyChunkLoader& load_keys, size_t n_keys,
                              ColumnSumsScratch& scratch, size_t* stride) {
  return HWY_DYNAMIC_DISPATCH(colsum::LogitsImpl)(q_rows, n_rows, head_dim, scale, load_keys,
                                                  n_keys, scratch, stride);
}

}  // namespace kvsdk::cpu
#endif  // HWY_ONCE
