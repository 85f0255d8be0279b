#include "repr/device_rows.h"

#include <algorithm>

#include "core/method_traits.h"
#include "core/policy.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

DeviceRows::DeviceRows(const Geometry& g, const kvsdk_policy& p, Context& ctx)
    : Representation(g, p),
      ctx_(ctx),
      device_(ctx.ops()),
      arena_(static_cast<char*>(ctx.arena())),
      arena_bytes_(ctx.budget()),
      capacity_(g.n_layers, 0),
      tokens_(g.n_layers, 0),
      positions_(g.n_layers, std::vector<std::vector<int32_t>>(g.n_kv_heads)),
      staged_(g.n_layers, std::vector<ExactStore>(g.n_kv_heads)),
      present_(g.n_layers, std::vector<char>(g.n_kv_heads, 0)) {
  if (!method_traits(p).on_device || kivi_overlay(p)) {
    fail(KVSDK_E_UNSUPPORTED, "policy '", policy_spec(p), "' does not run on ", device_.name,
         " in this version (only 'full' does: docs/gpu.md)");
  }
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    fail(KVSDK_E_UNSUPPORTED, "a ", device_.name, " cache needs head_dim 64, 128 or 256 (the ",
         "device attention kernel's), not ", g.head_dim);
  }
  if (!arena_ || !ctx.claim_arena()) {
    fail(KVSDK_E_UNSUPPORTED, "a ", device_.name, " context holds one cache at a time in this ",
         "version (its device arena is in use); destroy the other cache first");
  }
  layout_ = layout_for(capacity_);
  scratch_.ops = &device_;
}

DeviceRows::~DeviceRows() { ctx_.release_arena(); }

cuda::ArenaPartition DeviceRows::layout_for(const std::vector<uint64_t>& capacity) const {
  const uint32_t heads = geometry_.n_kv_heads;
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  cuda::ArenaPartition p;
  p.tiers = size_t(heads) * kParts;
  p.slices.resize(capacity.size() * p.tiers);
  uint64_t offset = 0;
  for (size_t l = 0; l < capacity.size(); ++l) {  // keys and values first: 16-byte multiples
    for (uint32_t h = 0; h < heads; ++h) {
      for (Part part : {kKeys, kValues}) {
        p.slices[l * p.tiers + h * kParts + part] = {offset, capacity[l] * row};
        offset += capacity[l] * row;
      }
    }
  }
  for (size_t l = 0; l < capacity.size(); ++l) {  // then the positions
    for (uint32_t h = 0; h < heads; ++h) {
      p.slices[l * p.tiers + h * kParts + kPositions] = {offset, capacity[l] * sizeof(int32_t)};
      offset += capacity[l] * sizeof(int32_t);
    }
  }
  p.reserved = offset;
  return p;
}

std::vector<uint64_t> DeviceRows::used_bytes() const {
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  std::vector<uint64_t> used(layout_.slices.size());
  for (size_t i = 0; i < used.size(); ++i) {
    const size_t l = i / layout_.tiers, part = i % kParts;
    used[i] = tokens_[l] * (part == kPositions ? sizeof(int32_t) : row);
  }
  return used;
}

char* DeviceRows::slice(uint32_t layer, uint32_t head, Part part) const {
  return arena_ + layout_.at(layer, size_t(head) * kParts + part).offset;
}

void DeviceRows::relayout(const std::vector<uint64_t>& capacity) {
  const Context::DeviceScope on_device(ctx_);
  const cuda::ArenaPartition next = layout_for(capacity);
  if (next.reserved > arena_bytes_) {
    fail(KVSDK_E_BUDGET, "the device arena (", arena_bytes_, " bytes) cannot hold ", next.reserved,
         " bytes of rows");
  }
  // plan_repartition moves slices in the order of their index, which must be the order of their
  // offsets: here keys/values of every layer come before the positions, so sort both layouts
  // (the same order in each).
  const std::vector<uint64_t> used = used_bytes();
  std::vector<size_t> order(used.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return layout_.slices[a].offset < layout_.slices[b].offset ||
           (layout_.slices[a].offset == layout_.slices[b].offset && a < b);
  });
  cuda::ArenaPartition from, to;
  from.tiers = to.tiers = 1;
  std::vector<uint64_t> used_sorted;
  for (size_t i : order) {
    from.slices.push_back(layout_.slices[i]);
    to.slices.push_back(next.slices[i]);
    used_sorted.push_back(used[i]);
  }
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(from, to, used_sorted)) {
    device_.copy(arena_ + c.dst, arena_ + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

void DeviceRows::reserve_rows(uint32_t layer, uint64_t rows) {
  if (rows <= capacity_[layer]) return;
  std::vector<uint64_t> capacity = capacity_;
  capacity[layer] = grown_capacity(size_t(capacity_[layer]), size_t(rows));
  if (layout_for(capacity).reserved > arena_bytes_) {
    // Growth by half does not fit: every layer exactly what it holds, this one what it needs.
    capacity = tokens_;
    capacity[layer] = rows;
  }
  relayout(capacity);
}

void DeviceRows::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  const uint64_t rows = tokens_[layer] * geometry_.n_kv_heads;
  by_tier[KVSDK_TIER_EXACT] += rows * ExactStore::kv_bytes_per_token(geometry_.head_dim);
  by_tier[KVSDK_TIER_METADATA] += rows * ExactStore::meta_bytes_per_token();
}

uint64_t DeviceRows::append_bound(uint32_t, size_t n_tokens) const {
  return uint64_t(n_tokens) * geometry_.n_kv_heads *
         ExactStore::bytes_per_token(geometry_.head_dim);
}

void DeviceRows::append(uint32_t layer, size_t n, const float* k, const float* v,
                        const int32_t* positions) {
  append_rows(layer, n, KVSDK_DTYPE_F32, k, v, positions);
}

void DeviceRows::append_host(uint32_t layer, size_t n, const void* k, const void* v,
                             const int32_t* positions) {
  append_rows(layer, n, geometry_.dtype, k, v, positions);
}

void DeviceRows::append_rows(uint32_t layer, size_t n, kvsdk_dtype dtype, const void* k,
                             const void* v, const int32_t* positions) {
  if (n == 0) return;
  const Context::DeviceScope on_device(ctx_);
  const uint32_t dim = geometry_.head_dim, heads = geometry_.n_kv_heads;
  const size_t row = geometry_.kv_elems_per_token();
  // Everything that can fail before the store changes: host staging and mirrors, then the
  // arena's room (a re-plan only moves rows).
  reserve_for_growth(stage_k_, n * dim);
  reserve_for_growth(stage_v_, n * dim);
  for (std::vector<int32_t>& p : positions_[layer]) reserve_for_growth(p, tokens_[layer] + n);
  reserve_rows(layer, tokens_[layer] + n);
  stage_k_.resize(n * dim);
  stage_v_.resize(n * dim);
  const size_t old = size_t(tokens_[layer]);
  const backend::Ops& host = backend::cpu_optimized();  // the same rounding as ExactRows
  for (uint32_t h = 0; h < heads; ++h) {
    for (size_t t = 0; t < n; ++t) {
      const size_t at = t * row + size_t(h) * dim;
      if (dtype == KVSDK_DTYPE_F32) {
        host.f32_to_f16(static_cast<const float*>(k) + at, dim, stage_k_.data() + t * dim);
        host.f32_to_f16(static_cast<const float*>(v) + at, dim, stage_v_.data() + t * dim);
      } else {
        load_f16(dtype, k, at, dim, stage_k_.data() + t * dim);
        load_f16(dtype, v, at, dim, stage_v_.data() + t * dim);
      }
    }
    const size_t row_bytes = dim * sizeof(uint16_t);
    device_.to_backend(slice(layer, h, kKeys) + old * row_bytes, stage_k_.data(), n * row_bytes);
    device_.to_backend(slice(layer, h, kValues) + old * row_bytes, stage_v_.data(),
                       n * row_bytes);
    device_.to_backend(slice(layer, h, kPositions) + old * sizeof(int32_t), positions,
                       n * sizeof(int32_t));
  }
  // (A device failure above leaves the rows beyond tokens_ unused: the store is unchanged.)
  for (std::vector<int32_t>& p : positions_[layer]) p.insert(p.end(), positions, positions + n);
  tokens_[layer] += n;
  release_host_staging();
}

void DeviceRows::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows, float* out) const {
  const Context::DeviceScope on_device(ctx_);
  const size_t dim = geometry_.head_dim;
  const size_t q_bytes = n_rows * dim * sizeof(float), pos_bytes = n_rows * sizeof(int32_t);
  const size_t need = 2 * q_bytes + pos_bytes;  // queries, outputs, positions (16-byte aligned)
  if (need > scratch_.bytes) {
    void* grown = device_.alloc(need);
    if (!grown) fail(KVSDK_E_NO_MEMORY, device_.name, ": no device memory for attention scratch");
    if (scratch_.buffer) device_.free(scratch_.buffer);
    scratch_.buffer = grown;
    scratch_.bytes = need;
  }
  char* base = static_cast<char*>(scratch_.buffer);
  float* dq = reinterpret_cast<float*>(base);
  float* dout = reinterpret_cast<float*>(base + q_bytes);
  int32_t* dpos = reinterpret_cast<int32_t*>(base + 2 * q_bytes);
  device_.to_backend(dq, q_rows, q_bytes);
  device_.to_backend(dpos, row_positions, pos_bytes);
  backend::QueryRows q = query_rows(dq, dpos, n_rows);
  q.group = geometry_.group_size();
  const backend::F16Rows rows{reinterpret_cast<const uint16_t*>(slice(layer, kv_head, kKeys)),
                              reinterpret_cast<const uint16_t*>(slice(layer, kv_head, kValues)),
                              reinterpret_cast<const int32_t*>(slice(layer, kv_head, kPositions)),
                              size_t(tokens_[layer])};
  device_.attend_f16(q, rows, workspace(), dout);
  device_.to_host(out, dout, q_bytes);
}

void DeviceRows::stage_head(uint32_t layer, uint32_t kv_head, ExactStore& into) const {
  const Context::DeviceScope on_device(ctx_);
  const size_t n = size_t(tokens_[layer]), elems = n * geometry_.head_dim;
  into.positions.assign(positions_[layer][kv_head].begin(), positions_[layer][kv_head].end());
  into.k.resize(elems);
  into.v.resize(elems);
  device_.to_host(into.k.data(), slice(layer, kv_head, kKeys), elems * sizeof(uint16_t));
  device_.to_host(into.v.data(), slice(layer, kv_head, kValues), elems * sizeof(uint16_t));
}

const ExactStore* DeviceRows::exact_rows(uint32_t layer, uint32_t kv_head) const {
  std::lock_guard<std::mutex> lock(staged_lock_);
  ExactStore& s = staged_[layer][kv_head];
  if (!present_[layer][kv_head]) {
    stage_head(layer, kv_head, s);
    present_[layer][kv_head] = 1;
  }
  return &s;
}

void DeviceRows::release_host_staging() const noexcept {
  std::lock_guard<std::mutex> lock(staged_lock_);
  for (size_t l = 0; l < staged_.size(); ++l) {
    for (size_t h = 0; h < staged_[l].size(); ++h) {
      if (!present_[l][h]) continue;
      staged_[l][h] = ExactStore{};  // frees the copy
      present_[l][h] = 0;
    }
  }
}

void DeviceRows::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                      int32_t* positions) const {
  const ExactStore& s = read_stage_;
  stage_head(layer, kv_head, read_stage_);
  const size_t elems = s.size() * geometry_.head_dim;
  if (k) load_f32(KVSDK_DTYPE_F16, s.k.data(), 0, elems, k);
  if (v) load_f32(KVSDK_DTYPE_F16, s.v.data(), 0, elems, v);
  if (positions) std::copy_n(s.positions.data(), s.size(), positions);
}

void DeviceRows::read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                           int32_t* positions) const {
  const ExactStore& s = read_stage_;
  stage_head(layer, kv_head, read_stage_);
  const size_t elems = s.size() * geometry_.head_dim;
  if (k) store_f16(geometry_.dtype, s.k.data(), elems, k, 0);
  if (v) store_f16(geometry_.dtype, s.v.data(), elems, v, 0);
  if (positions) std::copy_n(s.positions.data(), s.size(), positions);
}

void DeviceRows::restore_exact(uint32_t layer, std::vector<ExactStore> heads) {
  const Context::DeviceScope on_device(ctx_);
  if (heads.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_INTERNAL, "restore: layer ", layer, " with ", heads.size(), " heads");
  }
  const size_t n = heads[0].size(), dim = geometry_.head_dim;
  for (const ExactStore& h : heads) {
    if (h.size() != n) {
      fail(KVSDK_E_UNSUPPORTED, "layer ", layer, " holds a different number of rows per KV head; ",
           "a ", device_.name, " cache holds the same rows in every head");
    }
  }
  KVSDK_REQUIRE(tokens_[layer] == 0, "restore into a layer that holds rows");
  std::vector<std::vector<int32_t>> mirror(heads.size());
  for (size_t h = 0; h < heads.size(); ++h) mirror[h].assign(heads[h].positions.begin(), heads[h].positions.end());
  reserve_rows(layer, n);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    device_.to_backend(slice(layer, h, kKeys), heads[h].k.data(), n * dim * sizeof(uint16_t));
    device_.to_backend(slice(layer, h, kValues), heads[h].v.data(), n * dim * sizeof(uint16_t));
    device_.to_backend(slice(layer, h, kPositions), heads[h].positions.data(), n * sizeof(int32_t));
  }
  positions_[layer] = std::move(mirror);
  tokens_[layer] = n;
  release_host_staging();
}

void DeviceRows::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  if (!records.empty()) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has compressed-tier records, but policy '",
         policy_spec(policy_), "' keeps it exact");
  }
}

std::string DeviceRows::truncate_refusal(uint32_t layer, int32_t position) const {
  for (const std::vector<int32_t>& p : positions_[layer]) {
    const auto first = std::find_if(p.begin(), p.end(), [&](int32_t x) { return x >= position; });
    if (std::any_of(first, p.end(), [&](int32_t x) { return x < position; })) {
      return "a device cache truncates only its newest rows, and layer " + std::to_string(layer) +
             " holds rows at positions below " + std::to_string(position) + " after some above";
    }
  }
  return {};
}

void DeviceRows::truncate(uint32_t layer, int32_t position) noexcept {
  // A suffix (truncate_refusal), the same length in every head: only the count changes.
  const std::vector<int32_t>& p0 = positions_[layer][0];
  const size_t keep = size_t(std::find_if(p0.begin(), p0.end(),
                                          [&](int32_t x) { return x >= position; }) - p0.begin());
  for (std::vector<int32_t>& p : positions_[layer]) p.resize(std::min(keep, p.size()));
  tokens_[layer] = keep;
  release_host_staging();
}

}  // namespace kvsdk
