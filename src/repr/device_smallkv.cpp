#include "repr/device_smallkv.h"

#include <algorithm>

#include "core/cache.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

DeviceSmallKv::DeviceSmallKv(const Geometry& g, const kvsdk_policy& p, Context& ctx)
    : SmallKvRepresentation(g, p),
      ctx_(ctx),
      device_(ctx.ops()),
      regions_(*ctx.regions()),
      capacity_(size_t(g.n_layers) * g.n_kv_heads),
      queries_(ctx.ops()),
      marginal_(ctx.ops()) {
  check_device_head_dim(device_, g.head_dim);
  layout_ = layout_for(capacity_);
  regions_.join(this);
}

DeviceSmallKv::~DeviceSmallKv() { regions_.leave(this); }

void DeviceSmallKv::check_usable() const {
  if (failed_) {
    fail(KVSDK_E_BACKEND, "the ", device_.name, " device failed while this cache evicted or ",
         "restored rows; its rows are lost (destroy the cache)");
  }
}

// --- The arena -----------------------------------------------------------------------------------

cuda::ArenaPartition DeviceSmallKv::layout_for(const std::vector<Capacity>& capacity) const {
  cuda::ArenaPartition p;
  p.tiers = size_t(geometry_.n_kv_heads) * kParts;
  p.slices.resize(size_t(geometry_.n_layers) * p.tiers);
  // Head by head, each head's slices together: a layer restored (or grown) moves only the heads
  // after it, and a load, which restores the layers in order into an empty store, moves nothing.
  // The f16 rows first (multiples of 16 bytes, read with vector loads), then the positions; each
  // head starts on 16 bytes (at most 12 bytes of padding a head: the budget charges every row 4
  // bytes of score that the arena does not hold, so only heads of one or two rows can need more
  // arena than they are charged).
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  uint64_t offset = 0;
  for (size_t head = 0; head < capacity.size(); ++head) {
    const Capacity c = capacity[head];
    const uint64_t bytes[kParts] = {c.full * row, c.full * row, c.marg * row,
                                    c.full * sizeof(int32_t), c.marg * sizeof(int32_t)};
    for (size_t part = 0; part < kParts; ++part) {
      p.slices[head * kParts + part] = {offset, bytes[part]};
      offset += bytes[part];
    }
    offset = cuda::align_up(offset, 16);
  }
  p.reserved = offset;
  return p;
}

char* DeviceSmallKv::slice(uint32_t layer, uint32_t head, Part part) const {
  return regions_.base(this) + layout_.at(layer, size_t(head) * kParts + part).offset;
}

DeviceSmallKv::Capacity DeviceSmallKv::held(uint32_t layer, uint32_t head) const {
  const Head& h = layer_state(layer).heads[head];
  return {h.full_pos.size(), h.marg_pos.size()};
}

std::vector<DeviceSmallKv::Capacity> DeviceSmallKv::tight() const {
  std::vector<Capacity> c(capacity_.size());
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) c[index(l, h)] = held(l, h);
  }
  return c;
}

void DeviceSmallKv::relayout(const std::vector<Capacity>& capacity,
                             const std::vector<char>* fresh) {
  const cuda::ArenaPartition next = layout_for(capacity);
  regions_.grow(this, std::max(next.reserved, layout_.reserved));  // (BUDGET: nothing changed)
  std::vector<uint64_t> used(layout_.slices.size(), 0);
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      const size_t i = index(l, h);
      if (fresh && (*fresh)[i]) continue;
      const Capacity n = held(l, h);
      used[i * kParts + kFullK] = used[i * kParts + kFullV] = n.full * row;
      used[i * kParts + kMargV] = n.marg * row;
      used[i * kParts + kFullPos] = n.full * sizeof(int32_t);
      used[i * kParts + kMargPos] = n.marg * sizeof(int32_t);
    }
  }
  char* const at = regions_.base(this);
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(layout_, next, used)) {
    device_.copy(at + c.dst, at + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

uint64_t DeviceSmallKv::shrink_to_fit() {
  if (failed_) return layout_.reserved;
  std::vector<Capacity> next = tight();
  if (planned_) {  // (the planned eviction's commit needs its room kept)
    for (size_t i = 0; i < next.size(); ++i) {
      if (planned_fresh_[i]) continue;  // (its rows are rewritten at the commit)
      next[i].full = std::max(next[i].full, planned_capacity_[i].full);
      next[i].marg = std::max(next[i].marg, planned_capacity_[i].marg);
    }
  }
  if (!(next == capacity_)) relayout(next, nullptr);  // (within the region: it only shrinks)
  return planned_ ? std::max(layout_.reserved, layout_for(planned_capacity_).reserved)
                  : layout_.reserved;
}

void DeviceSmallKv::upload_head(uint32_t layer, uint32_t head, const Head& h) {
  const size_t row = size_t(geometry_.head_dim) * sizeof(uint16_t);
  const size_t nf = h.full_pos.size(), nm = h.marg_pos.size();
  const backend::HostCopy copies[] = {
      {slice(layer, head, kFullK), h.full_k.data(), nf * row},
      {slice(layer, head, kFullV), h.full_v.data(), nf * row},
      {slice(layer, head, kMargV), h.marg_v.data(), nm * row},
      {slice(layer, head, kFullPos), h.full_pos.data(), nf * sizeof(int32_t)},
      {slice(layer, head, kMargPos), h.marg_pos.data(), nm * sizeof(int32_t)},
  };
  for (const backend::HostCopy& c : copies) {
    if (c.bytes) device_.to_backend(c.dst, c.src, c.bytes);
  }
}

// --- Appends -------------------------------------------------------------------------------------

void DeviceSmallKv::rows_append(uint32_t layer, size_t n, const float* k, const float* v,
                                const int32_t* positions) {
  check_usable();
  if (n == 0) return;
  const Context::DeviceScope on_device(ctx_);
  const uint32_t n_kv = geometry_.n_kv_heads;
  const size_t dim = geometry_.head_dim, row = geometry_.kv_elems_per_token();
  // Everything that can fail before the rows land: host staging, then the arena's room (a
  // re-plan only moves rows). The rows go beyond each head's count: until the host store counts
  // them (after this returns), they are not there.
  reserve_for_growth(stage_k_, n_kv * n * dim);
  reserve_for_growth(stage_v_, n_kv * n * dim);
  stage_k_.resize(std::max(stage_k_.size(), n_kv * n * dim));
  stage_v_.resize(std::max(stage_v_.size(), n_kv * n * dim));
  reserve_for_growth(copies_, 3 * size_t(n_kv));
  std::vector<Capacity> next = capacity_;
  bool grow = false;
  for (uint32_t h = 0; h < n_kv; ++h) {
    Capacity& c = next[index(layer, h)];
    const uint64_t need = held(layer, h).full + n;
    if (need > c.full) {
      c.full = grown_capacity(size_t(c.full), size_t(need));
      grow = true;
    }
  }
  if (grow) {
    if (layout_for(next).reserved > regions_.room_for(this)) {
      // Growth by half does not fit: every head what it holds, this layer's heads what they
      // need (relayout refuses when not even that fits).
      next = tight();
      for (uint32_t h = 0; h < n_kv; ++h) next[index(layer, h)].full += n;
    }
    relayout(next, nullptr);
  }
  const size_t row_bytes = dim * sizeof(uint16_t);
  copies_.clear();
  for (uint32_t h = 0; h < n_kv; ++h) {
    const size_t old = held(layer, h).full;
    uint16_t* sk = stage_k_.data() + h * n * dim;
    uint16_t* sv = stage_v_.data() + h * n * dim;
    for (size_t t = 0; t < n; ++t) {  // (the host store's rounding)
      store_f32(KVSDK_DTYPE_F16, k + t * row + h * dim, dim, sk, t * dim);
      store_f32(KVSDK_DTYPE_F16, v + t * row + h * dim, dim, sv, t * dim);
    }
    copies_.push_back({slice(layer, h, kFullK) + old * row_bytes, sk, n * row_bytes});
    copies_.push_back({slice(layer, h, kFullV) + old * row_bytes, sv, n * row_bytes});
    copies_.push_back({slice(layer, h, kFullPos) + old * sizeof(int32_t), positions,
                       n * sizeof(int32_t)});
  }
  backend::to_backend_all(device_, copies_.data(), copies_.size());
}

// --- Reads of the rows ---------------------------------------------------------------------------

void DeviceSmallKv::rows_full_keys(uint32_t layer, uint32_t kv_head, size_t count,
                                   float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t elems = count * geometry_.head_dim;
  std::vector<uint16_t> k(elems);
  device_.to_host(k.data(), slice(layer, kv_head, kFullK), elems * sizeof(uint16_t));
  load_f32(KVSDK_DTYPE_F16, k.data(), 0, elems, out);
}

const SmallKvRepresentation::Head& DeviceSmallKv::host_head(uint32_t layer, uint32_t kv_head,
                                                            Head& scratch) const {
  check_usable();
  const Head& h = layer_state(layer).heads[kv_head];
  scratch.full_pos = h.full_pos;
  scratch.full_score = h.full_score;
  scratch.marg_pos = h.marg_pos;
  scratch.marg_score = h.marg_score;
  scratch.stats_done = h.stats_done;
  scratch.matched = h.matched;
  scratch.scores_from = h.scores_from;
  const size_t dim = geometry_.head_dim, nf = h.full_pos.size(), nm = h.marg_pos.size();
  scratch.full_k.resize(nf * dim);
  scratch.full_v.resize(nf * dim);
  scratch.marg_v.resize(nm * dim);
  std::lock_guard<std::mutex> lock(copy_out_);  // (snapshots copy heads out from the pool)
  const Context::DeviceScope on_device(ctx_);
  const size_t row = dim * sizeof(uint16_t);
  if (nf) device_.to_host(scratch.full_k.data(), slice(layer, kv_head, kFullK), nf * row);
  if (nf) device_.to_host(scratch.full_v.data(), slice(layer, kv_head, kFullV), nf * row);
  if (nm) device_.to_host(scratch.marg_v.data(), slice(layer, kv_head, kMargV), nm * row);
  return scratch;
}

// --- Attention (Eq. 6) ---------------------------------------------------------------------------

void DeviceSmallKv::rows_attend_full(uint32_t layer, uint32_t first, uint32_t n,
                                     const float* q_rows, const int32_t* row_positions,
                                     size_t n_rows, float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  queries_.attend_heads(
      query_rows(q_rows, row_positions, n_rows), first, n, geometry_.group_size(), out,
      [&](uint32_t h, const backend::QueryRows& q, float* device_out) {
        const backend::F16Rows full{
            reinterpret_cast<const uint16_t*>(slice(layer, h, kFullK)),
            reinterpret_cast<const uint16_t*>(slice(layer, h, kFullV)),
            reinterpret_cast<const int32_t*>(slice(layer, h, kFullPos)),
            size_t(held(layer, h).full)};
        device_.attend_smallkv(q, full, backend::SmallKvMarginal{}, workspace(), device_out);
      });
}

void DeviceSmallKv::rows_add_marginal(uint32_t layer, uint32_t first, uint32_t n,
                                      const float* /*q_rows*/, const int32_t* row_positions,
                                      size_t n_rows, const HeadWeights* weights,
                                      float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t dim = geometry_.head_dim, elems = n_rows * dim;
  // Every head's weights packed (the host's rows are `stride` apart), the outputs so far and the
  // queries' positions go up in one batch (the kernel reads no query row); the outputs come
  // back in one copy.
  size_t packed = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (weights[i].marginal) packed += n_rows * size_t(held(layer, first + i).marg);
  }
  std::vector<float>& w = at_least(weights_, packed);
  float* const w_dev = static_cast<float*>(marginal_.at_least(
      (packed + n * elems) * sizeof(float) + n_rows * sizeof(int32_t)));
  float* const out_dev = w_dev + packed;
  int32_t* const pos_dev = reinterpret_cast<int32_t*>(out_dev + n * elems);
  size_t at = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!weights[i].marginal) continue;
    const size_t nm = size_t(held(layer, first + i).marg);
    for (size_t r = 0; r < n_rows; ++r) {
      std::copy_n(weights[i].marginal + r * weights[i].stride, nm, w.data() + at + r * nm);
    }
    at += n_rows * nm;
  }
  const backend::HostCopy up[] = {{w_dev, w.data(), packed * sizeof(float)},
                                  {out_dev, out, n * elems * sizeof(float)},
                                  {pos_dev, row_positions, n_rows * sizeof(int32_t)}};
  backend::to_backend_all(device_, up, 3);
  // (The marginal term reads the rows' positions and count; q stays null: nothing reads it.)
  backend::QueryRows qd = query_rows(nullptr, pos_dev, n_rows);
  at = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!weights[i].marginal) continue;
    const uint32_t h = first + i;
    const size_t nm = size_t(held(layer, h).marg);
    const backend::SmallKvMarginal marginal{
        reinterpret_cast<const uint16_t*>(slice(layer, h, kMargV)),
        reinterpret_cast<const int32_t*>(slice(layer, h, kMargPos)), nm, w_dev + at, nm};
    device_.smallkv_add_marginal(qd, marginal, workspace(), out_dev + i * elems);
    at += n_rows * nm;
  }
  device_.to_host(out, out_dev, n * elems * sizeof(float));
}

const backend::Ops& DeviceSmallKv::proxy_ops() const {
  // The reference's bits, whichever backend the proxy is on: they are the bits of the CUDA
  // table's own smallkv_softmax (cuda_smallkv.cu), so a device cache's row scores, and with them
  // its evictions and snapshots, are a reference CPU cache's.
  return backend::cpu_reference();
}

backend::Workspace& DeviceSmallKv::proxy_workspace() const {
  if (!proxy_ws_) proxy_ws_ = backend::WorkspaceHandle(proxy_ops());
  return proxy_ws_.get();
}

// --- Eviction ------------------------------------------------------------------------------------

void DeviceSmallKv::rows_plan(uint32_t append_layer, size_t append_tokens) {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const EvictionPlan& plan = eviction_plan();
  std::vector<char> fresh(capacity_.size(), 0);
  std::vector<Capacity> next = capacity_;
  // The shrunk heads get exactly their new rows (and the append's): an eviction gives the
  // budget's bytes back, and the region with them.
  for (const ShrunkHead& sh : plan.shrunk) {
    const Head& out = layer_state(sh.layer).spare[sh.kv_head];
    const size_t i = index(sh.layer, sh.kv_head);
    fresh[i] = 1;
    next[i] = {out.full_pos.size() + (sh.layer == append_layer ? append_tokens : 0),
               out.marg_pos.size()};
  }
  if (append_layer < geometry_.n_layers) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      const size_t i = index(append_layer, h);
      if (fresh[i]) continue;
      const uint64_t need = held(append_layer, h).full + append_tokens;
      next[i].full = std::max(next[i].full, need);
    }
  }
  if (layout_for(next).reserved > regions_.room_for(this)) {
    // Not with the spare room of every head: exactly what each head holds after the commit.
    for (size_t i = 0; i < next.size(); ++i) {
      if (fresh[i]) continue;
      const Capacity n = held(uint32_t(i / geometry_.n_kv_heads),
                              uint32_t(i % geometry_.n_kv_heads));
      const bool appends = append_layer < geometry_.n_layers &&
                           i / geometry_.n_kv_heads == append_layer;
      next[i] = {n.full + (appends ? append_tokens : 0), n.marg};
    }
  }
  // The room now (throws KVSDK_E_BUDGET with nothing changed): the commit only moves rows inside
  // the region and writes the shrunk heads.
  const cuda::ArenaPartition target = layout_for(next);
  regions_.grow(this, std::max(target.reserved, layout_.reserved));
  planned_capacity_ = std::move(next);
  planned_fresh_ = std::move(fresh);
  planned_ = true;
}

void DeviceSmallKv::rows_commit() noexcept {
  if (!planned_) return;
  planned_ = false;
  try {
    const Context::DeviceScope on_device(ctx_);
    if (!(planned_capacity_ == capacity_)) relayout(planned_capacity_, &planned_fresh_);
    for (const ShrunkHead& sh : eviction_plan().shrunk) {
      const Head& h = layer_state(sh.layer).heads[sh.kv_head];
      upload_head(sh.layer, sh.kv_head, h);
    }
  } catch (...) {
    failed_ = true;  // (the heads' rows are not all where the bookkeeping says)
  }
  // The new heads' rows are on the device now: their host copies go.
  for (const ShrunkHead& sh : eviction_plan().shrunk) {
    Head& h = layer_state(sh.layer).heads[sh.kv_head];
    std::vector<uint16_t>().swap(h.full_k);
    std::vector<uint16_t>().swap(h.full_v);
    std::vector<uint16_t>().swap(h.marg_v);
  }
}

// --- Restore and truncation ----------------------------------------------------------------------

void DeviceSmallKv::rows_restore(uint32_t layer, std::vector<Head>& heads) {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  std::vector<Capacity> next = capacity_;
  std::vector<char> fresh(capacity_.size(), 0);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const size_t i = index(layer, h);
    fresh[i] = 1;
    next[i] = {heads[h].full_pos.size(), heads[h].marg_pos.size()};
  }
  relayout(next, &fresh);  // (BUDGET: nothing changed)
  try {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) upload_head(layer, h, heads[h]);
  } catch (...) {
    failed_ = true;  // (the layer's old rows may be overwritten)
    throw;
  }
  for (Head& h : heads) {  // (on the device now)
    std::vector<uint16_t>().swap(h.full_k);
    std::vector<uint16_t>().swap(h.full_v);
    std::vector<uint16_t>().swap(h.marg_v);
  }
}

std::string DeviceSmallKv::truncate_refusal(uint32_t layer, int32_t position) const {
  std::string why = SmallKvRepresentation::truncate_refusal(layer, position);
  if (!why.empty()) return why;
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
    const Head& h = layer_state(layer).heads[g];
    // The rows that go must be the head's newest full rows (the device cuts a suffix).
    const auto first_cut = std::find_if(h.full_pos.begin(), h.full_pos.end(),
                                        [&](int32_t p) { return p >= position; });
    const bool suffix = std::all_of(first_cut, h.full_pos.end(),
                                    [&](int32_t p) { return p >= position; });
    const bool marginal = std::any_of(h.marg_pos.begin(), h.marg_pos.end(),
                                      [&](int32_t p) { return p >= position; });
    if (!suffix || marginal) {
      return "layer " + std::to_string(layer) + " KV head " + std::to_string(g) +
             ": a " + device_.name + " cache removes only its newest rows, and the rows at " +
             "positions >= " + std::to_string(position) + " are not (rows appended out of " +
             "position order)";
    }
  }
  return {};
}

}  // namespace kvsdk
