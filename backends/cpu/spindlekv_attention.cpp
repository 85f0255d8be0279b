// The optimized attention over a SpindleKV head (spindlekv_attend_entries, spindlekv_store.h):
// fused SIMD passes over the codebooks in place, compiled once per Highway target (the same
// target set as fast_attention.cpp, hwy_targets.h) with HWY_DYNAMIC_DISPATCH picking one at run
// time.
//
// Keys (SpindleKV (docs/papers.md) §3.4, Eq. 14, keys grouped before RoPE): a token's key is
// R(p) (m C[e]), with C[e] its f16 codebook entry, m its magnitude and R(p) the rotation at its
// position. The tokens go in blocks of kRopeBlock; with p0 the block's first position,
//   q . R(p) (m C[e]) = m (R(-p0) q) . (R(p - p0) C[e]),
// so the queries are rotated once per block (Rope::rotate_back, in double) and each token only by
// its offset j = p - p0 < kRopeBlock, whose rotation is row j of a table made once per call
// (Rope::offset_table): per 16 tokens, each entry row is gathered, converted from f16 and
// rotated (x * cos + partner(x) * sin, elementwise) into a 16-row f32 buffer that stays in L1,
// and scored against every query row at once. A block's anchor angles advance from the last
// block's by angle addition in double; a token whose offset falls outside [0, kRopeBlock) (a gap
// in the positions) gets its table row from its angles directly.
//
// Values (no RoPE): the softmax weights are summed per value entry (Eq. 14 moved past the
// softmax: sum_t p_t m_t C[e_t] = sum_e C[e] sum_{t: e_t = e} p_t m_t), and each entry row is
// converted and accumulated once for all query rows.
//
// Same bits on every target (fast_attention.h's scheme): dot products in 16 virtual lanes
// reduced by one fixed tree (fast_lanes-inl.h), tail channels in order; the rotation, magnitude,
// scale and mask elementwise; exp is fast::exp_f32; the softmax sum is in double over four fixed
// interleaved accumulators; values accumulate per channel entry by entry. The build passes
// -ffp-contract=off (no FMA). Not bit-identical to the reference (OnlineAttention over rows
// reconstructed and rotated in double): backend_ops_test bounds the gap.
#include "hwy_targets.h"  // the same Highway targets in every SIMD file (see there)

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "spindlekv_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "fast_lanes-inl.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "fast_attention.h"
#include "spindlekv_store.h"
#include "util/half.h"

#ifndef KVSDK_SPINDLEKV_ATTENTION_ONCE
#define KVSDK_SPINDLEKV_ATTENTION_ONCE
namespace kvsdk::cpu::spindle {

// Tokens per rotation block: the table holds kRopeBlock rows of 2 * head_dim floats (16 KB at
// head_dim 64), and the queries are rotated once per block.
constexpr size_t kRopeBlock = 32;
// Tokens scored together (one Tree16 reduction on 16-lane targets).
constexpr size_t kGroup = 16;

// One call's view of a head and a block of query rows, and the working memory of the passes.
struct Pass {
  const uint16_t* key_entries;  // [entries][dim] f16
  const uint32_t* key_index;    // [n]
  const float* key_magnitude;   // [n]
  const int32_t* positions;     // [n]
  size_t n, dim;
  const Rope* rope;
  const float* table;         // [kRopeBlock][2][dim] (Rope::offset_table)
  const double* block_c;      // cos and sin of kRopeBlock positions' angles [dim / 2]
  const double* block_s;
  const float* q;             // [rows][dim]
  const int32_t* q_positions; // [rows] or null (sees everything)
  size_t rows;
  float scale;
  float* q_rot;       // [rows][dim]: the queries rotated back by the block's anchor
  float* keys;        // [kGroup][dim]: a group's rotated entry rows
  float* dots;        // [rows][kGroup]
  float* gap_row;     // [2][dim]: the table row of an offset outside the table
  double* anchor;     // [2][dim / 2]: cos, sin of the block's anchor; then 2 more for gap_row
  float* scores;      // [rows][n]
  float* row_max;     // [rows]
};

}  // namespace kvsdk::cpu::spindle
#endif

HWY_BEFORE_NAMESPACE();
namespace kvsdk {
namespace cpu {
namespace spindle {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using fast::HWY_NAMESPACE::DF;
using fast::HWY_NAMESPACE::DotTile;
using fast::HWY_NAMESPACE::ForTiles;
using fast::HWY_NAMESPACE::kL;
using fast::HWY_NAMESPACE::VF;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

HWY_INLINE VF LoadF16(const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(DF(), hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

// dst = R(j) x for the f16 row x and the table row tr of offset j: x[c] * cos[c] +
// x[partner(c)] * sin[c] (Rope::offset_table), one product each and one sum: the same bits as
// the scalar form below on every target.
HWY_INLINE void RotateRow(const uint16_t* x, const float* tr, size_t dim, kvsdk_rope_style style,
                          float* dst) {
  const DF d;
  const float* cs = tr;
  const float* sn = tr + dim;
  if (style == KVSDK_ROPE_NONE) {
    size_t c = 0;
    for (; c + kL <= dim; c += kL) hn::StoreU(LoadF16(x + c), d, dst + c);
    for (; c < dim; ++c) dst[c] = f16_to_f32(x[c]);
    return;
  }
  if (style == KVSDK_ROPE_HALF) {
    const size_t half = dim / 2;
    size_t i = 0;
    for (; i + kL <= half; i += kL) {
      const VF lo = LoadF16(x + i), hi = LoadF16(x + half + i);
      hn::StoreU(hn::Add(hn::Mul(lo, hn::LoadU(d, cs + i)), hn::Mul(hi, hn::LoadU(d, sn + i))), d,
                 dst + i);
      hn::StoreU(hn::Add(hn::Mul(hi, hn::LoadU(d, cs + half + i)),
                         hn::Mul(lo, hn::LoadU(d, sn + half + i))),
                 d, dst + half + i);
    }
    for (; i < half; ++i) {
      const float lo = f16_to_f32(x[i]), hi = f16_to_f32(x[half + i]);
      dst[i] = lo * cs[i] + hi * sn[i];
      dst[half + i] = hi * cs[half + i] + lo * sn[half + i];
    }
    return;
  }
  size_t c = 0;  // interleaved pairs (2i, 2i + 1): the partner is the neighbour
#if HWY_TARGET != HWY_SCALAR
  for (; c + kL <= dim; c += kL) {  // kL is even: vectors hold whole pairs
    const VF v = LoadF16(x + c);
    hn::StoreU(hn::Add(hn::Mul(v, hn::LoadU(d, cs + c)), hn::Mul(hn::Reverse2(d, v),
                                                              hn::LoadU(d, sn + c))),
               d, dst + c);
  }
#endif
  for (; c + 2 <= dim; c += 2) {
    const float a = f16_to_f32(x[c]), b = f16_to_f32(x[c + 1]);
    dst[c] = a * cs[c] + b * sn[c];
    dst[c + 1] = b * cs[c + 1] + a * sn[c + 1];
  }
}

// Scores of tokens [t0, t0 + n_tok) (one group) from their rotated keys in p.keys:
// s = ((q' . k) * m) * scale, -inf in a row's future; and each row's running maximum.
HWY_INLINE void ScoreGroup(const Pass& p, const float* q, size_t t0, size_t n_tok) {
  const size_t dim = p.dim;
  ForTiles(p.rows, [&](size_t r0, auto rt) {
    constexpr size_t RT = decltype(rt)::value;
    const float* qr[RT];
    float* dr[RT];
    for (size_t r = 0; r < RT; ++r) {
      qr[r] = q + (r0 + r) * dim;
      dr[r] = p.dots + (r0 + r) * kGroup;
    }
    DotTile<RT>(p.keys, n_tok, dim, qr, dr);
  });
  const float* mag = p.key_magnitude + t0;
  const int32_t* pos = p.positions + t0;
  for (size_t r = 0; r < p.rows; ++r) {
    const int32_t qp = p.q_positions ? p.q_positions[r] : INT32_MAX;
    const float* dot = p.dots + r * kGroup;
    float* s = p.scores + r * p.n + t0;
    float mx = p.row_max[r];
    if (n_tok == kGroup) {  // elementwise in vectors (kGroup is a multiple of every kL)
      const DF d;
      const hn::RebindToSigned<DF> di;
      VF vmax = hn::Set(d, mx);
      for (size_t j = 0; j < kGroup; j += kL) {
        VF v = hn::Mul(hn::Mul(hn::LoadU(d, dot + j), hn::LoadU(d, mag + j)), hn::Set(d, p.scale));
        const auto future = hn::RebindMask(d, hn::Gt(hn::LoadU(di, pos + j), hn::Set(di, qp)));
        v = hn::IfThenElse(future, hn::Set(d, kNegInf), v);
        hn::StoreU(v, d, s + j);
        vmax = hn::Max(vmax, v);
      }
      mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
    } else {
      for (size_t t = 0; t < n_tok; ++t) {
        s[t] = pos[t] > qp ? kNegInf : (dot[t] * mag[t]) * p.scale;
        mx = std::max(mx, s[t]);
      }
    }
    p.row_max[r] = mx;
  }
}

// Every token's score for the pass's query rows (scores [rows][n]) and each row's maximum.
void KeyScoresImpl(const Pass& p) {
  const size_t dim = p.dim, half = dim / 2;
  const Rope& rope = *p.rope;
  const kvsdk_rope_style style = rope.style();
  const bool rotates = style != KVSDK_ROPE_NONE;
  double* ac = p.anchor;
  double* as = p.anchor + half;
  std::fill_n(p.row_max, p.rows, kNegInf);
  int64_t anchor = 0;
  for (size_t b0 = 0; b0 < p.n; b0 += kRopeBlock) {
    const size_t b1 = std::min(p.n, b0 + kRopeBlock);
    const int64_t p0 = p.positions[b0];
    const float* q = p.q;
    if (rotates) {
      if (b0 > 0 && p0 == anchor + int64_t(kRopeBlock)) {
        for (size_t i = 0; i < half; ++i) {  // (c + i s) * (block_c + i block_s)
          const double nc = ac[i] * p.block_c[i] - as[i] * p.block_s[i];
          as[i] = as[i] * p.block_c[i] + ac[i] * p.block_s[i];
          ac[i] = nc;
        }
      } else {
        rope.angles(p0, ac, as);
      }
      anchor = p0;
      for (size_t r = 0; r < p.rows; ++r) {
        rope.rotate_back(p.q + r * dim, ac, as, p.q_rot + r * dim);
      }
      q = p.q_rot;
    }
    for (size_t g0 = b0; g0 < b1; g0 += kGroup) {
      const size_t g1 = std::min(b1, g0 + kGroup);
      for (size_t t = g0; t < g1; ++t) {
        const uint16_t* x = p.key_entries + size_t(p.key_index[t]) * dim;
        const int64_t j = int64_t(p.positions[t]) - p0;
        const float* tr = p.table;  // (unread without rotation)
        if (rotates && j >= 0 && j < int64_t(kRopeBlock)) {
          tr = p.table + size_t(j) * 2 * dim;
        } else if (rotates) {  // a gap in the positions
          rope.offset_row(j, p.gap_row, p.anchor + dim, p.anchor + dim + half);
          tr = p.gap_row;
        }
        RotateRow(x, tr, dim, style, p.keys + (t - g0) * dim);
      }
      ScoreGroup(p, q, g0, g1 - g0);
    }
  }
}

// out[r][c] = sum_e w[r][e] * C[e][c] over the value entries in order, CH vectors of channels
// per pass in registers (per channel: the same bits on every target).
template <size_t CH>
HWY_INLINE void ValuesChunk(const float* w, size_t rows, const uint16_t* entries, size_t n_e,
                            size_t dim, size_t c0, float* out) {
  const DF d;
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    const size_t rt = std::min<size_t>(4, rows - r0);
    VF a[4][CH];
    for (size_t r = 0; r < 4; ++r)
      for (size_t j = 0; j < CH; ++j) a[r][j] = hn::Zero(d);
    for (size_t e = 0; e < n_e; ++e) {
      VF vv[CH];
      for (size_t j = 0; j < CH; ++j) vv[j] = LoadF16(entries + e * dim + c0 + j * kL);
      for (size_t r = 0; r < rt; ++r) {
        const VF pw = hn::Set(d, w[(r0 + r) * n_e + e]);
        for (size_t j = 0; j < CH; ++j) a[r][j] = hn::Add(a[r][j], hn::Mul(pw, vv[j]));
      }
    }
    for (size_t r = 0; r < rt; ++r)
      for (size_t j = 0; j < CH; ++j) hn::StoreU(a[r][j], d, out + (r0 + r) * dim + c0 + j * kL);
  }
}

void EntryValuesImpl(const float* w, size_t rows, const uint16_t* entries, size_t n_e, size_t dim,
                     float* out) {
  constexpr size_t CH = kL == 1 ? 1 : 64 / kL;  // 64 channels per pass (4 AVX-512 vectors)
  size_t c = 0;
  for (; c + CH * kL <= dim; c += CH * kL) ValuesChunk<CH>(w, rows, entries, n_e, dim, c, out);
  for (; c + kL <= dim; c += kL) ValuesChunk<1>(w, rows, entries, n_e, dim, c, out);
  for (; c < dim; ++c) {
    for (size_t r = 0; r < rows; ++r) {
      float a = 0.0f;
      for (size_t e = 0; e < n_e; ++e) a += w[r * n_e + e] * f16_to_f32(entries[e * dim + c]);
      out[r * dim + c] = a;
    }
  }
}

// x[i] -= m for n floats (elementwise).
void SubtractImpl(float* x, size_t n, float m) {
  const DF d;
  const VF mv = hn::Set(d, m);
  size_t i = 0;
  for (; i + kL <= n; i += kL) hn::StoreU(hn::Sub(hn::LoadU(d, x + i), mv), d, x + i);
  for (; i < n; ++i) x[i] -= m;
}

}  // namespace HWY_NAMESPACE
}  // namespace spindle
}  // namespace cpu
}  // namespace kvsdk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "util/growth.h"

namespace kvsdk::cpu {
namespace spindle {
HWY_EXPORT(KeyScoresImpl);
HWY_EXPORT(EntryValuesImpl);
HWY_EXPORT(SubtractImpl);
}  // namespace spindle

namespace {
// Query rows per block of spindlekv_attend_entries: a decode step's GQA group fits in one.
constexpr size_t kEntryRowBlock = 16;
}  // namespace

void spindlekv_attend_entries(const float* q, const int32_t* q_positions, size_t n_rows,
                              float scale, const SpindleHeadStore& store,
                              AttentionScratch& scratch, float* out) {
  using spindle::kGroup;
  using spindle::kRopeBlock;
  const size_t n = store.size(), dim = store.head_dim(), half = dim / 2;
  const SpindleCodebook& keys = store.keys();
  const SpindleCodebook& values = store.values();
  const size_t n_entries = values.entries();
  const uint32_t* index = values.index().data();
  const float* magnitude = values.magnitude().data();
  std::fill_n(out, n_rows * dim, 0.0f);
  if (n == 0 || n_rows == 0) return;
  const size_t block = std::min(kEntryRowBlock, n_rows);
  // The workspace's buffers as plain working memory (no other op's state lives in them).
  float* scores = at_least(scratch.scores, block * n).data();
  float* weights = at_least(scratch.v_chunk, block * n_entries).data();
  float* sums = at_least(scratch.sum, 2 * block).data();
  float* f = at_least(scratch.k_chunk,
                      (2 * kRopeBlock + block + kGroup + 2) * dim + block * kGroup)
                 .data();
  // Angles in double: the block anchor's cos and sin, a gap row's, the step between anchors. On
  // the stack for head dims up to 2 * kStackHalf, as Rope::apply_rows.
  constexpr size_t kStackHalf = 256;
  double stack[6 * kStackHalf];
  std::vector<double> heap(half > kStackHalf ? 6 * half : 0);
  double* angles = half > kStackHalf ? heap.data() : stack;
  spindle::Pass p{};
  p.key_entries = keys.entry_data().data();
  p.key_index = keys.index().data();
  p.key_magnitude = keys.magnitude().data();
  p.positions = store.positions().data();
  p.n = n;
  p.dim = dim;
  p.rope = &store.rope();
  p.table = f;
  p.block_c = angles + 4 * half;
  p.block_s = angles + 5 * half;
  p.scale = scale;
  p.q_rot = f + 2 * kRopeBlock * dim;
  p.keys = p.q_rot + block * dim;
  p.gap_row = p.keys + kGroup * dim;
  p.dots = p.gap_row + 2 * dim;
  p.anchor = angles;
  p.scores = scores;
  p.row_max = sums + block;
  store.rope().offset_table(kRopeBlock, f, angles + 4 * half, angles + 5 * half);
  for (size_t r0 = 0; r0 < n_rows; r0 += block) {
    const size_t rows = std::min(block, n_rows - r0);
    p.q = q + r0 * dim;
    p.q_positions = q_positions ? q_positions + r0 : nullptr;
    p.rows = rows;
    HWY_DYNAMIC_DISPATCH(spindle::KeyScoresImpl)(p);
    // Softmax per row, and its weight per value entry (tokens in order: deterministic sums).
    std::fill_n(weights, rows * n_entries, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      float* s = scores + r * n;
      sums[r] = 0.0f;
      const float mx = p.row_max[r];
      if (mx == -std::numeric_limits<float>::infinity()) continue;  // sees no token: zeros
      HWY_DYNAMIC_DISPATCH(spindle::SubtractImpl)(s, n, mx);
      fast::exp_f32(s, n, s);  // -inf -> 0
      // Four interleaved sums (one dependent chain was the loop's bound), combined in one order.
      double z[4] = {0.0, 0.0, 0.0, 0.0};
      float* w = weights + r * n_entries;
      for (size_t t = 0; t < n; ++t) {
        z[t & 3] += s[t];
        w[index[t]] += s[t] * magnitude[t];
      }
      sums[r] = float((z[0] + z[1]) + (z[2] + z[3]));
    }
    // Eq. 14 once per entry: out_r = sum_e W[r][e] C[e] / sum_r.
    float* o = out + r0 * dim;
    HWY_DYNAMIC_DISPATCH(spindle::EntryValuesImpl)(weights, rows, values.entry_data().data(),
                                                   n_entries, dim, o);
    for (size_t r = 0; r < rows; ++r) {
      const float inv = sums[r] > 0.0f ? 1.0f / sums[r] : 0.0f;
      for (size_t d = 0; d < dim; ++d) o[r * dim + d] *= inv;
    }
  }
}

}  // namespace kvsdk::cpu
#endif  // HWY_ONCE
