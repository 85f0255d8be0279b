// The optimized CPU backend: the reference table (reference_ops.cpp) with every entry that has a
// faster kernel replaced. The replacements are Highway SIMD kernels with runtime dispatch
// (fast_attention.h): the best target this CPU runs is picked on the first call, and every
// target gives the same bits, so snapshots continue identically across machines. Entries not
// replaced here run the reference kernel; backend_ops_test checks every entry against the oracle
// with a stated tolerance.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend_ops.h"
#include "cpu_workspace.h"
#include "fast_attention.h"
#include "fast_chunk_attention.h"
#include "kivi_tier.h"
#include "minicache_kivi.h"
#include "minicache_merge.h"
#include "smallkv.h"
#include "specache.h"
#include "specache_attention.h"
#include "spindlekv_store.h"
#include "util/growth.h"
#include "util/half_array.h"

namespace kvsdk::backend {
namespace {

cpu::fast::Queries queries(const QueryRows& q) {
  cpu::fast::Queries f;
  f.q = q.q;
  f.positions = q.positions;
  f.n_rows = q.n_rows;
  f.dim = q.dim;
  f.scale = q.scale;
  return f;
}

void f16_to_f32(const uint16_t* src, size_t n, float* dst) { f16_to_f32_array(src, dst, n); }

void attend_f16(const QueryRows& q, const F16Rows& r, Workspace& ws, float* out) {
  cpu::fast::attend_f16(queries(q), r.k, r.v, r.positions, r.n_tokens, ws.fast, out);
}

void attend_kivi(const QueryRows& q, const cpu::KiviHeadStore& s, Workspace& ws, float* out) {
  cpu::fast::attend_kivi(queries(q), s, ws.fast, out);
}

// SIMD window scoring with the reference's bits (attention_scores.h), in reused scratch.
void column_sums(const QueryRows& q, const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                 size_t n_keys, Workspace& ws, float* col_sums) {
  cpu::attention_column_sums(q.q, q.positions, q.n_rows, q.dim, q.scale, keys, key_pos, n_keys,
                             col_sums, ws.scores);
}

// The chunk-fed tiers: the same chunk-feeding functions as the reference (so the same rows in the
// same chunks), into the SIMD online softmax (fast_chunk_attention.h) instead of OnlineAttention.
template <class Feed>
void chunked(const QueryRows& q, Workspace& ws, float* out, Feed&& feed) {
  cpu::fast::ChunkAttention att(queries(q), ws.chunk);
  feed(att);
  att.finish(out);
}

// Dense f16 rows (MiniCache+KIVI's pending rows) in chunks converted to f32.
void add_f16_rows(cpu::fast::ChunkAttention& att, const F16Rows& r, size_t dim, Workspace& ws) {
  const size_t chunk = std::min(kReferenceChunk, r.n_tokens) * dim;
  float* k = at_least(ws.attention.k_chunk, chunk).data();
  float* v = at_least(ws.attention.v_chunk, chunk).data();
  for (size_t t0 = 0; t0 < r.n_tokens; t0 += kReferenceChunk) {
    const size_t n = std::min(kReferenceChunk, r.n_tokens - t0);
    f16_to_f32_array(r.k + t0 * dim, k, n * dim);
    f16_to_f32_array(r.v + t0 * dim, v, n * dim);
    att.add_chunk(k, v, r.positions + t0, n);
  }
}

// SpindleKV: values summed per codebook entry after the softmax (spindlekv_store.h), in the
// workspace's reference buffers (this backend runs no OnlineAttention on them).
void attend_spindle(const QueryRows& q, const cpu::SpindleHeadStore& s, Workspace& ws,
                    float* out) {
  cpu::spindlekv_attend_entries(q.q, q.positions, q.n_rows, q.scale, s, ws.attention, out);
}

// MiniCache's f16 pair read in place by the fused f16 kernel (fast::attend_scaled_f16): a merged
// token's key scores (q . e) * m * scale and its value enters as (p * m) * e, with e the stored
// f16 direction and m the layer's magnitude; retained tokens are the layer's exact f16 rows; the
// pending rows follow in the same softmax. No f32 chunk is formed.
cpu::fast::ScaledF16Rows scaled_rows(const cpu::MergedLayerPair& t, int layer) {
  static_assert(cpu::MergedLayerPair::kRetainedBit == cpu::fast::kDirectRow,
                "retained slots are the kernel's direct rows");
  return {t.slots(), t.directions(), t.magnitudes(layer), t.retained_rows(layer)};
}

void attend_minicache(const QueryRows& q, const cpu::MiniCacheHeadPair& p, int layer,
                      const F16Rows& pending, Workspace& ws, float* out) {
  cpu::fast::attend_scaled_f16(queries(q), scaled_rows(p.keys, layer),
                               scaled_rows(p.values, layer), p.positions.data(), p.keys.size(),
                               pending.k, pending.v, pending.positions, pending.n_tokens,
                               ws.fast, out);
}

void attend_minicache_kivi(const QueryRows& q, const cpu::MiniCacheKiviPair& p, int layer,
                           const F16Rows& pending, Workspace& ws, float* out) {
  chunked(q, ws, out, [&](cpu::fast::ChunkAttention& att) {
    cpu::minicache_kivi_attend(p, layer, att, ws.attention.k_chunk, ws.attention.v_chunk,
                               ws.minicache);
    add_f16_rows(att, pending, q.dim, ws);
  });
}

// SpeCache: the fused KIVI kernel over the low-bit copy without the fetched tokens, merged with
// the f16 kernel over the fetched rows (specache_attention.h).
void attend_specache(const QueryRows& q, const cpu::KiviHeadStore& lowbit,
                     const cpu::SpeCacheFetched& fetched, Workspace& ws, float* out) {
  cpu::specache_attend_fast(queries(q), lowbit, fetched, ws.specache, ws.fast, out, nullptr);
}

// From scores [group][n] (overwritten) to the group-averaged probabilities and top-k
// (cpu::specache_select_fast, specache_attention.h).
void specache_select_scored(float* scores, size_t group, size_t n, size_t k, Workspace& ws,
                            std::vector<uint32_t>& tokens, std::vector<float>* avg_probs) {
  cpu::specache_select_fast(scores, group, n, k, ws.specache, tokens, avg_probs);
}

// SpeCache selection: the fused KIVI kernel's scores (specache_scores_fast: the bits
// attend_specache_scored hands out, so both routes select the same rows), then
// specache_select_scored; buffers reused.
void specache_select(const QueryRows& q, const cpu::KiviHeadStore& lowbit, size_t k,
                     Workspace& ws, std::vector<uint32_t>& tokens,
                     std::vector<float>* avg_probs) {
  cpu::SpeCacheSelectScratch& sc = ws.specache;
  const size_t n = lowbit.size(), group = q.n_rows;
  tokens.clear();
  if (n == 0) {
    if (avg_probs) avg_probs->clear();
    return;
  }
  float* scores = at_least(sc.scores, group * n).data();
  // Every row of the group at the query's position (one speculative query).
  QueryRows rows = q;
  if (q.positions) {
    int32_t* pos = at_least(sc.q_positions, group).data();
    std::fill_n(pos, group, q.positions[0]);
    rows.positions = pos;
  }
  cpu::specache_scores_fast(queries(rows), lowbit, sc, ws.fast, scores);
  specache_select_scored(scores, group, n, k, ws, tokens, avg_probs);
}

// SpeCache's decode step in one pass: attend_specache, handing out the low-bit scores it takes
// on the way (the bits specache_select scores with, so its selection from them is the same).
void attend_specache_scored(const QueryRows& q, const cpu::KiviHeadStore& lowbit,
                            const cpu::SpeCacheFetched& fetched, Workspace& ws, float* out,
                            float* scores, float* fetched_share) {
  cpu::specache_attend_fast(queries(q), lowbit, fetched, ws.specache, ws.fast, out, scores,
                            fetched_share);
}
// --- SmallKV ------------------------------------------------------------------------------------
// The proxy's softmax (the reference's cpu::smallkv_softmax_rows, faster): scores by the f16
// attention kernel's own score pass (fast::f16_scores: keys read as f16, each row's scores those
// of attend_f16, independent of the other rows), exp vectorized (fast::exp_f32), the
// normalization in double in token order. Same bits on every target; differs from the reference
// (double softmax, portable exp) only by the scores' and exp's rounding.
void smallkv_softmax(const QueryRows& q, const uint16_t* k, const int32_t* positions, size_t n,
                     Workspace& ws, float* out) {
  if (n == 0) return;
  cpu::fast::f16_scores(queries(q), k, positions, n, ws.fast, out, n);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < q.n_rows; ++r) {
    float* s = out + r * n;
    float mx = neg_inf;  // (tokens in the row's future are -inf already)
    for (size_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
    if (mx == neg_inf) {  // nothing visible to this row
      std::fill_n(s, n, 0.0f);
      continue;
    }
    for (size_t t = 0; t < n; ++t) s[t] -= mx;
    cpu::fast::exp_f32(s, n, s);  // -inf -> 0
    double z = 0;
    for (size_t t = 0; t < n; ++t) z += s[t];
    for (size_t t = 0; t < n; ++t) s[t] = float(double(s[t]) / z);
  }
}

// Eq. 6's marginal term (cpu::smallkv_add_marginal) over the value-only rows converted by F16C.
void smallkv_add_marginal(const QueryRows& q, const SmallKvMarginal& m, Workspace& ws,
                          float* out) {
  float* vm = at_least(ws.attention.v_chunk, m.n_tokens * q.dim).data();
  f16_to_f32_array(m.v, vm, m.n_tokens * q.dim);
  cpu::smallkv_add_marginal(q.positions, q.n_rows, q.dim, vm, m.positions, m.n_tokens, m.weights,
                            m.weights_stride, out);
}

// Eq. 6 with the full rows read as f16 by the SIMD kernel `full` runs (fast::attend_f16), then
// the marginal term.
void attend_smallkv(const QueryRows& q, const F16Rows& full, const SmallKvMarginal& m,
                    Workspace& ws, float* out) {
  cpu::fast::attend_f16(queries(q), full.k, full.v, full.positions, full.n_tokens, ws.fast, out);
  if (m.n_tokens > 0) smallkv_add_marginal(q, m, ws, out);
}
// --- end SmallKV --------------------------------------------------------------------------------

void attend_kivi_tier(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                      Workspace& ws, float* out) {
  attend_kivi(q, cpu::kivi_store_from_tier(tier, residual, q.dim), ws, out);
}

// SpeCache over raw buffers: the copy and the fetched rows rebuilt on the host (fetched.positions
// unused: the rows take their tokens' positions in the copy), then this table's attend_specache.
void attend_specache_tier(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                          const F16Rows& fetched, const uint32_t* fetched_tokens, Workspace& ws,
                          float* out) {
  const cpu::KiviHeadStore copy = cpu::kivi_store_from_tier(tier, residual, q.dim);
  attend_specache(q, copy,
                  cpu::specache_fetched_from_rows(fetched, fetched_tokens, copy.size(), q.dim), ws,
                  out);
}

// The fused KIVI kernel's scores over the rebuilt copy: the bits this table's specache_select
// ranks (specache_scores_fast), not the reference's.
void specache_scores_tier(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                          Workspace& ws, float* scores) {
  const cpu::KiviHeadStore copy = cpu::kivi_store_from_tier(tier, residual, q.dim);
  if (copy.size() == 0 || q.n_rows == 0) return;  // no score to write
  cpu::specache_scores_fast(queries(q), copy, ws.specache, ws.fast, scores);
}

// --- split-K: the fused kernels over one token range (fast_attention.h) --------------------------
void attend_f16_range(const QueryRows& q, const F16Rows& r, size_t first, size_t count,
                      Workspace& ws, const PartialState& out) {
  require_token_range("attend_f16_range", first, count, r.n_tokens);
  cpu::fast::attend_f16_partial(queries(q), r.k, r.v, r.positions, first, count, ws.fast, out);
}

void attend_kivi_range(const QueryRows& q, const cpu::KiviHeadStore& s, size_t first,
                       size_t count, Workspace& ws, const PartialState& out) {
  cpu::fast::attend_kivi_partial(queries(q), s, first, count, ws.fast, out);
}

Ops make_optimized() {
  Ops ops = cpu_reference();
  ops.name = "cpu-optimized";
  ops.f16_to_f32 = f16_to_f32;
  ops.attend_f16 = attend_f16;
  ops.attend_kivi = attend_kivi;
  ops.column_sums = column_sums;
  ops.attend_spindle = attend_spindle;
  ops.attend_minicache = attend_minicache;
  ops.attend_minicache_kivi = attend_minicache_kivi;
  ops.attend_specache = attend_specache;
  ops.specache_select = specache_select;
  ops.attend_specache_scored = attend_specache_scored;
  ops.specache_select_scored = specache_select_scored;
  ops.smallkv_softmax = smallkv_softmax;  // SmallKV
  ops.attend_smallkv = attend_smallkv;
  ops.smallkv_add_marginal = smallkv_add_marginal;
  ops.attend_kivi_tier = attend_kivi_tier;
  ops.attend_f16_range = attend_f16_range;  // split-K
  ops.attend_kivi_range = attend_kivi_range;
  ops.merge_partials = cpu::fast::merge_partials;
  ops.attend_specache_tier = attend_specache_tier;
  ops.specache_scores_tier = specache_scores_tier;
  return ops;
}

}  // namespace

const Ops& cpu_optimized() {
  static const Ops ops = make_optimized();
  return ops;
}

}  // namespace kvsdk::backend
