#include "repr/exact_rows.h"

#include <algorithm>

#include "attention.h"
#include "core/policy.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

ExactRows::ExactRows(const Geometry& g, const kvsdk_policy& p)
    : Representation(g, p),
      heads_(g.n_layers, std::vector<ExactStore>(g.n_kv_heads)),
      plans_(g.n_layers) {}

void ExactRows::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (const ExactStore& h : heads_[layer]) {
    by_tier[KVSDK_TIER_EXACT] += h.size() * ExactStore::kv_bytes_per_token(geometry_.head_dim);
    by_tier[KVSDK_TIER_METADATA] += h.size() * ExactStore::meta_bytes_per_token();
  }
}

uint64_t ExactRows::append_bound(uint32_t, size_t n_tokens) const {
  return uint64_t(n_tokens) * geometry_.n_kv_heads *
         ExactStore::bytes_per_token(geometry_.head_dim);
}

void ExactRows::append(uint32_t layer, size_t n, const float* k, const float* v,
                       const int32_t* positions) {
  append_rows(layer, n, KVSDK_DTYPE_F32, k, v, positions);
}

void ExactRows::append_host(uint32_t layer, size_t n, const void* k, const void* v,
                            const int32_t* positions) {
  append_rows(layer, n, geometry_.dtype, k, v, positions);  // the host's bits, rounded once
}

void ExactRows::append_rows(uint32_t layer, size_t n, kvsdk_dtype dtype, const void* k,
                            const void* v, const int32_t* positions) {
  const uint32_t dim = geometry_.head_dim;
  std::vector<ExactStore>& L = heads_[layer];
  // Reserve first (util/growth.h) so the copy below cannot fail half-way.
  for (ExactStore& h : L) {
    reserve_for_growth(h.positions, h.size() + n);
    reserve_for_growth(h.k, (h.size() + n) * dim);
    reserve_for_growth(h.v, (h.size() + n) * dim);
  }
  const size_t row = geometry_.kv_elems_per_token();
  for (uint32_t head = 0; head < geometry_.n_kv_heads; ++head) {
    ExactStore& h = L[head];
    const size_t old = h.size();
    h.positions.insert(h.positions.end(), positions, positions + n);
    h.k.resize((old + n) * dim);
    h.v.resize((old + n) * dim);
    for (size_t t = 0; t < n; ++t) {
      uint16_t* kd = h.k.data() + (old + t) * dim;
      uint16_t* vd = h.v.data() + (old + t) * dim;
      const size_t at = t * row + head * dim;
      if (dtype == KVSDK_DTYPE_F32) {
        // The common case (an engine's f32 rows) converts through the backend's op, so the
        // optimized backend rounds with F16C; both round to nearest even, bit for bit.
        ops().f32_to_f16(static_cast<const float*>(k) + at, dim, kd);
        ops().f32_to_f16(static_cast<const float*>(v) + at, dim, vd);
      } else {
        load_f16(dtype, k, at, dim, kd);  // f16: a copy; bf16: the rare path, scalar
        load_f16(dtype, v, at, dim, vd);
      }
    }
  }
}

void ExactRows::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                       const int32_t* row_positions, size_t n_rows, float* out) const {
  const ExactStore& s = heads_[layer][kv_head];
  const backend::F16Rows rows{s.k.data(), s.v.data(), s.positions.data(), s.size()};
  ops().attend_f16(query_rows(q_rows, row_positions, n_rows), rows, workspace(), out);
}

void ExactRows::attend_range(uint32_t layer, uint32_t kv_head, const float* q_rows,
                             const int32_t* row_positions, size_t n_rows, size_t first,
                             size_t count, const backend::PartialState& out) const {
  const ExactStore& s = heads_[layer][kv_head];
  const backend::F16Rows rows{s.k.data(), s.v.data(), s.positions.data(), s.size()};
  ops().attend_f16_range(query_rows(q_rows, row_positions, n_rows), rows, first, count,
                         workspace(), out);
}

size_t ExactRows::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].size();
}

void ExactRows::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                     int32_t* positions) const {
  const ExactStore& s = heads_[layer][kv_head];
  const size_t n = s.size(), dim = geometry_.head_dim;
  if (k) load_f32(KVSDK_DTYPE_F16, s.k.data(), 0, n * dim, k);
  if (v) load_f32(KVSDK_DTYPE_F16, s.v.data(), 0, n * dim, v);
  if (positions) std::copy_n(s.positions.data(), n, positions);
}

void ExactRows::read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                          int32_t* positions) const {
  const ExactStore& s = heads_[layer][kv_head];
  const size_t n = s.size(), dim = geometry_.head_dim;
  if (k) store_f16(geometry_.dtype, s.k.data(), n * dim, k, 0);
  if (v) store_f16(geometry_.dtype, s.v.data(), n * dim, v, 0);
  if (positions) std::copy_n(s.positions.data(), n, positions);
}

const int32_t* ExactRows::row_positions(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].positions.data();
}

void ExactRows::load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                          float* dst) const {
  const uint32_t dim = geometry_.head_dim;
  load_f32(KVSDK_DTYPE_F16, heads_[layer][kv_head].k.data(), first * dim, count * dim, dst);
}

uint64_t ExactRows::plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                              const IncomingRows* incoming) {
  const uint32_t dim = geometry_.head_dim;
  KeepPlan& next = plans_[layer];
  next.assign(keep, incoming, geometry_.n_kv_heads);
  uint64_t rows = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    ExactStore& s = heads_[layer][h];
    const size_t k = keep[h].size();
    rows += k;
    // Capacity only (contents unchanged), so that commit_keep() cannot allocate.
    s.positions.reserve(k);
    s.k.reserve(k * dim);
    s.v.reserve(k * dim);
  }
  next.active = true;
  return rows * ExactStore::bytes_per_token(dim);
}

void ExactRows::commit_keep() noexcept {
  const uint32_t dim = geometry_.head_dim;
  const size_t row = geometry_.kv_elems_per_token();
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    KeepPlan& plan = plans_[l];
    if (!plan.active) continue;
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      ExactStore& s = heads_[l][h];
      const std::vector<uint32_t>& keep = plan.keep[h];
      const size_t held = s.size();
      // Kept stored rows, compacted in place and in order (indices ascend, so row j is read
      // from a row >= j): the backend's gather.
      const size_t j = size_t(std::lower_bound(keep.begin(), keep.end(), uint32_t(held)) - keep.begin());
      ops().gather_rows(s.positions.data(), sizeof(int32_t), keep.data(), j, s.positions.data());
      ops().gather_rows(s.k.data(), dim * sizeof(uint16_t), keep.data(), j, s.k.data());
      ops().gather_rows(s.v.data(), dim * sizeof(uint16_t), keep.data(), j, s.v.data());
      s.positions.resize(j);
      s.k.resize(j * dim);
      s.v.resize(j * dim);
      // Then the kept incoming rows, read from the caller's buffers (capacity reserved).
      const IncomingRows& in = plan.incoming;
      for (uint32_t i : keep) {
        if (i < held || !plan.has_incoming) continue;
        const size_t t = i - held;
        s.positions.push_back(in.positions[t]);
        s.k.resize(s.k.size() + dim);
        s.v.resize(s.v.size() + dim);
        load_f16(geometry_.dtype, in.k, t * row + size_t(h) * dim, dim,
                 s.k.data() + s.k.size() - dim);
        load_f16(geometry_.dtype, in.v, t * row + size_t(h) * dim, dim,
                 s.v.data() + s.v.size() - dim);
      }
    }
    plan.active = false;
  }
}

void ExactRows::drop_keep() noexcept {
  for (KeepPlan& p : plans_) p.active = false;
}

uint64_t ExactRows::layer_token_bytes(uint64_t extra_per_row) const {
  return uint64_t(geometry_.n_kv_heads) *
         (ExactStore::bytes_per_token(geometry_.head_dim) + extra_per_row);
}

uint64_t ExactRows::layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const {
  return bytes / layer_token_bytes(extra_per_row);
}

void ExactRows::restore_exact(uint32_t layer, std::vector<ExactStore> heads) {
  if (heads.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_INTERNAL, "restore: layer ", layer, " with ", heads.size(), " heads");
  }
  heads_[layer] = std::move(heads);
}

void ExactRows::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  if (!records.empty()) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has compressed-tier records, but policy '",
         policy_spec(policy_), "' keeps it exact");
  }
}

}  // namespace kvsdk
