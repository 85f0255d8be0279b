// The CPU reference backend: today's scalar kernels behind the backend seam (backend_ops.h).
// This table is the oracle: tests/backends/backend_ops_test.cpp runs every op of every other
// backend against it. Its kernels are written for clarity and for the same bits on every
// platform, not for speed.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "attention.h"
#include "attention_scores.h"
#include "backend_ops.h"
#include "cpu_workspace.h"
#include "kivi_attention.h"
#include "kivi_quant.h"
#include "kivi_tier.h"
#include "minicache_kivi.h"
#include "minicache_merge.h"
#include "policy/importance.h"
#include "policy/selection.h"
#include "smallkv.h"
#include "specache.h"
#include "spindlekv_store.h"
#include "util/error.h"
#include "util/half.h"
#include "util/growth.h"
#include "util/half_array.h"

namespace kvsdk::backend {
namespace {

void* host_alloc(size_t bytes) { return std::malloc(bytes ? bytes : 1); }
void host_free(void* p) { std::free(p); }
void host_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
Workspace* workspace_create() { return new (std::nothrow) Workspace(); }
void workspace_destroy(Workspace* ws) { delete ws; }

void f32_to_f16(const float* src, size_t n, uint16_t* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = kvsdk::f32_to_f16(src[i]);
}
void f16_to_f32(const uint16_t* src, size_t n, float* dst) {
  f16_to_f32_array_scalar(src, dst, n);
}

// Runs `feed(attention)` over an OnlineAttention on the workspace's scratch and writes out.
template <class Feed>
void online(const QueryRows& q, Workspace& ws, float* out, Feed&& feed) {
  cpu::OnlineAttention att(q.q, q.positions, q.n_rows, q.dim, q.scale, ws.attention);
  feed(att);
  att.finish(out);
}

// Feeds dense f16 rows to `att` in chunks of kReferenceChunk tokens converted to f32.
void add_f16_rows(cpu::OnlineAttention& att, const F16Rows& r, size_t dim, Workspace& ws) {
  const size_t chunk = std::min(kReferenceChunk, r.n_tokens) * dim;
  if (ws.attention.k_chunk.size() < chunk) ws.attention.k_chunk.resize(chunk);
  if (ws.attention.v_chunk.size() < chunk) ws.attention.v_chunk.resize(chunk);
  for (size_t t0 = 0; t0 < r.n_tokens; t0 += kReferenceChunk) {
    const size_t n = std::min(kReferenceChunk, r.n_tokens - t0);
    f16_to_f32_array_scalar(r.k + t0 * dim, ws.attention.k_chunk.data(), n * dim);
    f16_to_f32_array_scalar(r.v + t0 * dim, ws.attention.v_chunk.data(), n * dim);
    att.add_chunk(ws.attention.k_chunk.data(), ws.attention.v_chunk.data(), r.positions + t0, n);
  }
}

void attend_f16(const QueryRows& q, const F16Rows& r, Workspace& ws, float* out) {
  online(q, ws, out, [&](cpu::OnlineAttention& att) { add_f16_rows(att, r, q.dim, ws); });
}

void attend_kivi(const QueryRows& q, const cpu::KiviHeadStore& s, Workspace& ws, float* out) {
  online(q, ws, out, [&](cpu::OnlineAttention& att) { cpu::kivi_attend(s, att, ws.attention); });
}

void attend_spindle(const QueryRows& q, const cpu::SpindleHeadStore& s, Workspace& ws,
                    float* out) {
  online(q, ws, out, [&](cpu::OnlineAttention& att) {
    cpu::spindlekv_attend(s, att, ws.attention.k_chunk, ws.attention.v_chunk);
  });
}

void attend_minicache(const QueryRows& q, const cpu::MiniCacheHeadPair& p, int layer,
                      const F16Rows& pending, Workspace& ws, float* out) {
  online(q, ws, out, [&](cpu::OnlineAttention& att) {
    cpu::minicache_attend(p, layer, att, ws.attention.k_chunk, ws.attention.v_chunk);
    add_f16_rows(att, pending, q.dim, ws);
  });
}

void attend_minicache_kivi(const QueryRows& q, const cpu::MiniCacheKiviPair& p, int layer,
                           const F16Rows& pending, Workspace& ws, float* out) {
  online(q, ws, out, [&](cpu::OnlineAttention& att) {
    cpu::minicache_kivi_attend(p, layer, att, ws.attention.k_chunk, ws.attention.v_chunk,
                               ws.minicache);
    add_f16_rows(att, pending, q.dim, ws);
  });
}

void attend_specache(const QueryRows& q, const cpu::KiviHeadStore& lowbit,
                     const cpu::SpeCacheFetched& fetched, Workspace& ws, float* out) {
  online(q, ws, out, [&](cpu::OnlineAttention& att) {
    cpu::specache_attend(lowbit, fetched, att, ws.attention.k_chunk, ws.attention.v_chunk);
  });
}

void column_sums(const QueryRows& q, const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                 size_t n_keys, Workspace&, float* col_sums) {
  cpu::attention_column_sums_reference(q.q, q.positions, q.n_rows, q.dim, q.scale, keys, key_pos,
                                       n_keys, col_sums);
}

void select_keep(size_t n, size_t k, size_t sinks, size_t recent, const float* scores,
                 Workspace& ws, std::vector<uint32_t>& keep) {
  policy::select_keep(n, k, sinks, recent, scores, keep, ws.select_mid);
}

void gather_rows(const void* src, size_t row_bytes, const uint32_t* rows, size_t n, void* dst) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  // memmove: compaction in place reads row rows[i] >= i after writing rows < i.
  for (size_t i = 0; i < n; ++i) std::memmove(d + i * row_bytes, s + rows[i] * row_bytes, row_bytes);
}

// One f16 row times a magnitude: SpindleKV's reconstruction (Eq. 14) and MiniCache's restore.
void restore_f16_row(const uint16_t* row, float magnitude, size_t dim, float* out) {
  for (size_t d = 0; d < dim; ++d) out[d] = kvsdk::f16_to_f32(row[d]) * magnitude;
}

void codebook_reconstruct(const uint16_t* entries, const uint32_t* index, const float* magnitude,
                          size_t count, size_t dim, float* out) {
  for (size_t i = 0; i < count; ++i) {
    restore_f16_row(entries + size_t(index[i]) * dim, magnitude[i], dim, out + i * dim);
  }
}

void restore_row(const uint16_t* direction, float magnitude, size_t dim, float* out) {
  restore_f16_row(direction, magnitude, dim, out);
}

void specache_select(const QueryRows& q, const cpu::KiviHeadStore& lowbit, size_t k,
                     Workspace& ws, std::vector<uint32_t>& tokens,
                     std::vector<float>* avg_probs) {
  cpu::specache_select(lowbit, q.q, q.n_rows, q.positions ? q.positions[0] : INT32_MAX, q.scale,
                       k, ws.specache, tokens, avg_probs);
}

void attend_specache_scored(const QueryRows& q, const cpu::KiviHeadStore& lowbit,
                            const cpu::SpeCacheFetched& fetched, Workspace& ws, float* out,
                            float* scores, float* fetched_share) {
  const size_t n = lowbit.size();
  online(q, ws, out, [&](cpu::OnlineAttention& att) {
    cpu::specache_attend(lowbit, fetched, att, ws.attention.k_chunk, ws.attention.v_chunk,
                         [&](const float* k, size_t first, size_t c) {
                           cpu::specache_score_chunk(q.q, q.positions, q.n_rows, k,
                                                     lowbit.positions().data() + first, c,
                                                     q.dim, q.scale, scores + first, n);
                         });
  });
  if (fetched_share) {
    cpu::specache_fetched_shares(scores, q.n_rows, n, fetched.tokens, fetched_share);
  }
}

void specache_select_scored(float* scores, size_t group, size_t n, size_t k, Workspace& ws,
                            std::vector<uint32_t>& tokens, std::vector<float>* avg_probs) {
  cpu::specache_select_from_scores(scores, group, n, k, ws.specache, tokens, avg_probs);
}
// --- SmallKV: today's scalar kernels (smallkv.h), bit for bit -----------------------------------
void smallkv_softmax(const QueryRows& q, const uint16_t* k, const int32_t* positions, size_t n,
                     Workspace& ws, float* out) {
  float* kf = at_least(ws.attention.k_chunk, n * q.dim).data();
  f16_to_f32_array_scalar(k, kf, n * q.dim);
  cpu::smallkv_softmax_rows(q.q, q.positions, q.n_rows, kf, positions, n, q.dim, q.scale, out);
}

void smallkv_add_marginal(const QueryRows& q, const SmallKvMarginal& m, Workspace& ws,
                          float* out) {
  float* vm = at_least(ws.attention.v_chunk, m.n_tokens * q.dim).data();
  f16_to_f32_array_scalar(m.v, vm, m.n_tokens * q.dim);
  cpu::smallkv_add_marginal(q.positions, q.n_rows, q.dim, vm, m.positions, m.n_tokens, m.weights,
                            m.weights_stride, out);
}

// The full rows in one chunk (one OnlineAttention pass, as smallkv_attend has always run).
void attend_smallkv(const QueryRows& q, const F16Rows& full, const SmallKvMarginal& m,
                    Workspace& ws, float* out) {
  const size_t dim = q.dim, nf = full.n_tokens;
  float* kf = at_least(ws.attention.k_chunk, nf * dim).data();
  float* vf = at_least(ws.attention.v_chunk, nf * dim).data();
  f16_to_f32_array_scalar(full.k, kf, nf * dim);
  f16_to_f32_array_scalar(full.v, vf, nf * dim);
  cpu::OnlineAttention att(q.q, q.positions, q.n_rows, dim, q.scale, ws.attention);
  att.add_chunk(kf, vf, full.positions, nf);
  att.finish(out);
  // (With no marginal rows this would only multiply every output by 1.)
  if (m.n_tokens > 0) smallkv_add_marginal(q, m, ws, out);
}
// --- end SmallKV --------------------------------------------------------------------------------

void attend_kivi_tier(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                      Workspace& ws, float* out) {
  attend_kivi(q, cpu::kivi_store_from_tier(tier, residual, q.dim), ws, out);
}

// MiniCache over raw buffers: one layer's buffers rebuilt into a pair on the host (as both of its
// layers: the other one is not there), then attend_minicache of layer 0.
cpu::MergedLayerPair minicache_tensor(const MiniCacheTensor& t, size_t tokens, size_t dim) {
  cpu::MergedLayerPair::Buffers b;
  b.threshold_set = tokens > 0;  // (not read by attention)
  b.slots.assign(t.slots, t.slots + tokens);
  b.directions.assign(t.directions, t.directions + t.merged * dim);
  b.magnitudes_prev.assign(t.magnitudes, t.magnitudes + t.merged);
  b.magnitudes_cur = b.magnitudes_prev;
  b.retained_prev.assign(t.retained, t.retained + t.retained_rows * dim);
  b.retained_cur = b.retained_prev;
  return cpu::MergedLayerPair::restore(dim, cpu::MiniCacheConfig{}, std::move(b));
}

void attend_minicache_tier(const QueryRows& q, const MiniCacheTier& tier, const F16Rows& pending,
                           Workspace& ws, float* out) {
  cpu::MiniCacheHeadPair pair(q.dim, cpu::MiniCacheConfig{});
  pair.keys = minicache_tensor(tier.k, tier.tokens, q.dim);
  pair.values = minicache_tensor(tier.v, tier.tokens, q.dim);
  pair.positions.assign(tier.positions, tier.positions + tier.tokens);
  attend_minicache(q, pair, 0, pending, ws, out);
}

// SpeCache over raw buffers: the copy and the fetched rows rebuilt on the host (fetched.positions
// unused: the rows take their tokens' positions in the copy), then attend_specache.
void attend_specache_tier(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                          const F16Rows& fetched, const uint32_t* fetched_tokens, Workspace& ws,
                          float* out) {
  const cpu::KiviHeadStore copy = cpu::kivi_store_from_tier(tier, residual, q.dim);
  attend_specache(q, copy,
                  cpu::specache_fetched_from_rows(fetched, fetched_tokens, copy.size(), q.dim), ws,
                  out);
}

// specache_select's scoring (cpu::specache_scores) for every row at its own position.
void specache_scores_tier(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                          Workspace& ws, float* scores) {
  cpu::specache_scores(cpu::kivi_store_from_tier(tier, residual, q.dim), q.q, q.positions,
                       q.n_rows, q.scale, ws.specache.k_chunk, scores);
}

// --- split-K --------------------------------------------------------------------------------------
// An OnlineAttention over the range's rows, handing out its unnormalised state.
template <class Feed>
void online_state(const QueryRows& q, Workspace& ws, const PartialState& out, Feed&& feed) {
  cpu::OnlineAttention att(q.q, q.positions, q.n_rows, q.dim, q.scale, ws.attention);
  feed(att);
  att.state(out.max, out.sum, out.acc);
}

void attend_f16_range(const QueryRows& q, const F16Rows& r, size_t first, size_t count,
                      Workspace& ws, const PartialState& out) {
  require_token_range("attend_f16_range", first, count, r.n_tokens);
  const F16Rows range{r.k + first * q.dim, r.v + first * q.dim, r.positions + first, count};
  online_state(q, ws, out, [&](cpu::OnlineAttention& att) { add_f16_rows(att, range, q.dim, ws); });
}

void attend_kivi_range(const QueryRows& q, const cpu::KiviHeadStore& s, size_t first,
                       size_t count, Workspace& ws, const PartialState& out) {
  require_token_range("attend_kivi_range", first, count, s.size());
  online_state(q, ws, out, [&](cpu::OnlineAttention& att) {
    cpu::kivi_attend_range(s, first, count, att, ws.attention);
  });
}

Ops make_reference() {
  Ops ops = {
      "cpu-reference", /*device_memory=*/false,
      host_alloc, host_free, host_copy, host_copy, host_copy, workspace_create, workspace_destroy,
      f32_to_f16, f16_to_f32,
      cpu::kivi_quantize_keys, cpu::kivi_dequantize_keys, cpu::kivi_quantize_values,
      cpu::kivi_dequantize_values,
      attend_f16, attend_kivi, attend_spindle, attend_minicache, attend_minicache_kivi,
      attend_specache,
      column_sums, policy::pool_scores, select_keep, gather_rows,
      codebook_reconstruct, cpu::minicache_slerp, restore_row,
      specache_select,
      attend_specache_scored, specache_select_scored,
      smallkv_softmax, attend_smallkv, smallkv_add_marginal,  // SmallKV
      attend_kivi_tier,
  };
  ops.attend_f16_range = attend_f16_range;  // split-K
  ops.attend_kivi_range = attend_kivi_range;
  ops.merge_partials = cpu::merge_attention_states;
  ops.attend_specache_tier = attend_specache_tier;
  ops.specache_scores_tier = specache_scores_tier;
  ops.attend_minicache_tier = attend_minicache_tier;
  return ops;
}

}  // namespace

const Ops& cpu_reference() {
  static const Ops ops = make_reference();
  return ops;
}

WorkspaceHandle::WorkspaceHandle(const Ops& ops) : ops_(&ops), ws_(ops.workspace_create()) {
  if (!ws_) fail(KVSDK_E_NO_MEMORY, ops.name, ": no memory for a workspace");
}

WorkspaceHandle& WorkspaceHandle::operator=(WorkspaceHandle&& o) noexcept {
  if (this != &o) {
    reset();
    ops_ = o.ops_;
    ws_ = o.ws_;
    o.ws_ = nullptr;
  }
  return *this;
}

void WorkspaceHandle::reset() noexcept {
  if (ws_) ops_->workspace_destroy(ws_);
  ws_ = nullptr;
}

}  // namespace kvsdk::backend
