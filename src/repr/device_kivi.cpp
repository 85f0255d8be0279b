#include "repr/device_kivi.h"

#include <algorithm>

#include "kivi_quant.h"
#include "repr/head_store.h"
#include "repr/kivi_repr.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk {

namespace {

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

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
      flush_(ctx.ops()),
      config_(kivi_config(p)),
      capacity_(g.n_layers),
      positions_(g.n_layers),
      quantized_(g.n_layers, 0) {
  KVSDK_REQUIRE(p.quant_bits != 0, "KIVI stores need quant_bits 1, 2, 4 or 8 (got 0)");
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    fail(KVSDK_E_UNSUPPORTED, "a ", device_.name, " cache needs head_dim 64, 128 or 256 (the ",
         "device attention kernel's), not ", g.head_dim);
  }
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

uint64_t DeviceKivi::part_bytes(Part part, uint64_t tokens, uint64_t rows) const {
  const uint64_t dim = geometry_.head_dim;
  switch (part) {
    case kKeyCodes:
    case kValueCodes: return tokens * row_bytes_;
    case kKeyScales:
    case kKeyZeros: return tokens / config_.group * dim * sizeof(uint16_t);
    case kValueScales:
    case kValueZeros: return tokens * groups_ * sizeof(uint16_t);
    case kQuantPositions: return tokens * sizeof(int32_t);
    case kResidualKeys:
    case kResidualValues: return rows * dim * sizeof(uint16_t);
    case kResidualPositions: return rows * sizeof(int32_t);
    case kParts: break;
  }
  return 0;
}

cuda::ArenaPartition DeviceKivi::layout_for(const std::vector<Capacity>& capacity) const {
  cuda::ArenaPartition p;
  p.tiers = size_t(geometry_.n_kv_heads) * kParts;
  p.slices.resize(capacity.size() * p.tiers);
  uint64_t offset = 0;  // slices in index order: offsets ascend with the index
  for (size_t i = 0; i < p.slices.size(); ++i) {
    const Capacity& c = capacity[i / p.tiers];
    const uint64_t bytes = round_up(part_bytes(Part(i % kParts), c.quantized, c.residual), 16);
    p.slices[i] = {offset, bytes};
    offset += bytes;
  }
  p.reserved = offset;
  return p;
}

std::vector<uint64_t> DeviceKivi::used_bytes() const {
  std::vector<uint64_t> used(layout_.slices.size());
  for (size_t i = 0; i < used.size(); ++i) {
    const uint32_t l = uint32_t(i / layout_.tiers);
    used[i] = part_bytes(Part(i % kParts), quantized(l), residual(l));
  }
  return used;
}

char* DeviceKivi::slice(uint32_t layer, uint32_t head, Part part) const {
  return base() + layout_.at(layer, size_t(head) * kParts + part).offset;
}

void DeviceKivi::relayout(const std::vector<Capacity>& capacity) {
  const Context::DeviceScope on_device(ctx_);
  const cuda::ArenaPartition next = layout_for(capacity);
  // Room first (throws KVSDK_E_BUDGET with nothing of this store changed).
  regions_.grow(this, std::max(next.reserved, layout_.reserved));
  char* const at = base();
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(layout_, next, used_bytes())) {
    device_.copy(at + c.dst, at + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

std::vector<DeviceKivi::Capacity> DeviceKivi::tight_capacity() const {
  std::vector<Capacity> capacity(geometry_.n_layers);
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) capacity[l] = {quantized(l), residual(l)};
  return capacity;
}

void DeviceKivi::reserve(uint32_t layer, uint64_t tokens, uint64_t rows) {
  const Capacity& now = capacity_[layer];
  if (tokens <= now.quantized && rows <= now.residual) return;
  std::vector<Capacity> next = capacity_;
  Capacity& c = next[layer];
  // A residual never holds more than R + G - 1 rows after an append (KiviHeadStore).
  const uint64_t window = uint64_t(config_.residual) + config_.group - 1;
  if (tokens > c.quantized) {
    c.quantized = round_up(grown_capacity(size_t(c.quantized), size_t(tokens)), config_.group);
  }
  if (rows > c.residual) {
    c.residual = std::max<uint64_t>(rows, std::min<uint64_t>(
                                              window, grown_capacity(size_t(c.residual), rows)));
  }
  if (layout_for(next).reserved > regions_.room_for(this)) {
    // Growth by half does not fit: every layer exactly what it holds, this one what it needs.
    next = tight_capacity();
    next[layer].quantized = std::max(next[layer].quantized, tokens);
    next[layer].residual = std::max(next[layer].residual, rows);
  }
  relayout(next);
}

uint64_t DeviceKivi::shrink_to_fit() {
  if (failed_) return layout_.reserved;
  const std::vector<Capacity> capacity = tight_capacity();
  if (!(capacity == capacity_)) relayout(capacity);  // (within the region: it only shrinks)
  return layout_.reserved;
}

// --- Bytes -----------------------------------------------------------------------------------

void DeviceKivi::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  const size_t q = quantized(layer);
  const cpu::KiviBytes b = cpu::KiviHeadStore::bytes_for(geometry_.head_dim, config_, q,
                                                         q / config_.group, residual(layer), false);
  const uint64_t heads = geometry_.n_kv_heads;
  by_tier[KVSDK_TIER_QUANTIZED] += heads * (b.codes + b.scales_zeros);
  by_tier[KVSDK_TIER_EXACT] += heads * b.residual;  // the f16 residual window is exact
  by_tier[KVSDK_TIER_METADATA] += heads * b.positions;
}

uint64_t DeviceKivi::append_bound(uint32_t layer, size_t n_tokens) const {
  const size_t q = quantized(layer), r = residual(layer), G = config_.group;
  const size_t f = cpu::KiviHeadStore::flushed_tokens(config_, r, n_tokens);
  const uint64_t before =
      cpu::KiviHeadStore::bytes_for(geometry_.head_dim, config_, q, q / G, r, false).total();
  const uint64_t after = cpu::KiviHeadStore::bytes_for(geometry_.head_dim, config_, q + f,
                                                       (q + f) / G, r + n_tokens - f, false)
                             .total();
  return after > before ? uint64_t(geometry_.n_kv_heads) * (after - before) : 0;
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
  const size_t dim = geometry_.head_dim, G = config_.group, row = dim * sizeof(uint16_t);
  const size_t q = quantized(layer), r = residual(layer);
  // KiviHeadStore::append's flushes in closed form: the first f of the residual rows followed by
  // the appended rows are quantized, G at a time; the rest is the new residual.
  const size_t f = cpu::KiviHeadStore::flushed_tokens(config_, r, n);
  const size_t new_r = r + n - f;
  // Where the flushed rows are quantized: on the device when they all sit in its residual window
  // already (every decode step's flush), else on the host, which has the appended ones (a
  // prefill chunk) and copies the residual rows out first. Both give the CPU store's bits.
  const bool flush_on_device = f > 0 && f <= r;
  const size_t staged_old = flush_on_device ? 0 : std::min(r, f);  // residual rows copied out
  std::vector<int32_t>& pos = positions_[layer];
  // Everything that can fail before the store changes: host staging and mirrors, device working
  // memory, then the arena's room (a re-plan only moves rows).
  reserve_for_growth(pos, pos.size() + n);
  uint16_t* sk = grown(stage_k_, (staged_old + n) * dim);
  uint16_t* sv = grown(stage_v_, (staged_old + n) * dim);
  // The positions of the residual rows and the appended ones, in order (the same for every head).
  std::vector<int32_t>& all = stage_positions_;
  reserve_for_growth(all, r + n);
  all.assign(pos.begin() + ptrdiff_t(q), pos.end());
  all.insert(all.end(), positions, positions + n);
  float* flush_rows = nullptr;  // device: one block's keys, then its values, as f32
  if (flush_on_device) {
    flush_rows = static_cast<float*>(flush_.at_least(2 * G * dim * sizeof(float)));
  } else if (f > 0) {
    grown(block_k_, G * dim);
    grown(block_v_, G * dim);
    grown(codes_k_, f * row_bytes_);
    grown(codes_v_, f * row_bytes_);
    grown(k_scale_, f / G * dim);
    grown(k_zero_, f / G * dim);
    grown(v_scale_, f * groups_);
    grown(v_zero_, f * groups_);
  }
  reserve(layer, q + f, new_r);
  const size_t stride = geometry_.kv_elems_per_token(), u16 = sizeof(uint16_t);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    // 1. The rows in token order as f16 on the host: the residual rows a host flush takes, then
    //    the appended rows rounded as KiviHeadStore::append rounds them.
    if (staged_old > 0) {
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
    //    kernels that give their bits) into the arena past what the head holds: nothing it
    //    holds has changed yet.
    char* const kc = slice(layer, h, kKeyCodes) + q * row_bytes_;
    char* const vc = slice(layer, h, kValueCodes) + q * row_bytes_;
    char* const ks = slice(layer, h, kKeyScales) + q / G * dim * u16;
    char* const kz = slice(layer, h, kKeyZeros) + q / G * dim * u16;
    char* const vs = slice(layer, h, kValueScales) + q * groups_ * u16;
    char* const vz = slice(layer, h, kValueZeros) + q * groups_ * u16;
    const auto as_u8 = [](char* p) { return reinterpret_cast<uint8_t*>(p); };
    const auto as_u16 = [](char* p) { return reinterpret_cast<uint16_t*>(p); };
    if (flush_on_device) {
      const auto* rk = reinterpret_cast<const uint16_t*>(slice(layer, h, kResidualKeys));
      const auto* rv = reinterpret_cast<const uint16_t*>(slice(layer, h, kResidualValues));
      for (size_t b = 0; b < f / G; ++b) {
        device_.f16_to_f32(rk + b * G * dim, G * dim, flush_rows);  // exact
        device_.f16_to_f32(rv + b * G * dim, G * dim, flush_rows + G * dim);
        device_.kivi_quantize_keys(flush_rows, G, dim, config_.bits,
                                   as_u8(kc + b * G * row_bytes_), as_u16(ks + b * dim * u16),
                                   as_u16(kz + b * dim * u16));
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
      device_.to_backend(kc, codes_k_.data(), f * row_bytes_);
      device_.to_backend(vc, codes_v_.data(), f * row_bytes_);
      device_.to_backend(ks, k_scale_.data(), f / G * dim * u16);
      device_.to_backend(kz, k_zero_.data(), f / G * dim * u16);
      device_.to_backend(vs, v_scale_.data(), f * groups_ * u16);
      device_.to_backend(vz, v_zero_.data(), f * groups_ * u16);
    }
    if (f > 0) {
      device_.to_backend(slice(layer, h, kQuantPositions) + q * sizeof(int32_t), all.data(),
                         f * sizeof(int32_t));
    }
    // 3. The residual window. Without a flush the rows go after the held ones; with one, the
    //    rows it keeps move down on the device (after the kernels that read them: transfers
    //    wait for the compute stream) and a device failure there loses the head's residual: the
    //    store then refuses every call.
    try {
      char* rk = slice(layer, h, kResidualKeys);
      char* rv = slice(layer, h, kResidualValues);
      char* rp = slice(layer, h, kResidualPositions);
      if (f == 0) {
        device_.to_backend(rk + r * row, sk, n * row);
        device_.to_backend(rv + r * row, sv, n * row);
        device_.to_backend(rp + r * sizeof(int32_t), all.data() + r, n * sizeof(int32_t));
        continue;
      }
      if (f < r) {  // residual rows [f, r) stay, at [0, r - f); then every appended row
        for (char* part : {rk, rv}) {
          cuda::move_in_chunks(0, f * row, (r - f) * row, [&](uint64_t d, uint64_t s, uint64_t b) {
            device_.copy(part + d, part + s, size_t(b));
          });
        }
        device_.to_backend(rk + (r - f) * row, sk + staged_old * dim, n * row);
        device_.to_backend(rv + (r - f) * row, sv + staged_old * dim, n * row);
      } else if (new_r > 0) {  // only appended rows stay: [f - r, n)
        device_.to_backend(rk, sk + (staged_old + f - r) * dim, new_r * row);
        device_.to_backend(rv, sv + (staged_old + f - r) * dim, new_r * row);
      }
      if (new_r > 0) device_.to_backend(rp, all.data() + f, new_r * sizeof(int32_t));
    } catch (...) {
      if (f > 0) failed_ = true;  // (without a flush only rows past the held ones were written)
      throw;
    }
  }
  pos.insert(pos.end(), positions, positions + n);
  quantized_[layer] = q + f;
}

// --- Attention and reads ----------------------------------------------------------------------

void DeviceKivi::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows, float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  backend::QueryRows q = queries_.to_device(query_rows(q_rows, row_positions, n_rows));
  q.group = geometry_.group_size();
  const auto u8 = [&](Part p) {
    return reinterpret_cast<const uint8_t*>(slice(layer, kv_head, p));
  };
  const auto u16 = [&](Part p) {
    return reinterpret_cast<const uint16_t*>(slice(layer, kv_head, p));
  };
  const auto i32 = [&](Part p) {
    return reinterpret_cast<const int32_t*>(slice(layer, kv_head, p));
  };
  backend::KiviTier tier;
  tier.k_codes = u8(kKeyCodes);
  tier.v_codes = u8(kValueCodes);
  tier.k_scale = u16(kKeyScales);
  tier.k_zero = u16(kKeyZeros);
  tier.v_scale = u16(kValueScales);
  tier.v_zero = u16(kValueZeros);
  tier.positions = i32(kQuantPositions);
  tier.tokens = quantized(layer);
  tier.bits = config_.bits;
  tier.group = config_.group;
  tier.residual = config_.residual;
  const backend::F16Rows rows{u16(kResidualKeys), u16(kResidualValues), i32(kResidualPositions),
                              residual(layer)};
  device_.attend_kivi_tier(q, tier, rows, workspace(), queries_.device_out());
  queries_.to_host(out);
}

cpu::KiviHeadStore DeviceKivi::stage_head(uint32_t layer, uint32_t kv_head) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t q = quantized(layer), r = residual(layer), dim = geometry_.head_dim;
  const auto down = [&](auto& into, size_t elems, Part part) {
    into.resize(elems);
    if (elems) device_.to_host(into.data(), slice(layer, kv_head, part), elems * sizeof(into[0]));
  };
  cpu::KiviHeadBuffers b;
  b.quantized_tokens = q;
  b.positions = positions_[layer];
  down(b.key_codes, q * row_bytes_, kKeyCodes);
  down(b.value_codes, q * row_bytes_, kValueCodes);
  down(b.key_scales, q / config_.group * dim, kKeyScales);
  down(b.key_zeros, q / config_.group * dim, kKeyZeros);
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
}

void DeviceKivi::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  check_usable();
  KVSDK_REQUIRE(positions_[layer].empty(), "restore into a layer that holds rows");
  const std::vector<cpu::KiviHeadStore> heads =
      kivi_layer_from_records(geometry_, config_, layer, records);
  for (const cpu::KiviHeadStore& s : heads) {
    if (s.ragged()) {
      fail(KVSDK_E_UNSUPPORTED, "snapshot layer ", layer, " holds KIVI blocks an eviction made ",
           "ragged, which a ", device_.name, " cache does not hold yet (load it on the CPU)");
    }
    if (s.positions() != heads[0].positions() ||
        s.quantized_tokens() != heads[0].quantized_tokens()) {
      fail(KVSDK_E_UNSUPPORTED, "snapshot layer ", layer, " holds other tokens in each KV head, ",
           "which a ", device_.name, " KIVI cache does not hold (load it on the CPU)");
    }
  }
  const Context::DeviceScope on_device(ctx_);
  const size_t q = heads[0].quantized_tokens(), n = heads[0].size();
  std::vector<int32_t> mirror(heads[0].positions());
  reserve(layer, q, n - q);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) upload_head(layer, h, heads[h]);
  positions_[layer] = std::move(mirror);
  quantized_[layer] = q;
}

std::string DeviceKivi::truncate_refusal(uint32_t layer, int32_t position) const {
  const std::vector<int32_t>& p = positions_[layer];
  const size_t q = quantized(layer);
  // KiviHeadStore::can_remove_from: only rows appended since the last flush can go.
  const size_t first_free = q == 0 ? 0 : q + size_t(config_.residual);
  for (size_t t = 0; t < std::min(first_free, p.size()); ++t) {
    if (p[t] >= position) return kivi_flush_refusal(layer, position, residual(layer), config_);
  }
  const auto first = std::find_if(p.begin(), p.end(), [&](int32_t x) { return x >= position; });
  if (std::any_of(first, p.end(), [&](int32_t x) { return x < position; })) {
    return "a device cache truncates only its newest rows, and layer " + std::to_string(layer) +
           " holds rows at positions below " + std::to_string(position) + " after some above";
  }
  return {};
}

void DeviceKivi::truncate(uint32_t layer, int32_t position) noexcept {
  // A suffix of the residual rows (truncate_refusal): only the count changes.
  std::vector<int32_t>& p = positions_[layer];
  const auto first = std::find_if(p.begin(), p.end(), [&](int32_t x) { return x >= position; });
  p.resize(size_t(first - p.begin()));
}

}  // namespace kvsdk
