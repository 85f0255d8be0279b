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
      regions_(*ctx.regions()),
      queries_(ctx.ops()),
      scoring_(ctx.ops()),
      capacity_(g.n_layers, 0),
      positions_(g.n_layers, std::vector<std::vector<int32_t>>(g.n_kv_heads)),
      plans_(g.n_layers),
      staged_(g.n_layers, std::vector<ExactStore>(g.n_kv_heads)),
      present_(g.n_layers, std::vector<char>(g.n_kv_heads, 0)) {
  if (!method_traits(p).on_device || kivi_overlay(p)) {
    fail(KVSDK_E_UNSUPPORTED, "policy '", policy_spec(p), "' does not run on ", device_.name,
         " in this version (full, streaming_llm, h2o, snapkv, pyramidkv, xkv, their '+kiviN' ",
         "overlays, kivi, specache, smallkv and minicache do: docs/gpu.md)");
  }
  check_device_head_dim(device_, g.head_dim);
  layout_ = layout_for(capacity_);
  regions_.join(this);
}

DeviceRows::~DeviceRows() { regions_.leave(this); }

void DeviceRows::check_usable() const {
  if (failed_) {
    fail(KVSDK_E_BACKEND, "the ", device_.name, " device failed while this cache evicted rows; ",
         "its rows are lost (destroy the cache)");
  }
}

// --- Layout ----------------------------------------------------------------------------------

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
    const size_t l = i / layout_.tiers, h = (i % layout_.tiers) / kParts, part = i % kParts;
    used[i] = positions_[l][h].size() * (part == kPositions ? sizeof(int32_t) : row);
  }
  return used;
}

uint64_t DeviceRows::layer_rows(uint32_t layer) const {
  size_t n = 0;
  for (const std::vector<int32_t>& p : positions_[layer]) n = std::max(n, p.size());
  return n;
}

char* DeviceRows::slice(uint32_t layer, uint32_t head, Part part) const {
  return base() + layout_.at(layer, size_t(head) * kParts + part).offset;
}

void DeviceRows::relayout(const std::vector<uint64_t>& capacity) {
  const Context::DeviceScope on_device(ctx_);
  const cuda::ArenaPartition next = layout_for(capacity);
  // Room first: the region grows (other caches' regions may move or shrink to fit; throws
  // KVSDK_E_BUDGET with nothing of this store changed when the arena cannot hold it).
  regions_.grow(this, std::max(next.reserved, layout_.reserved));
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
  char* const at = base();
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(from, to, used_sorted)) {
    device_.copy(at + c.dst, at + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

void DeviceRows::reserve_rows(uint32_t layer, uint64_t rows) {
  if (rows <= capacity_[layer]) return;
  std::vector<uint64_t> capacity = capacity_;
  capacity[layer] = grown_capacity(size_t(capacity_[layer]), size_t(rows));
  const uint64_t room = regions_.room_for(this);
  if (layout_for(capacity).reserved > room) {
    // Growth by half does not fit: every layer what it holds (this one what it needs) plus an
    // equal share of the room left, the most that fits (relayout refuses when not even the
    // needs fit). Exactly the needs would re-lay the arena on every later append, each moving
    // every slice behind the growing layer's by a row, in overlapping chunks of that row (a GPU
    // run's 32k-token decode-step benchmark, one-token appends, did not finish in two minutes).
    const std::vector<uint64_t> base = [&] {
      std::vector<uint64_t> c = tight_capacity();
      c[layer] = std::max(c[layer], rows);
      return c;
    }();
    const auto with_extra = [&](uint64_t extra) {
      std::vector<uint64_t> c = base;
      for (uint64_t& x : c) x += extra;
      return c;
    };
    // (No more than growth by half would give.)
    capacity = with_extra(largest_fitting(capacity[layer] - rows, [&](uint64_t extra) {
      return layout_for(with_extra(extra)).reserved <= room;
    }));
  }
  relayout(capacity);
}

std::vector<uint64_t> DeviceRows::tight_capacity() const {
  std::vector<uint64_t> capacity(geometry_.n_layers);
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    capacity[l] = layer_rows(l);
    if (plans_[l].active) capacity[l] = std::max(capacity[l], plans_[l].rows_after);
  }
  return capacity;
}

uint64_t DeviceRows::shrink_to_fit() {
  if (failed_) return layout_.reserved;
  const std::vector<uint64_t> capacity = tight_capacity();
  if (capacity != capacity_) relayout(capacity);  // (within the region: it only shrinks)
  return layout_.reserved;
}

// --- Bytes -----------------------------------------------------------------------------------

void DeviceRows::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (const std::vector<int32_t>& p : positions_[layer]) {
    by_tier[KVSDK_TIER_EXACT] += p.size() * ExactStore::kv_bytes_per_token(geometry_.head_dim);
    by_tier[KVSDK_TIER_METADATA] += p.size() * ExactStore::meta_bytes_per_token();
  }
}

uint64_t DeviceRows::append_bound(uint32_t, size_t n_tokens) const {
  return uint64_t(n_tokens) * geometry_.n_kv_heads *
         ExactStore::bytes_per_token(geometry_.head_dim);
}

uint64_t DeviceRows::layer_token_bytes(uint64_t extra_per_row) const {
  return uint64_t(geometry_.n_kv_heads) *
         (ExactStore::bytes_per_token(geometry_.head_dim) + extra_per_row);
}

uint64_t DeviceRows::layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const {
  return bytes / layer_token_bytes(extra_per_row);
}

// --- Append ----------------------------------------------------------------------------------

void DeviceRows::append(uint32_t layer, size_t n, const float* k, const float* v,
                        const int32_t* positions) {
  append_rows(layer, n, KVSDK_DTYPE_F32, k, v, positions);
}

void DeviceRows::append_host(uint32_t layer, size_t n, const void* k, const void* v,
                             const int32_t* positions) {
  append_rows(layer, n, geometry_.dtype, k, v, positions);
}

void DeviceRows::stage_row(kvsdk_dtype dtype, const void* k, const void* v, size_t t,
                           uint32_t head, size_t slot) const {
  const uint32_t dim = geometry_.head_dim;
  const size_t at = t * geometry_.kv_elems_per_token() + size_t(head) * dim;
  if (dtype == KVSDK_DTYPE_F32) {
    const backend::Ops& host = backend::cpu_optimized();  // the same rounding as ExactRows
    host.f32_to_f16(static_cast<const float*>(k) + at, dim, stage_k_.data() + slot * dim);
    host.f32_to_f16(static_cast<const float*>(v) + at, dim, stage_v_.data() + slot * dim);
  } else {
    load_f16(dtype, k, at, dim, stage_k_.data() + slot * dim);
    load_f16(dtype, v, at, dim, stage_v_.data() + slot * dim);
  }
}

void DeviceRows::append_rows(uint32_t layer, size_t n, kvsdk_dtype dtype, const void* k,
                             const void* v, const int32_t* positions) {
  check_usable();
  if (n == 0) return;
  // Staged host copies (exact_rows) go before the store changes, and before the device lock:
  // exact_rows() holds staged_lock_ while it takes the device lock (one lock order; TSan).
  release_host_staging();
  const Context::DeviceScope on_device(ctx_);
  const uint32_t dim = geometry_.head_dim;
  // Everything that can fail before the store changes: host staging and mirrors, then the
  // arena's room (a re-plan only moves rows).
  // Every head's rows are staged first and go to the device as one batch (to_backend_many): a
  // decode step's append is one transfer, not three per KV head.
  const uint32_t n_kv = geometry_.n_kv_heads;
  reserve_for_growth(stage_k_, n_kv * n * dim);
  reserve_for_growth(stage_v_, n_kv * n * dim);
  stage_k_.resize(std::max(stage_k_.size(), n_kv * n * dim));
  stage_v_.resize(std::max(stage_v_.size(), n_kv * n * dim));
  reserve_for_growth(copies_, 3 * size_t(n_kv));
  for (std::vector<int32_t>& p : positions_[layer]) reserve_for_growth(p, p.size() + n);
  reserve_rows(layer, layer_rows(layer) + n);
  const size_t row_bytes = dim * sizeof(uint16_t);
  copies_.clear();
  for (uint32_t h = 0; h < n_kv; ++h) {
    const size_t old = positions_[layer][h].size();
    for (size_t t = 0; t < n; ++t) stage_row(dtype, k, v, t, h, h * n + t);
    copies_.push_back({slice(layer, h, kKeys) + old * row_bytes, stage_k_.data() + h * n * dim,
                       n * row_bytes});
    copies_.push_back({slice(layer, h, kValues) + old * row_bytes, stage_v_.data() + h * n * dim,
                       n * row_bytes});
    copies_.push_back({slice(layer, h, kPositions) + old * sizeof(int32_t), positions,
                       n * sizeof(int32_t)});
  }
  backend::to_backend_all(device_, copies_.data(), copies_.size());
  // (A device failure above leaves the rows beyond the mirrors' counts unused: the store is
  // unchanged.)
  for (std::vector<int32_t>& p : positions_[layer]) p.insert(p.end(), positions, positions + n);
}

// --- Attention and reads ----------------------------------------------------------------------

void DeviceRows::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, kv_head, 1, q_rows, row_positions, n_rows, out);
}

void DeviceRows::attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                              const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, 0, n_kv, q_rows, row_positions, n_rows, out);
}

void DeviceRows::attend_range(uint32_t layer, uint32_t first_head, uint32_t n_heads,
                              const float* q_rows, const int32_t* row_positions, size_t n_rows,
                              float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  queries_.attend_heads(
      query_rows(q_rows, row_positions, n_rows), first_head, n_heads, geometry_.group_size(), out,
      [&](uint32_t h, const backend::QueryRows& q, float* device_out) {
        device_.attend_f16(q, head_rows(layer, h), workspace(), device_out);
      });
}

void DeviceRows::stage_head(uint32_t layer, uint32_t kv_head, ExactStore& into) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const std::vector<int32_t>& p = positions_[layer][kv_head];
  const size_t elems = p.size() * geometry_.head_dim;
  into.positions.assign(p.begin(), p.end());
  into.k.resize(elems);
  into.v.resize(elems);
  device_.to_host(into.k.data(), slice(layer, kv_head, kKeys), elems * sizeof(uint16_t));
  device_.to_host(into.v.data(), slice(layer, kv_head, kValues), elems * sizeof(uint16_t));
}

bool DeviceRows::device_rows(uint32_t layer, uint32_t kv_head, backend::F16Rows& rows,
                             const int32_t*& host_positions) const {
  check_usable();
  rows = head_rows(layer, kv_head);
  host_positions = positions_[layer][kv_head].data();
  return true;
}

backend::F16Rows DeviceRows::head_rows(uint32_t layer, uint32_t kv_head) const {
  return {reinterpret_cast<const uint16_t*>(slice(layer, kv_head, kKeys)),
          reinterpret_cast<const uint16_t*>(slice(layer, kv_head, kValues)),
          reinterpret_cast<const int32_t*>(slice(layer, kv_head, kPositions)),
          positions_[layer][kv_head].size()};
}

const ExactStore* DeviceRows::exact_rows(uint32_t layer, uint32_t kv_head) const {
  std::lock_guard<std::mutex> lock(staged_lock_);
  ExactStore& s = staged_[layer][kv_head];
  if (!present_[layer][kv_head]) {
    stage_head(layer, kv_head, s);
    present_[layer][kv_head] = 1;
    any_staged_.store(true);
  }
  return &s;
}

void DeviceRows::release_host_staging() const noexcept {
  if (!any_staged_.load()) return;  // (every append calls this: nothing to do, nothing to lock)
  std::lock_guard<std::mutex> lock(staged_lock_);
  any_staged_.store(false);
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

void DeviceRows::load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                           float* dst) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t dim = geometry_.head_dim;
  // Keys for the selection stage's scores (one pass per eviction): copied out, widened on the
  // host. The staging grows to the largest chunk once.
  reserve_for_growth(read_stage_.k, count * dim);
  read_stage_.k.resize(std::max(read_stage_.k.size(), count * dim));
  device_.to_host(read_stage_.k.data(), slice(layer, kv_head, kKeys) + first * dim * sizeof(uint16_t),
                  count * dim * sizeof(uint16_t));
  load_f32(KVSDK_DTYPE_F16, read_stage_.k.data(), 0, count * dim, dst);
}

bool DeviceRows::column_sums_here(uint32_t layer, uint32_t kv_head, const backend::QueryRows& q,
                                  const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                                  size_t n_keys, float* col_sums) const {
  if (!device_.column_sums_rows) return false;
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t held = positions_[layer][kv_head].size();
  scoring_.score(q, keys, key_pos, held, n_keys, col_sums,
                 [&](const backend::QueryRows& dq, const float* tail, const int32_t* tail_pos,
                     size_t n_tail, float* cols) {
                   const backend::F16Rows rows{
                       reinterpret_cast<const uint16_t*>(slice(layer, kv_head, kKeys)), nullptr,
                       reinterpret_cast<const int32_t*>(slice(layer, kv_head, kPositions)), held};
                   device_.column_sums_rows(dq, nullptr, rows, tail, tail_pos, n_tail,
                                            workspace(), cols);
                 });
  return true;
}

// --- Selection -------------------------------------------------------------------------------

uint64_t DeviceRows::plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                               const IncomingRows* incoming) {
  check_usable();
  const uint32_t dim = geometry_.head_dim;
  Plan& next = plans_[layer];
  next.assign(keep, incoming, geometry_.n_kv_heads);
  uint64_t rows = 0, most = 0, incoming_kept = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    rows += keep[h].size();
    most = std::max<uint64_t>(most, keep[h].size());
    const size_t held = positions_[layer][h].size();
    incoming_kept = std::max<uint64_t>(
        incoming_kept, uint64_t(keep[h].end() - std::lower_bound(keep[h].begin(), keep[h].end(),
                                                                 uint32_t(held))));
    positions_[layer][h].reserve(keep[h].size());  // capacity only: commit cannot allocate
  }
  // Room for what the layer keeps, now (a re-plan moves rows but changes none), so that
  // commit_keep never needs any; planned layers keep theirs when the arena is re-planned.
  {
    const Context::DeviceScope on_device(ctx_);
    reserve_rows(layer, most);
  }
  reserve_for_growth(stage_k_, incoming_kept * dim);
  reserve_for_growth(stage_v_, incoming_kept * dim);
  stage_k_.resize(std::max(stage_k_.size(), size_t(incoming_kept) * dim));
  stage_v_.resize(std::max(stage_v_.size(), size_t(incoming_kept) * dim));
  next.rows_after = most;
  next.active = true;
  return rows * ExactStore::bytes_per_token(dim);
}

void DeviceRows::move_rows_down(uint32_t layer, uint32_t head, size_t to, size_t from,
                                size_t rows) {
  const size_t row_bytes[kParts] = {geometry_.head_dim * sizeof(uint16_t),
                                    geometry_.head_dim * sizeof(uint16_t), sizeof(int32_t)};
  for (Part part : {kKeys, kValues, kPositions}) {
    char* const base = slice(layer, head, part);
    const uint64_t r = row_bytes[part];
    cuda::move_in_chunks(to * r, from * r, rows * r, [&](uint64_t d, uint64_t s, uint64_t n) {
      device_.copy(base + d, base + s, size_t(n));
    });
  }
}

void DeviceRows::commit_layer(uint32_t layer) {
  const Plan& plan = plans_[layer];
  if (plan.rows_after > capacity_[layer]) {  // (plan_keep made the room: a bug otherwise)
    fail(KVSDK_E_INTERNAL, "layer ", layer, " lost the room its eviction plan reserved");
  }
  const size_t row_bytes = geometry_.head_dim * sizeof(uint16_t);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const std::vector<uint32_t>& keep = plan.keep[h];
    std::vector<int32_t>& pos = positions_[layer][h];
    const size_t held = pos.size();
    // The kept stored rows, compacted in order run by run (indices ascend: row i comes from a
    // row >= i), on the device and in the mirror.
    const size_t j = size_t(std::lower_bound(keep.begin(), keep.end(), uint32_t(held)) - keep.begin());
    for (size_t i = 0; i < j;) {
      size_t run = 1;
      while (i + run < j && keep[i + run] == keep[i] + run) ++run;
      if (keep[i] != i) move_rows_down(layer, h, i, keep[i], run);
      for (size_t r = 0; r < run; ++r) pos[i + r] = pos[keep[i] + r];
      i += run;
    }
    pos.resize(j);
    // Then the kept incoming rows (indices past the held rows), staged and copied in at once.
    const size_t n = keep.size() - j;
    if (n == 0) continue;
    const IncomingRows& in = plan.incoming;
    for (size_t i = 0; i < n; ++i) {
      const size_t t = keep[j + i] - held;
      stage_row(geometry_.dtype, in.k, in.v, t, h, i);
      pos.push_back(in.positions[t]);  // (capacity reserved by plan_keep)
    }
    device_.to_backend(slice(layer, h, kKeys) + j * row_bytes, stage_k_.data(), n * row_bytes);
    device_.to_backend(slice(layer, h, kValues) + j * row_bytes, stage_v_.data(), n * row_bytes);
    device_.to_backend(slice(layer, h, kPositions) + j * sizeof(int32_t), pos.data() + j,
                       n * sizeof(int32_t));
  }
}

void DeviceRows::commit_keep() noexcept {
  try {
    const Context::DeviceScope on_device(ctx_);
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      if (!plans_[l].active) continue;
      commit_layer(l);
      plans_[l].active = false;
    }
  } catch (...) {
    failed_ = true;
    for (Plan& p : plans_) p.active = false;
  }
  release_host_staging();
}

void DeviceRows::follow_allocation(const std::vector<uint64_t>& caps) noexcept {
  if (failed_ || caps.size() != geometry_.n_layers) return;
  const uint64_t most = regions_.bytes() / layer_token_bytes(0);  // (no overflow below)
  std::vector<uint64_t> capacity;
  try {
    capacity.resize(geometry_.n_layers);
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      if (caps[l] > most) return;  // unbounded or beyond the arena: growth decides
      capacity[l] = std::max(layer_rows(l), caps[l]);
      if (plans_[l].active) capacity[l] = std::max(capacity[l], plans_[l].rows_after);
    }
    if (capacity == capacity_ || layout_for(capacity).reserved > regions_.room_for(this)) return;
    relayout(capacity);
  } catch (const Error& e) {
    if (e.status() == KVSDK_E_BACKEND) failed_ = true;  // rows moved half-way are lost
  } catch (...) {  // host memory for the copy plan: nothing moved, the layout stays
  }
}

void DeviceRows::drop_keep() noexcept {
  for (Plan& p : plans_) p.active = false;
}

// --- Snapshots and truncation ------------------------------------------------------------------

void DeviceRows::restore_exact(uint32_t layer, std::vector<ExactStore> heads) {
  if (heads.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_INTERNAL, "restore: layer ", layer, " with ", heads.size(), " heads");
  }
  KVSDK_REQUIRE(layer_rows(layer) == 0, "restore into a layer that holds rows");
  release_host_staging();  // (before the device lock, as in append_rows)
  const Context::DeviceScope on_device(ctx_);
  const size_t dim = geometry_.head_dim;
  size_t most = 0;
  for (const ExactStore& h : heads) most = std::max(most, h.size());
  std::vector<std::vector<int32_t>> mirror(heads.size());
  for (size_t h = 0; h < heads.size(); ++h) {
    mirror[h].assign(heads[h].positions.begin(), heads[h].positions.end());
  }
  reserve_rows(layer, most);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const size_t n = heads[h].size();
    device_.to_backend(slice(layer, h, kKeys), heads[h].k.data(), n * dim * sizeof(uint16_t));
    device_.to_backend(slice(layer, h, kValues), heads[h].v.data(), n * dim * sizeof(uint16_t));
    device_.to_backend(slice(layer, h, kPositions), heads[h].positions.data(),
                       n * sizeof(int32_t));
  }
  positions_[layer] = std::move(mirror);
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
  // A suffix of every head (truncate_refusal): only the counts change.
  for (std::vector<int32_t>& p : positions_[layer]) {
    const auto first = std::find_if(p.begin(), p.end(), [&](int32_t x) { return x >= position; });
    p.resize(size_t(first - p.begin()));
  }
  release_host_staging();
}

}  // namespace kvsdk
