#include "repr/device_kivi.h"

#include <algorithm>

#include "kivi_quant.h"
#include "repr/head_store.h"
#include "core/method_traits.h"
#include "repr/kivi_repr.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk {

namespace {

template <class T>
T* grown(std::vector<T>& v, size_t n) {
  reserve_for_growth(v, n);
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

DeviceKivi::DeviceKivi(const Geometry& g, const kvsdk_policy& p, Context& ctx)
    : Representation(g, p),
      ctx_(ctx),
      device_(ctx.ops()),
      regions_(*ctx.regions()),
      queries_(ctx.ops()),
      scoring_(ctx.ops()),
      flush_(ctx.ops()),
      config_(kivi_config(p)),
      overlay_(kivi_overlay(p)),
      capacity_(size_t(g.n_layers) * g.n_kv_heads),
      heads_(g.n_layers, std::vector<Head>(g.n_kv_heads)),
      planned_(g.n_layers),
      planned_need_(size_t(g.n_layers) * g.n_kv_heads),
      planned_active_(g.n_layers, 0) {
  KVSDK_REQUIRE(p.quant_bits != 0, "KIVI stores need quant_bits 1, 2, 4 or 8 (got 0)");
  check_device_head_dim(device_, g.head_dim);
  const cpu::KiviHeadStore check(g.head_dim, config_);  // the host store's validation
  row_bytes_ = cpu::kivi_packed_bytes(g.head_dim, config_.bits);
  groups_ = cpu::kivi_value_groups(g.head_dim, config_.group);
  layout_ = layout_for(capacity_);
  regions_.join(this);
}

DeviceKivi::~DeviceKivi() { regions_.leave(this); }

void DeviceKivi::check_usable() const {
  if (failed_) {
    fail(KVSDK_E_BACKEND, "the ", device_.name, " device failed while this cache moved its ",
         "KIVI rows; they are lost (destroy the cache)");
  }
}

// --- Layout ----------------------------------------------------------------------------------

DeviceKivi::Capacity DeviceKivi::shape_of(const Head& h) const {
  const uint64_t blocks = h.blocks(config_.group);
  return {h.quantized, h.residual(), blocks, h.ragged() ? blocks : 0};
}

DeviceKivi::Capacity DeviceKivi::shape_of(const cpu::KiviHeadStore& s) const {
  const uint64_t blocks = s.key_scales().size() / geometry_.head_dim;
  return {s.quantized_tokens(), s.residual_tokens(), blocks, s.ragged() ? blocks : 0};
}

uint64_t DeviceKivi::part_bytes(Part part, const Capacity& c) const {
  const uint64_t dim = geometry_.head_dim;
  switch (part) {
    case kKeyCodes:
    case kValueCodes: return c.quantized * row_bytes_;
    case kKeyScales:
    case kKeyZeros: return c.blocks * dim * sizeof(uint16_t);
    case kValueScales:
    case kValueZeros: return c.quantized * groups_ * sizeof(uint16_t);
    case kQuantPositions: return c.quantized * sizeof(int32_t);
    case kBlockStarts: return c.starts * sizeof(uint32_t);
    case kResidualKeys:
    case kResidualValues: return c.residual * dim * sizeof(uint16_t);
    case kResidualPositions: return c.residual * sizeof(int32_t);
    case kParts: break;
  }
  return 0;
}

cuda::ArenaPartition DeviceKivi::layout_for(const std::vector<Capacity>& capacity) const {
  cuda::ArenaPartition p;
  p.tiers = size_t(geometry_.n_kv_heads) * kParts;
  p.slices.resize(size_t(geometry_.n_layers) * p.tiers);
  // The parts by alignment, every head's in turn: first those of whole f16 rows (multiples of 16
  // bytes, read with vector loads), then the 4-byte, 2-byte and 1-byte ones. So no slice needs
  // padding and a tight layout is exactly the bytes the CPU store counts (the budget's).
  static constexpr Part kOrder[kParts] = {kKeyScales,     kKeyZeros,       kResidualKeys,
                                          kResidualValues, kQuantPositions, kBlockStarts,
                                          kResidualPositions, kValueScales, kValueZeros,
                                          kKeyCodes,       kValueCodes};
  uint64_t offset = 0;
  for (Part part : kOrder) {
    for (size_t head = 0; head < capacity.size(); ++head) {
      const uint64_t bytes = part_bytes(part, capacity[head]);
      p.slices[head * kParts + part] = {offset, bytes};
      offset += bytes;
    }
  }
  p.reserved = cuda::align_up(offset, 16);
  return p;
}

std::vector<uint64_t> DeviceKivi::used_bytes(bool except_planned, int64_t residual_of) const {
  std::vector<uint64_t> used(layout_.slices.size());
  for (size_t i = 0; i < used.size(); ++i) {
    const size_t head = i / kParts, layer = head / geometry_.n_kv_heads;
    if (except_planned && planned_active_[layer]) continue;  // (replaced whole by the commit)
    const Part part = Part(i % kParts);
    if (int64_t(layer) == residual_of &&
        (part == kResidualKeys || part == kResidualValues || part == kResidualPositions)) {
      continue;  // (copied out: written back by the caller)
    }
    const Head& h = heads_[layer][head % geometry_.n_kv_heads];
    used[i] = part_bytes(part, shape_of(h));
  }
  return used;
}

char* DeviceKivi::slice(uint32_t layer, uint32_t head, Part part) const {
  return base() + layout_.at(layer, size_t(head) * kParts + part).offset;
}

void DeviceKivi::relayout(const std::vector<Capacity>& capacity, bool except_planned,
                          int64_t residual_of) {
  const Context::DeviceScope on_device(ctx_);
  const cuda::ArenaPartition next = layout_for(capacity);
  // Room first (throws KVSDK_E_BUDGET with nothing of this store changed).
  regions_.grow(this, std::max(next.reserved, layout_.reserved));
  char* const at = base();
  for (const cuda::ArenaCopy& c :
       cuda::plan_repartition(layout_, next, used_bytes(except_planned, residual_of))) {
    device_.copy(at + c.dst, at + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

std::vector<DeviceKivi::Capacity> DeviceKivi::tight_capacity() const {
  std::vector<Capacity> capacity(capacity_.size());
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      capacity[index(l, h)] = shape_of(heads_[l][h]);
    }
  }
  return capacity;
}

std::vector<DeviceKivi::Capacity> DeviceKivi::with_plans(std::vector<Capacity> capacity) const {
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    if (!planned_active_[l]) continue;
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      capacity[index(l, h)] = planned_need_[index(l, h)];
    }
  }
  return capacity;
}

uint64_t DeviceKivi::bytes_after_plans() const {
  if (std::find(planned_active_.begin(), planned_active_.end(), 1) == planned_active_.end()) {
    return 0;
  }
  return layout_for(with_plans(capacity_)).reserved;
}

void DeviceKivi::reserve(uint32_t layer, const std::vector<Capacity>& need) {
  bool fits = true;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    fits = fits && capacity_[index(layer, h)].covers(need[h]);
  }
  if (fits) return;
  std::vector<Capacity> next = capacity_;
  // A residual never holds more than R + G - 1 rows after an append (KiviHeadStore).
  const uint64_t window = uint64_t(config_.residual) + config_.group - 1;
  const auto grow = [](uint64_t have, uint64_t want) {
    return want > have ? uint64_t(grown_capacity(size_t(have), size_t(want))) : have;
  };
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    Capacity& c = next[index(layer, h)];
    const Capacity& n = need[h];
    c.quantized = grow(c.quantized, n.quantized);
    c.blocks = grow(c.blocks, n.blocks);
    c.starts = n.starts > c.starts ? std::max(n.starts, c.blocks) : c.starts;
    if (n.residual > c.residual) {
      c.residual = std::max<uint64_t>(
          n.residual, std::min<uint64_t>(window, grown_capacity(size_t(c.residual), n.residual)));
    }
  }
  const uint64_t room = regions_.room_for(this);
  if (layout_for(next).reserved > room) {
    // Growth by half does not fit: every head what it holds (these what they need) plus an
    // equal share of the room left, in key blocks of G tokens and residual rows up to the
    // window, the most that fits (relayout refuses when not even the needs fit). Exactly the
    // needs would re-lay the arena at every append or block flush, moving every slice behind
    // by a row or a block in overlapping chunks (as DeviceRows::reserve_rows).
    std::vector<Capacity> base = tight_capacity();
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      base[index(layer, h)] = base[index(layer, h)].max(need[h]);
    }
    // Extra residual rows first (up to the window, which bounds the rows between flushes),
    // then, with full windows, extra key blocks.
    const auto with_extra = [&](uint64_t rows, uint64_t blocks) {
      std::vector<Capacity> c = base;
      for (Capacity& x : c) {
        x.quantized += blocks * config_.group;
        x.blocks += blocks;
        if (x.starts) x.starts += blocks;
        x.residual = std::max(x.residual, std::min(window, x.residual + rows));
      }
      return c;
    };
    const auto fits_with = [&](uint64_t rows, uint64_t blocks) {
      return layout_for(with_extra(rows, blocks)).reserved <= room;
    };
    const uint64_t rows = largest_fitting(window, [&](uint64_t r) { return fits_with(r, 0); });
    const uint64_t blocks = rows < window ? 0 : largest_fitting(uint64_t(1) << 24, [&](uint64_t b) {
      return fits_with(rows, b);
    });
    next = with_extra(rows, blocks);
  }
  relayout(next);
}

uint64_t DeviceKivi::shrink_to_fit() {
  if (failed_) return layout_.reserved;
  const std::vector<Capacity> capacity = tight_capacity();
  if (!(capacity == capacity_)) relayout(capacity);  // (within the region: it only shrinks)
  // A planned eviction's commit re-lays the region to its plans: that room stays.
  return std::max(layout_.reserved, bytes_after_plans());
}

// --- Bytes -----------------------------------------------------------------------------------

void DeviceKivi::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (const Head& h : heads_[layer]) {
    const cpu::KiviBytes b = cpu::KiviHeadStore::bytes_for(
        geometry_.head_dim, config_, h.quantized, h.blocks(config_.group), h.residual(),
        h.ragged());
    by_tier[KVSDK_TIER_QUANTIZED] += b.codes + b.scales_zeros;
    by_tier[KVSDK_TIER_EXACT] += b.residual;  // the f16 residual window is exact
    by_tier[KVSDK_TIER_METADATA] += b.positions;
  }
}

uint64_t DeviceKivi::append_bound(uint32_t layer, size_t n_tokens) const {
  const size_t G = config_.group;
  uint64_t grow = 0;
  for (const Head& h : heads_[layer]) {
    const size_t q = h.quantized, r = h.residual(), blocks = h.blocks(G);
    const size_t f = cpu::KiviHeadStore::flushed_tokens(config_, r, n_tokens);
    const uint64_t before =
        cpu::KiviHeadStore::bytes_for(geometry_.head_dim, config_, q, blocks, r, h.ragged())
            .total();
    const uint64_t after = cpu::KiviHeadStore::bytes_for(geometry_.head_dim, config_, q + f,
                                                         blocks + f / G, r + n_tokens - f,
                                                         h.ragged())
                               .total();
    grow += after > before ? after - before : 0;
  }
  return grow;
}

uint64_t DeviceKivi::layer_token_bytes(uint64_t extra_per_row) const {
  return kivi_layer_token_bytes(geometry_, config_, extra_per_row);
}

uint64_t DeviceKivi::layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const {
  return kivi_layer_token_capacity(geometry_, config_, bytes, extra_per_row);
}

// --- Append ----------------------------------------------------------------------------------

void DeviceKivi::append(uint32_t layer, size_t n, const float* k, const float* v,
                        const int32_t* positions) {
  check_usable();
  if (n == 0) return;
  const Context::DeviceScope on_device(ctx_);
  const size_t dim = geometry_.head_dim, G = config_.group;
  // Everything that can fail before the store changes: host staging and mirrors, device working
  // memory, then the arena's room (a re-plan only moves rows). Per head (heads of an overlay
  // hold different tokens), KiviHeadStore::append's flushes in closed form: the first f of the
  // residual rows followed by the appended rows are quantized, G at a time; the rest is the new
  // residual. Where: on the device when the flushed rows all sit in its residual window already
  // (every decode step's flush), else on the host, which has the appended ones (a prefill chunk)
  // and copies the residual rows out first. Both give the CPU store's bits.
  need_.resize(geometry_.n_kv_heads);
  size_t most_staged = 0, most_residual = 0, most_host_flush = 0;
  bool device_flush = false;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    Head& head = heads_[layer][h];
    const size_t q = head.quantized, r = head.residual(), blocks = head.blocks(G);
    const size_t f = cpu::KiviHeadStore::flushed_tokens(config_, r, n);
    const bool flush_here = f > 0 && f <= r;  // on the device
    device_flush = device_flush || flush_here;
    if (!flush_here) most_host_flush = std::max(most_host_flush, f);
    most_staged = std::max(most_staged, (flush_here ? 0 : std::min(r, f)) + n);
    most_residual = std::max(most_residual, r);
    need_[h] = {q + f, r + n - f, blocks + f / G, head.ragged() ? blocks + f / G : 0};
    reserve_for_growth(head.positions, head.positions.size() + n);
    if (head.ragged()) reserve_for_growth(head.block_tokens, blocks + f / G);
  }
  reserve_for_growth(stage_positions_, most_residual + n);
  reserve_for_growth(stage_starts_, (most_residual + n) / G + 1);
  // Room: the layer's slices must hold its rows before and after the append at once (a flush
  // reads residual rows into the quantized slices before the kept ones move down). When that
  // does not fit (an arena as full as the budget), the residual windows go through the host
  // instead: copied out, the arena re-laid to exactly what the layer needs after the append
  // (the same bytes the budget charges), every flush quantized on the host and the new windows
  // copied back in. Both give the same bytes.
  bool via_host = false;
  try {
    reserve(layer, need_);
  } catch (const Error& e) {
    if (e.status() != KVSDK_E_BUDGET) throw;
    via_host = true;
  }
  const size_t per_head = (via_host ? most_residual + n : most_staged) * dim;
  // A staging slot per head: the heads' rows between flushes go to the device as one batch.
  grown(stage_k_, geometry_.n_kv_heads * per_head);
  grown(stage_v_, geometry_.n_kv_heads * per_head);
  reserve_for_growth(batch_, 3 * size_t(geometry_.n_kv_heads));
  if (via_host) most_host_flush = std::max(most_host_flush, most_residual + n);
  if (device_flush && !via_host) flush_.at_least(2 * G * dim * sizeof(float));
  if (most_host_flush > 0) {
    grown(block_k_, G * dim);
    grown(block_v_, G * dim);
    grown(codes_k_, most_host_flush * row_bytes_);
    grown(codes_v_, most_host_flush * row_bytes_);
    grown(k_scale_, most_host_flush / G * dim);
    grown(k_zero_, most_host_flush / G * dim);
    grown(v_scale_, most_host_flush * groups_);
    grown(v_zero_, most_host_flush * groups_);
  }
  if (via_host) {
    const size_t row = dim * sizeof(uint16_t);
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      const size_t r = heads_[layer][h].residual();
      if (r == 0) continue;
      device_.to_host(stage_k_.data() + h * per_head, slice(layer, h, kResidualKeys), r * row);
      device_.to_host(stage_v_.data() + h * per_head, slice(layer, h, kResidualValues), r * row);
    }
    std::vector<Capacity> next = tight_capacity();
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) next[index(layer, h)] = need_[h];
    relayout(next, /*except_planned=*/false, /*residual_of=*/int64_t(layer));  // may throw BUDGET
  }
  changed();
  batch_.clear();
  try {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      append_head(layer, h, n, k, v, positions, stage_k_.data() + h * per_head,
                  stage_v_.data() + h * per_head, via_host);
    }
    backend::to_backend_all(device_, batch_.data(), batch_.size());
  } catch (...) {
    if (via_host) failed_ = true;  // (the windows were re-laid: the layer's rows are lost)
    throw;
  }
  // The mirrors once every head is written (a failure before leaves them as they were; capacity
  // reserved above).
  for (Head& head : heads_[layer]) {
    const size_t f = cpu::KiviHeadStore::flushed_tokens(config_, head.residual(), n);
    head.positions.insert(head.positions.end(), positions, positions + n);
    if (head.ragged()) head.block_tokens.insert(head.block_tokens.end(), f / G, uint32_t(G));
    head.quantized += f;
  }
}

void DeviceKivi::append_head(uint32_t layer, uint32_t h, size_t n, const float* k, const float* v,
                             const int32_t* positions, uint16_t* sk, uint16_t* sv,
                             bool residual_staged) {
  const size_t dim = geometry_.head_dim, G = config_.group, row = dim * sizeof(uint16_t);
  Head& head = heads_[layer][h];
  const size_t q = head.quantized, r = head.residual(), blocks = head.blocks(G);
  const size_t f = cpu::KiviHeadStore::flushed_tokens(config_, r, n);
  const size_t new_r = r + n - f;
  // residual_staged: the whole window is on the host already (sk, sv) and its slices are empty.
  const bool flush_on_device = !residual_staged && f > 0 && f <= r;
  const size_t staged_old = residual_staged ? r : flush_on_device ? 0 : std::min(r, f);
  // The positions of the residual rows and the appended ones, in order (capacity reserved).
  std::vector<int32_t>& all = stage_positions_;
  all.assign(head.positions.begin() + ptrdiff_t(q), head.positions.end());
  all.insert(all.end(), positions, positions + n);
  const size_t stride = geometry_.kv_elems_per_token(), u16 = sizeof(uint16_t);
  // 1. The rows in token order as f16 on the host: the residual rows a host flush takes, then
  //    the appended rows rounded as KiviHeadStore::append rounds them.
  if (staged_old > 0 && !residual_staged) {
    device_.to_host(sk, slice(layer, h, kResidualKeys), staged_old * row);
    device_.to_host(sv, slice(layer, h, kResidualValues), staged_old * row);
  }
  for (size_t t = 0; t < n; ++t) {
    const float* kr = k + t * stride + size_t(h) * dim;
    const float* vr = v + t * stride + size_t(h) * dim;
    uint16_t* ko = sk + (staged_old + t) * dim;
    uint16_t* vo = sv + (staged_old + t) * dim;
    for (size_t i = 0; i < dim; ++i) {
      ko[i] = f32_to_f16(kr[i]);
      vo[i] = f32_to_f16(vr[i]);
    }
  }
  // 2. The flushed blocks quantized (KiviHeadStore's flush, the CPU's functions or the device
  //    kernels that give their bits) into the arena past what the head holds: nothing it holds
  //    has changed yet. Each flush is a full block of G, after any ragged ones.
  char* const kc = slice(layer, h, kKeyCodes) + q * row_bytes_;
  char* const vc = slice(layer, h, kValueCodes) + q * row_bytes_;
  char* const ks = slice(layer, h, kKeyScales) + blocks * dim * u16;
  char* const kz = slice(layer, h, kKeyZeros) + blocks * dim * u16;
  char* const vs = slice(layer, h, kValueScales) + q * groups_ * u16;
  char* const vz = slice(layer, h, kValueZeros) + q * groups_ * u16;
  const auto as_u8 = [](char* p) { return reinterpret_cast<uint8_t*>(p); };
  const auto as_u16 = [](char* p) { return reinterpret_cast<uint16_t*>(p); };
  if (flush_on_device) {
    float* const flush_rows = static_cast<float*>(flush_.at_least(2 * G * dim * sizeof(float)));
    const auto* rk = reinterpret_cast<const uint16_t*>(slice(layer, h, kResidualKeys));
    const auto* rv = reinterpret_cast<const uint16_t*>(slice(layer, h, kResidualValues));
    for (size_t b = 0; b < f / G; ++b) {
      device_.f16_to_f32(rk + b * G * dim, G * dim, flush_rows);  // exact
      device_.f16_to_f32(rv + b * G * dim, G * dim, flush_rows + G * dim);
      device_.kivi_quantize_keys(flush_rows, G, dim, config_.bits, as_u8(kc + b * G * row_bytes_),
                                 as_u16(ks + b * dim * u16), as_u16(kz + b * dim * u16));
      device_.kivi_quantize_values(flush_rows + G * dim, G, dim, G, config_.bits,
                                   as_u8(vc + b * G * row_bytes_),
                                   as_u16(vs + b * G * groups_ * u16),
                                   as_u16(vz + b * G * groups_ * u16));
    }
  } else if (f > 0) {
    for (size_t b = 0; b < f / G; ++b) {
      f16_to_f32_array(sk + b * G * dim, block_k_.data(), G * dim);  // exact
      f16_to_f32_array(sv + b * G * dim, block_v_.data(), G * dim);
      cpu::kivi_quantize_keys(block_k_.data(), G, dim, config_.bits,
                              codes_k_.data() + b * G * row_bytes_, k_scale_.data() + b * dim,
                              k_zero_.data() + b * dim);
      cpu::kivi_quantize_values(block_v_.data(), G, dim, G, config_.bits,
                                codes_v_.data() + b * G * row_bytes_,
                                v_scale_.data() + b * G * groups_,
                                v_zero_.data() + b * G * groups_);
    }
    const backend::HostCopy blocks_out[] = {
        {kc, codes_k_.data(), f * row_bytes_},          {vc, codes_v_.data(), f * row_bytes_},
        {ks, k_scale_.data(), f / G * dim * u16},      {kz, k_zero_.data(), f / G * dim * u16},
        {vs, v_scale_.data(), f * groups_ * u16},      {vz, v_zero_.data(), f * groups_ * u16}};
    backend::to_backend_all(device_, blocks_out, 6);
  }
  if (f > 0) {
    stage_starts_.clear();  // the new full blocks' starts (ragged heads keep them)
    if (head.ragged()) {
      for (size_t b = 0; b < f / G; ++b) stage_starts_.push_back(uint32_t(q + b * G));
    }
    const backend::HostCopy meta[] = {
        {slice(layer, h, kQuantPositions) + q * sizeof(int32_t), all.data(), f * sizeof(int32_t)},
        {slice(layer, h, kBlockStarts) + blocks * sizeof(uint32_t), stage_starts_.data(),
         stage_starts_.size() * sizeof(uint32_t)}};
    backend::to_backend_all(device_, meta, head.ragged() ? 2 : 1);
  }
  // 3. The residual window. Without a flush the rows go after the held ones; with one, the rows
  //    it keeps move down on the device (after the kernels that read them: transfers wait for
  //    the compute stream) and a device failure there loses the head's residual: the store then
  //    refuses every call.
  try {
    char* rk = slice(layer, h, kResidualKeys);
    char* rv = slice(layer, h, kResidualValues);
    char* rp = slice(layer, h, kResidualPositions);
    if (residual_staged) {  // the new window is rows [f, r + n) of the staging
      if (new_r > 0) {
        const backend::HostCopy window[] = {{rk, sk + f * dim, new_r * row},
                                            {rv, sv + f * dim, new_r * row},
                                            {rp, all.data() + f, new_r * sizeof(int32_t)}};
        backend::to_backend_all(device_, window, 3);
      }
    } else if (f == 0) {  // a decode step between flushes: in append()'s batch of every head
      batch_.push_back({rk + r * row, sk, n * row});
      batch_.push_back({rv + r * row, sv, n * row});
      batch_.push_back({rp + r * sizeof(int32_t), positions, n * sizeof(int32_t)});
    } else {
      if (f < r) {  // residual rows [f, r) stay, at [0, r - f); then every appended row
        for (char* part : {rk, rv}) {
          cuda::move_in_chunks(0, f * row, (r - f) * row, [&](uint64_t d, uint64_t s, uint64_t b) {
            device_.copy(part + d, part + s, size_t(b));
          });
        }
        const backend::HostCopy rows[] = {{rk + (r - f) * row, sk + staged_old * dim, n * row},
                                          {rv + (r - f) * row, sv + staged_old * dim, n * row},
                                          {rp, all.data() + f, new_r * sizeof(int32_t)}};
        backend::to_backend_all(device_, rows, 3);
      } else if (new_r > 0) {  // only appended rows stay: [f - r, n)
        const backend::HostCopy rows[] = {
            {rk, sk + (staged_old + f - r) * dim, new_r * row},
            {rv, sv + (staged_old + f - r) * dim, new_r * row},
            {rp, all.data() + f, new_r * sizeof(int32_t)}};
        backend::to_backend_all(device_, rows, 3);
      }
    }
  } catch (...) {
    if (f > 0) failed_ = true;  // (without a flush only rows past the held ones were written)
    throw;
  }
}

// --- Attention and reads ----------------------------------------------------------------------

void DeviceKivi::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, kv_head, 1, q_rows, row_positions, n_rows, out);
}

void DeviceKivi::attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                              const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, 0, n_kv, q_rows, row_positions, n_rows, out);
}

void DeviceKivi::attend_range(uint32_t layer, uint32_t first_head, uint32_t n_heads,
                              const float* q_rows, const int32_t* row_positions, size_t n_rows,
                              float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  queries_.attend_heads(
      query_rows(q_rows, row_positions, n_rows), first_head, n_heads, geometry_.group_size(), out,
      [&](uint32_t kv_head, const backend::QueryRows& q, float* device_out) {
        const DeviceView view = device_view(layer, kv_head);
        device_.attend_kivi_tier(q, view.tier, view.residual, workspace(), device_out);
      });
}

DeviceKivi::DeviceView DeviceKivi::device_view(uint32_t layer, uint32_t kv_head) const {
  const auto u8 = [&](Part p) {
    return reinterpret_cast<const uint8_t*>(slice(layer, kv_head, p));
  };
  const auto u16 = [&](Part p) {
    return reinterpret_cast<const uint16_t*>(slice(layer, kv_head, p));
  };
  const auto i32 = [&](Part p) {
    return reinterpret_cast<const int32_t*>(slice(layer, kv_head, p));
  };
  const Head& head = heads_[layer][kv_head];
  DeviceView view;
  backend::KiviTier& tier = view.tier;
  tier.k_codes = u8(kKeyCodes);
  tier.v_codes = u8(kValueCodes);
  tier.k_scale = u16(kKeyScales);
  tier.k_zero = u16(kKeyZeros);
  tier.v_scale = u16(kValueScales);
  tier.v_zero = u16(kValueZeros);
  tier.positions = i32(kQuantPositions);
  tier.tokens = head.quantized;
  tier.bits = config_.bits;
  tier.group = config_.group;
  tier.residual = config_.residual;
  tier.weight_bits = config_.weight_bits;
  if (head.ragged()) {
    tier.block_starts = reinterpret_cast<const uint32_t*>(slice(layer, kv_head, kBlockStarts));
    tier.blocks = head.block_tokens.size();
  }
  view.residual = {u16(kResidualKeys), u16(kResidualValues), i32(kResidualPositions),
                   head.residual()};
  return view;
}

cpu::KiviHeadStore DeviceKivi::stage_head(uint32_t layer, uint32_t kv_head) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const Head& head = heads_[layer][kv_head];
  const size_t q = head.quantized, r = head.residual(), dim = geometry_.head_dim;
  const size_t blocks = head.blocks(config_.group);
  const auto down = [&](auto& into, size_t elems, Part part) {
    into.resize(elems);
    if (elems) device_.to_host(into.data(), slice(layer, kv_head, part), elems * sizeof(into[0]));
  };
  cpu::KiviHeadBuffers b;
  b.quantized_tokens = q;
  b.block_tokens = head.block_tokens;
  b.positions = head.positions;
  down(b.key_codes, q * row_bytes_, kKeyCodes);
  down(b.value_codes, q * row_bytes_, kValueCodes);
  down(b.key_scales, blocks * dim, kKeyScales);
  down(b.key_zeros, blocks * dim, kKeyZeros);
  down(b.value_scales, q * groups_, kValueScales);
  down(b.value_zeros, q * groups_, kValueZeros);
  down(b.residual_keys, r * dim, kResidualKeys);
  down(b.residual_values, r * dim, kResidualValues);
  return cpu::KiviHeadStore::restore(dim, config_, std::move(b));
}

void DeviceKivi::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                      int32_t* positions) const {
  read_head_store(stage_head(layer, kv_head), geometry_.head_dim, k, v, positions);
}

// --- Snapshots and truncation ------------------------------------------------------------------

std::vector<TierRecord> DeviceKivi::save(uint32_t layer) const {
  std::vector<cpu::KiviHeadStore> heads;
  heads.reserve(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) heads.push_back(stage_head(layer, h));
  return kivi_layer_to_records(layer, heads);
}

void DeviceKivi::upload_head(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& s) {
  const auto up = [&](Part part, const auto& from) {
    if (!from.empty()) {
      device_.to_backend(slice(layer, kv_head, part), from.data(), from.size() * sizeof(from[0]));
    }
  };
  up(kKeyCodes, s.key_codes());
  up(kValueCodes, s.value_codes());
  up(kKeyScales, s.key_scales());
  up(kKeyZeros, s.key_zeros());
  up(kValueScales, s.value_scales());
  up(kValueZeros, s.value_zeros());
  up(kResidualKeys, s.residual_keys());
  up(kResidualValues, s.residual_values());
  const std::vector<int32_t>& p = s.positions();
  const size_t q = s.quantized_tokens();
  if (q) device_.to_backend(slice(layer, kv_head, kQuantPositions), p.data(), q * sizeof(int32_t));
  if (p.size() > q) {
    device_.to_backend(slice(layer, kv_head, kResidualPositions), p.data() + q,
                       (p.size() - q) * sizeof(int32_t));
  }
  const std::vector<uint32_t>& counts = s.block_token_counts();
  if (!counts.empty()) {  // the blocks' starts, from their counts
    stage_starts_.resize(counts.size());  // (capacity: plan_keep / restore reserved it)
    uint32_t start = 0;
    for (size_t b = 0; b < counts.size(); ++b) {
      stage_starts_[b] = start;
      start += counts[b];
    }
    device_.to_backend(slice(layer, kv_head, kBlockStarts), stage_starts_.data(),
                       counts.size() * sizeof(uint32_t));
  }
}

void DeviceKivi::mirror_head(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& s) {
  Head& head = heads_[layer][kv_head];
  head.positions.assign(s.positions().begin(), s.positions().end());
  head.quantized = s.quantized_tokens();
  head.block_tokens.assign(s.block_token_counts().begin(), s.block_token_counts().end());
}

void DeviceKivi::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  check_usable();
  restore_heads(layer, kivi_layer_from_records(geometry_, config_, layer, records));
}

void DeviceKivi::restore_heads(uint32_t layer, const std::vector<cpu::KiviHeadStore>& heads) {
  check_usable();
  for (const Head& h : heads_[layer]) {
    KVSDK_REQUIRE(h.positions.empty(), "restore into a layer that holds rows");
  }
  if (heads.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_INTERNAL, "restore_heads: ", heads.size(), " heads for ", geometry_.n_kv_heads);
  }
  const Context::DeviceScope on_device(ctx_);
  std::vector<Capacity> need(geometry_.n_kv_heads);
  size_t most_blocks = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    need[h] = shape_of(heads[h]);
    most_blocks = std::max<size_t>(most_blocks, need[h].starts);
  }
  reserve_for_growth(stage_starts_, most_blocks);
  reserve(layer, need);
  changed();
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) upload_head(layer, h, heads[h]);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) mirror_head(layer, h, heads[h]);
}

std::string DeviceKivi::truncate_refusal(uint32_t layer, int32_t position) const {
  for (const Head& head : heads_[layer]) {
    const std::vector<int32_t>& p = head.positions;
    const size_t q = head.quantized;
    // KiviHeadStore::can_remove_from: only rows appended since the last flush can go.
    const size_t first_free = q == 0 ? 0 : q + size_t(config_.residual);
    for (size_t t = 0; t < std::min(first_free, p.size()); ++t) {
      if (p[t] >= position) return kivi_flush_refusal(layer, position, head.residual(), config_);
    }
    const auto first =
        std::find_if(p.begin(), p.end(), [&](int32_t x) { return x >= position; });
    if (std::any_of(first, p.end(), [&](int32_t x) { return x < position; })) {
      return "a device cache truncates only its newest rows, and layer " + std::to_string(layer) +
             " holds rows at positions below " + std::to_string(position) + " after some above";
    }
  }
  return {};
}

void DeviceKivi::truncate(uint32_t layer, int32_t position) noexcept {
  // A suffix of each head's residual rows (truncate_refusal): only the counts change.
  for (Head& head : heads_[layer]) {
    std::vector<int32_t>& p = head.positions;
    const auto first = std::find_if(p.begin(), p.end(), [&](int32_t x) { return x >= position; });
    p.resize(size_t(first - p.begin()));
  }
  changed();
}

// --- Eviction (the '+kiviN' overlays) ----------------------------------------------------------

bool DeviceKivi::column_sums_here(uint32_t layer, uint32_t kv_head, const backend::QueryRows& q,
                                  const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                                  size_t n_keys, float* col_sums) const {
  if (!device_.column_sums_rows) return false;
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const DeviceView view = device_view(layer, kv_head);
  const size_t held = view.tier.tokens + view.residual.n_tokens;
  scoring_.score(q, keys, key_pos, held, n_keys, col_sums,
                 [&](const backend::QueryRows& dq, const float* tail, const int32_t* tail_pos,
                     size_t n_tail, float* cols) {
                   device_.column_sums_rows(dq, &view.tier, view.residual, tail, tail_pos, n_tail,
                                            workspace(), cols);
                 });
  return true;
}

void DeviceKivi::load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                           float* dst) const {
  // The selection stage reads a head's keys in chunks: the head is copied out once (per change).
  if (!keys_copy_ || keys_version_ != version_ || keys_layer_ != layer || keys_head_ != kv_head) {
    keys_copy_ = std::make_unique<cpu::KiviHeadStore>(stage_head(layer, kv_head));
    keys_layer_ = layer;
    keys_head_ = kv_head;
    keys_version_ = version_;
  }
  keys_copy_->read_rows(first, count, dst, nullptr);
}

uint64_t DeviceKivi::plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                               const IncomingRows* in) {
  check_usable();
  if (keep.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_INTERNAL, "plan_keep: ", keep.size(), " heads for ", geometry_.n_kv_heads);
  }
  std::vector<cpu::KiviHeadStore>& built = planned_[layer];
  planned_active_[layer] = 0;  // (replaced: a throw below leaves nothing planned)
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) planned_need_[index(layer, h)] = {};
  built.clear();
  uint64_t bytes = 0;
  std::vector<Capacity> need(geometry_.n_kv_heads);
  size_t most_blocks = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    // KiviRepresentation's plan on the head's host copy.
    cpu::KiviHeadStore out = stage_head(layer, h);
    kivi_keep_head(out, keep[h], in, geometry_, h, keep_scratch_);
    bytes += out.bytes().total();
    need[h] = shape_of(out);
    most_blocks = std::max<size_t>(most_blocks, need[h].starts);
    // The mirror's capacity now, so that commit_keep does not allocate.
    Head& head = heads_[layer][h];
    head.positions.reserve(out.size());
    head.block_tokens.reserve(out.block_token_counts().size());
    built.push_back(std::move(out));
  }
  reserve_for_growth(stage_starts_, most_blocks);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) planned_need_[index(layer, h)] = need[h];
  planned_active_[layer] = 1;
  try {
    // Room for the layout the commit makes (the other layers as they are, the planned ones
    // exactly their plans) where the arena has it now; the held rows stay where they are until
    // then (the plan may be dropped), so the region holds the larger of both. A plan of one
    // layer among several may not fit beside the others' held rows (they shrink with their own
    // plans): then the commit makes the room, from the budget's own accounting (the rows the
    // budget admits after every plan fit the arena exactly).
    const Context::DeviceScope on_device(ctx_);
    const uint64_t after = bytes_after_plans();
    if (after <= regions_.room_for(this)) regions_.grow(this, std::max(layout_.reserved, after));
  } catch (const Error& e) {
    if (e.status() != KVSDK_E_BUDGET) {
      planned_active_[layer] = 0;
      for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) planned_need_[index(layer, h)] = {};
      throw;
    }
  }
  return bytes;
}

void DeviceKivi::commit_keep() noexcept {
  if (std::find(planned_active_.begin(), planned_active_.end(), 1) == planned_active_.end()) {
    return;
  }
  changed();
  try {
    const Context::DeviceScope on_device(ctx_);
    // The layout after the plans, tight (room made by plan_keep where it could; the budget
    // admits these bytes): the other layers' rows move, the planned layers' are replaced whole.
    relayout(with_plans(tight_capacity()), /*except_planned=*/true);
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      if (!planned_active_[l]) continue;
      for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
        upload_head(l, h, planned_[l][h]);
        mirror_head(l, h, planned_[l][h]);
      }
    }
  } catch (...) {
    failed_ = true;  // (a head may hold part of its plan: the store refuses every call)
  }
  drop_keep();
}

void DeviceKivi::drop_keep() noexcept {
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    planned_active_[l] = 0;
    planned_[l].clear();
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) planned_need_[index(l, h)] = {};
  }
}

}  // namespace kvsdk
