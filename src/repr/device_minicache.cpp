#include "repr/device_minicache.h"

#include <algorithm>
#include <cstring>

#include "repr/minicache_repr.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"

namespace kvsdk {

namespace {

constexpr uint32_t kRetainedBit = cpu::MergedLayerPair::kRetainedBit;
constexpr int kKeys = 0, kValues = 1;

}  // namespace

// --- Capacities ----------------------------------------------------------------------------------

uint64_t DeviceMiniCache::Capacity::rows(Part part) const {
  switch (part) {
    case kKDir: case kKMagPrev: case kKMagCur: return merged[kKeys];
    case kVDir: case kVMagPrev: case kVMagCur: return merged[kValues];
    case kKRetPrev: case kKRetCur: return retained[kKeys];
    case kVRetPrev: case kVRetCur: return retained[kValues];
    case kPendK: case kPendV: case kPendPos: return pending;
    case kKSlots: case kVSlots: case kPositions: return tokens;
    default: return 0;
  }
}

bool DeviceMiniCache::Capacity::covers(const Capacity& o) const {
  return tokens >= o.tokens && pending >= o.pending && merged[0] >= o.merged[0] &&
         merged[1] >= o.merged[1] && retained[0] >= o.retained[0] &&
         retained[1] >= o.retained[1];
}

DeviceMiniCache::Capacity DeviceMiniCache::Capacity::max(const Capacity& o) const {
  Capacity c;
  c.tokens = std::max(tokens, o.tokens);
  c.pending = std::max(pending, o.pending);
  for (int t : {kKeys, kValues}) {
    c.merged[t] = std::max(merged[t], o.merged[t]);
    c.retained[t] = std::max(retained[t], o.retained[t]);
  }
  return c;
}

// --- The store -----------------------------------------------------------------------------------

DeviceMiniCache::DeviceMiniCache(const Geometry& g, const kvsdk_policy& p, Context& ctx)
    : Representation(g, p),
      ctx_(ctx),
      device_(ctx.ops()),
      regions_(*ctx.regions()),
      boundary_(minicache_boundary(g, p)),
      merge_{p.merge_t, p.retain_ratio},
      pairs_((g.n_layers - boundary_) / 2),
      capacity_(pairs_.size() * g.n_kv_heads),
      queries_(ctx.ops()),
      added_{cpu::MergedLayerPair(g.head_dim, merge_), cpu::MergedLayerPair(g.head_dim, merge_)} {
  if (p.quant_bits != 0) {
    fail(KVSDK_E_UNSUPPORTED, "policy 'minicache+kivi", p.quant_bits, "' does not run on ",
         device_.name, " in this version ('minicache' does: docs/gpu.md)");
  }
  check_device_head_dim(device_, g.head_dim);
  for (Pair& pair : pairs_) pair.tensors.resize(size_t(g.n_kv_heads) * 2);
  layout_ = layout_for(capacity_);
  regions_.join(this);
}

DeviceMiniCache::~DeviceMiniCache() { regions_.leave(this); }

void DeviceMiniCache::check_usable() const {
  if (failed_) {
    fail(KVSDK_E_BACKEND, "the ", device_.name, " device failed while this cache merged or ",
         "restored rows; its rows are lost (destroy the cache)");
  }
}

bool DeviceMiniCache::covers(uint32_t layer) const {
  return layer >= boundary_ && layer < geometry_.n_layers && pair_of(layer) < pairs_.size();
}

// --- The arena -----------------------------------------------------------------------------------

DeviceMiniCache::Capacity DeviceMiniCache::held(size_t pair, uint32_t head) const {
  const Pair& p = pairs_[pair];
  Capacity c;
  c.tokens = p.positions.size();
  c.pending = p.pending.size();
  for (int t : {kKeys, kValues}) {
    const Tensor& x = p.tensors[head * 2 + t];
    c.merged[t] = x.merged;
    c.retained[t] = x.retained.size();
  }
  return c;
}

std::vector<DeviceMiniCache::Capacity> DeviceMiniCache::tight() const {
  std::vector<Capacity> c(capacity_.size());
  for (size_t p = 0; p < pairs_.size(); ++p) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) c[index(p, h)] = held(p, h);
  }
  return c;
}

cuda::ArenaPartition DeviceMiniCache::layout_for(const std::vector<Capacity>& capacity) const {
  cuda::ArenaPartition p;
  p.tiers = size_t(geometry_.n_kv_heads) * kParts;
  p.slices.resize(pairs_.size() * p.tiers);
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  uint64_t offset = 0;
  // The f16 rows of every head first (16-byte multiples), then the 4-byte parts: no padding.
  for (const bool rows : {true, false}) {
    for (size_t head = 0; head < capacity.size(); ++head) {
      const size_t first = rows ? 0 : size_t(kRowParts), end = rows ? size_t(kRowParts) : kParts;
      for (size_t part = first; part < end; ++part) {
        const uint64_t bytes = capacity[head].rows(Part(part)) * (rows ? row : 4);
        p.slices[head * kParts + part] = {offset, bytes};
        offset += bytes;
      }
    }
  }
  p.reserved = offset;
  return p;
}

char* DeviceMiniCache::slice(size_t pair, uint32_t head, Part part) const {
  return regions_.base(this) + layout_.at(pair, size_t(head) * kParts + part).offset;
}

void DeviceMiniCache::relayout(const std::vector<Capacity>& capacity) {
  const cuda::ArenaPartition next = layout_for(capacity);
  regions_.grow(this, std::max(next.reserved, layout_.reserved));  // (BUDGET: nothing changed)
  std::vector<uint64_t> used(layout_.slices.size(), 0);
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  for (size_t p = 0; p < pairs_.size(); ++p) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      const Capacity n = held(p, h);
      for (size_t part = 0; part < kParts; ++part) {
        used[index(p, h) * kParts + part] = n.rows(Part(part)) * (part < kRowParts ? row : 4);
      }
    }
  }
  char* const at = regions_.base(this);
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(layout_, next, used)) {
    device_.copy(at + c.dst, at + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

void DeviceMiniCache::reserve(size_t pair, const std::vector<Capacity>& need) {
  bool fits = true;  // (the decode path's usual case: nothing to copy or plan)
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    fits = fits && capacity_[index(pair, h)].covers(need[h]);
  }
  if (fits) return;
  std::vector<Capacity> next = capacity_;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    Capacity& c = next[index(pair, h)];
    const auto grown = [](uint64_t have, uint64_t want) {
      return want > have ? uint64_t(grown_capacity(size_t(have), size_t(want))) : have;
    };
    c.tokens = grown(c.tokens, need[h].tokens);
    c.pending = grown(c.pending, need[h].pending);
    for (int t : {kKeys, kValues}) {
      c.merged[t] = grown(c.merged[t], need[h].merged[t]);
      c.retained[t] = grown(c.retained[t], need[h].retained[t]);
    }
  }
  if (layout_for(next).reserved > regions_.room_for(this)) {
    // Growth by half does not fit: every head what it holds, this pair's what it needs
    // (relayout refuses when not even that fits).
    next = tight();
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      next[index(pair, h)] = next[index(pair, h)].max(need[h]);
    }
  }
  relayout(next);
}

uint64_t DeviceMiniCache::shrink_to_fit() {
  if (failed_) return layout_.reserved;
  const std::vector<Capacity> next = tight();
  if (!(next == capacity_)) relayout(next);  // (within the region: it only shrinks)
  return layout_.reserved;
}

// --- Bytes (MiniCacheRepresentation's, from the counts) ------------------------------------------

void DeviceMiniCache::add_bytes(uint32_t layer, uint64_t t[KVSDK_TIER_SLOTS]) const {
  const Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const uint64_t dim = geometry_.head_dim, tokens = p.positions.size();
  const uint64_t pending = pending_of(p, side);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    for (int x : {kKeys, kValues}) {
      const Tensor& m = p.tensors[h * 2 + x];
      t[KVSDK_TIER_MERGED] += 4 * uint64_t(m.merged) + 2 * uint64_t(m.retained.size()) * dim;
      if (side == 0) {
        t[KVSDK_TIER_MERGED] += 2 * uint64_t(m.merged) * dim;
        t[KVSDK_TIER_METADATA] += 4 * tokens + (tokens ? sizeof(float) : 0);
      }
    }
    if (side == 0) t[KVSDK_TIER_METADATA] += 4 * tokens;
    t[KVSDK_TIER_EXACT] += 4 * pending * dim;
    t[KVSDK_TIER_METADATA] += 4 * pending;
  }
}

uint64_t DeviceMiniCache::append_bound(uint32_t layer, size_t n) const {
  // MiniCacheRepresentation::append_bound for f16 pairs: the merged store's growth (a slot, then
  // both layers' f16 rows or one f16 direction and two f32 magnitudes, per token and tensor; a
  // position; the thresholds the first merge fixes), the rows that become pending, minus the
  // partner's pending rows merged.
  const Pair& p = pairs_[pair_of(layer)];
  const uint64_t dim = geometry_.head_dim, heads = geometry_.n_kv_heads;
  const size_t common = std::min(n, pending_of(p, 1 - side_of(layer)));
  const bool first = common > 0 && p.positions.empty();
  const uint64_t row = 4 * dim + 4;
  const uint64_t grow =
      heads * (uint64_t(common) * (2 * (4 + std::max(4 * dim, 2 * dim + 8)) + 4) +
               (first ? 2 * sizeof(float) : 0)) +
      uint64_t(n - common) * row * heads;
  const uint64_t released = uint64_t(common) * row * heads;
  return grow > released ? grow - released : 0;
}

// --- Appends -------------------------------------------------------------------------------------

char* DeviceMiniCache::stage(uint32_t head, Part part, size_t first_row, size_t bytes) {
  const size_t at = stage_.size();
  reserve_for_growth(stage_, at + bytes);
  stage_.resize(at + bytes);
  staged_.push_back({head, part, first_row, at, bytes});
  return stage_.data() + at;
}

void DeviceMiniCache::stage_merged(size_t pair, uint32_t head, int tensor,
                                   const cpu::MergedLayerPair& added) {
  const Tensor& x = pairs_[pair].tensors[head * 2 + tensor];
  const size_t dim = geometry_.head_dim, n = added.size();
  const size_t merged = added.merged(), retained = added.retained();
  const bool keys = tensor == kKeys;
  // The appended tokens' slots, numbered after what the device holds.
  char* slots = stage(head, keys ? kKSlots : kVSlots, pairs_[pair].positions.size(), n * 4);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t s = added.slots()[i];
    const uint32_t moved =
        s & kRetainedBit ? kRetainedBit | uint32_t((s & ~kRetainedBit) + x.retained.size())
                         : uint32_t(s + x.merged);
    std::memcpy(slots + i * sizeof(uint32_t), &moved, sizeof(moved));
  }
  const auto copy = [&](Part part, size_t first_row, const void* src, size_t bytes) {
    if (bytes) std::memcpy(stage(head, part, first_row, bytes), src, bytes);
  };
  copy(keys ? kKDir : kVDir, x.merged, added.directions(), merged * dim * 2);
  copy(keys ? kKMagPrev : kVMagPrev, x.merged, added.magnitudes(0), merged * 4);
  copy(keys ? kKMagCur : kVMagCur, x.merged, added.magnitudes(1), merged * 4);
  copy(keys ? kKRetPrev : kVRetPrev, x.retained.size(), added.retained_rows(0),
       retained * dim * 2);
  copy(keys ? kKRetCur : kVRetCur, x.retained.size(), added.retained_rows(1),
       retained * dim * 2);
}

void DeviceMiniCache::pending_rows(size_t pair, uint32_t head, size_t first, size_t n,
                                   uint16_t* k, uint16_t* v) const {
  const size_t bytes = n * geometry_.head_dim * sizeof(uint16_t);
  const size_t skip = first * geometry_.head_dim * sizeof(uint16_t);
  if (!bytes) return;
  device_.to_host(k, slice(pair, head, kPendK) + skip, bytes);
  device_.to_host(v, slice(pair, head, kPendV) + skip, bytes);
}

void DeviceMiniCache::append(uint32_t layer, size_t n, const float* k, const float* v,
                             const int32_t* positions) {
  check_usable();
  if (n == 0) return;
  const size_t pair = pair_of(layer);
  Pair& p = pairs_[pair];
  const int side = side_of(layer);
  const uint32_t heads = geometry_.n_kv_heads;
  const size_t dim = geometry_.head_dim, row = geometry_.kv_elems_per_token();
  const size_t waiting = pending_of(p, 1 - side), common = std::min(n, waiting);
  // Validate before anything changes (the host store's check and message).
  for (size_t i = 0; i < common; ++i) {
    const int32_t want = p.pending[i];
    KVSDK_REQUIRE(positions[i] == want, "MiniCache layer ", layer, ": token ", i,
                  " has position ", positions[i], " but the same token of the partner layer ",
                  side == 0 ? layer + 1 : layer - 1, " has position ", want,
                  " (a layer pair merges the same tokens)");
  }
  const Context::DeviceScope on_device(ctx_);
  stage_.clear();
  staged_.clear();
  need_.assign(heads, Capacity{});
  // The merge, head by head on the host (MiniCacheRepresentation::append's: both layers' rows
  // as f16, the waiting side's copied out), into the staging.
  merges_.assign(common > 0 ? size_t(heads) * 2 : 0, Merge{});
  if (common > 0) {
    float* kp = at_least(kp_, common * dim).data();
    float* vp = at_least(vp_, common * dim).data();
    float* kc = at_least(kc_, common * dim).data();
    float* vc = at_least(vc_, common * dim).data();
    uint16_t* wk = at_least(pend_k_, common * dim).data();
    uint16_t* wv = at_least(pend_v_, common * dim).data();
    for (uint32_t h = 0; h < heads; ++h) {
      pending_rows(pair, h, 0, common, wk, wv);
      float* ko = side == 1 ? kp : kc;  // the partner's (waiting) side
      float* vo = side == 1 ? vp : vc;
      float* kn = side == 1 ? kc : kp;  // this layer's side
      float* vn = side == 1 ? vc : vp;
      for (size_t i = 0; i < common * dim; ++i) {
        ko[i] = f16_to_f32(wk[i]);
        vo[i] = f16_to_f32(wv[i]);
      }
      for (size_t t = 0; t < common; ++t) {
        for (size_t d = 0; d < dim; ++d) {
          kn[t * dim + d] = f16_to_f32(f32_to_f16(k[t * row + h * dim + d]));
          vn[t * dim + d] = f16_to_f32(f32_to_f16(v[t * row + h * dim + d]));
        }
      }
      for (int x : {kKeys, kValues}) {
        const Tensor& tx = p.tensors[h * 2 + x];
        cpu::MergedLayerPair& a = added_[x];
        a.reset(tx.threshold_set, tx.threshold);
        a.append(x == kKeys ? kp : vp, x == kKeys ? kc : vc, common, scratch_);
        stage_merged(pair, h, x, a);
        merges_[h * 2 + x] = {a.merged(), a.retained(), a.threshold()};
        need_[h].merged[x] = tx.merged + a.merged();
        need_[h].retained[x] = tx.retained.size() + a.retained();
      }
      std::memcpy(stage(h, kPositions, p.positions.size(), common * sizeof(int32_t)), positions,
                  common * sizeof(int32_t));
    }
  }
  // The rest of this append waits for the partner, as f16 rows, after this layer's waiting ones
  // (none when the partner's waited).
  const size_t rest = n - common, base = pending_of(p, side);
  for (uint32_t h = 0; h < heads && rest > 0; ++h) {
    const auto rows_f16 = [&](const float* x, Part part) {  // (the host store's rounding)
      uint16_t* out = reinterpret_cast<uint16_t*>(stage(h, part, base, rest * dim * 2));
      for (size_t t = 0; t < rest; ++t) {
        const float* in = x + (common + t) * row + h * dim;
        for (size_t d = 0; d < dim; ++d) out[t * dim + d] = f32_to_f16(in[d]);
      }
    };
    rows_f16(k, kPendK);
    rows_f16(v, kPendV);
    std::memcpy(stage(h, kPendPos, base, rest * sizeof(int32_t)), positions + common,
                rest * sizeof(int32_t));
  }
  // Room (host mirrors, then the arena; a re-plan only moves rows): nothing changed on failure.
  for (uint32_t h = 0; h < heads; ++h) {
    Capacity& c = need_[h];
    const Capacity now = held(pair, h);
    c.tokens = now.tokens + common;
    c.pending = std::max(waiting - common, base + rest);
    for (int x : {kKeys, kValues}) {
      c.merged[x] = std::max(c.merged[x], now.merged[x]);
      c.retained[x] = std::max(c.retained[x], now.retained[x]);
      Tensor& tx = p.tensors[h * 2 + x];
      if (common > 0) {
        reserve_for_growth(tx.retained, tx.retained.size() + merges_[h * 2 + x].retained);
      }
    }
  }
  reserve_for_growth(p.positions, p.positions.size() + common);
  reserve_for_growth(p.pending, std::max(waiting - common, base + rest));
  reserve(pair, need_);
  // The uploads write beyond what the counts cover, except new pending rows, which replace the
  // partner's that this append merged whole.
  copies_.clear();
  reserve_for_growth(copies_, staged_.size());
  const size_t row_bytes = dim * sizeof(uint16_t);
  for (const Staged& s : staged_) {
    const size_t unit = s.part < kRowParts ? row_bytes : 4;
    copies_.push_back({slice(pair, s.head, s.part) + s.first_row * unit, stage_.data() + s.offset,
                       s.bytes});
  }
  try {
    backend::to_backend_all(device_, copies_.data(), copies_.size());
    if (waiting > common && common > 0) {
      // The partner's rows that stay pending move to the front of their slices.
      for (uint32_t h = 0; h < heads; ++h) {
        for (Part part : {kPendK, kPendV, kPendPos}) {
          const uint64_t unit = part == kPendPos ? 4 : row_bytes;
          char* const at = slice(pair, h, part);
          cuda::move_in_chunks(0, common * unit, (waiting - common) * unit,
                               [&](uint64_t d, uint64_t s, uint64_t b) {
                                 device_.copy(at + d, at + s, size_t(b));
                               });
        }
      }
    }
  } catch (...) {
    // Nothing the counts cover changed, unless the new pending rows overwrote the partner's or
    // the partner's were moved half-way.
    if ((rest > 0 && waiting > 0) || (waiting > common && common > 0)) failed_ = true;
    throw;
  }
  // Commit the host's view (no allocation: reserved above). The retained tokens come from the
  // staged slots.
  for (const Staged& s : staged_) {
    if (s.part != kKSlots && s.part != kVSlots) continue;
    Tensor& tx = p.tensors[s.head * 2 + (s.part == kKSlots ? kKeys : kValues)];
    for (size_t i = 0; i < s.bytes / 4; ++i) {
      uint32_t slot;
      std::memcpy(&slot, stage_.data() + s.offset + i * 4, 4);
      if (slot & kRetainedBit) tx.retained.push_back(uint32_t(s.first_row + i));
    }
  }
  for (size_t i = 0; i < merges_.size() && common > 0; ++i) {
    Tensor& tx = p.tensors[i];
    if (!tx.threshold_set) tx.threshold_tokens = p.positions.size() + common;  // (as the CPU's)
    tx.merged += merges_[i].merged;
    tx.threshold_set = true;
    tx.threshold = merges_[i].threshold;
  }
  p.positions.insert(p.positions.end(), positions, positions + common);
  p.pending.erase(p.pending.begin(), p.pending.begin() + common);  // (merged: all, or the oldest)
  if (rest > 0) {
    p.pending.insert(p.pending.end(), positions + common, positions + n);
    p.pending_side = side;
  }
}

// --- Attention and reads -------------------------------------------------------------------------

backend::MiniCacheTier DeviceMiniCache::tier(size_t pair, int side, uint32_t head) const {
  const Pair& p = pairs_[pair];
  const auto tensor = [&](int x) {
    const Tensor& t = p.tensors[head * 2 + x];
    const bool keys = x == kKeys;
    backend::MiniCacheTensor m;
    m.slots = reinterpret_cast<const uint32_t*>(slice(pair, head, keys ? kKSlots : kVSlots));
    m.directions = reinterpret_cast<const uint16_t*>(slice(pair, head, keys ? kKDir : kVDir));
    const Part mag = side == 0 ? (keys ? kKMagPrev : kVMagPrev) : (keys ? kKMagCur : kVMagCur);
    const Part ret = side == 0 ? (keys ? kKRetPrev : kVRetPrev) : (keys ? kKRetCur : kVRetCur);
    m.magnitudes = reinterpret_cast<const float*>(slice(pair, head, mag));
    m.retained = reinterpret_cast<const uint16_t*>(slice(pair, head, ret));
    m.merged = t.merged;
    m.retained_rows = t.retained.size();
    return m;
  };
  backend::MiniCacheTier tier;
  tier.k = tensor(kKeys);
  tier.v = tensor(kValues);
  tier.positions = reinterpret_cast<const int32_t*>(slice(pair, head, kPositions));
  tier.tokens = p.positions.size();
  return tier;
}

void DeviceMiniCache::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                             const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, kv_head, 1, q_rows, row_positions, n_rows, out);
}

void DeviceMiniCache::attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                                   const int32_t* row_positions, size_t n_rows,
                                   float* out) const {
  attend_range(layer, 0, n_kv, q_rows, row_positions, n_rows, out);
}

void DeviceMiniCache::attend_range(uint32_t layer, uint32_t first_head, uint32_t n_heads,
                                   const float* q_rows, const int32_t* row_positions,
                                   size_t n_rows, float* out) const {
  check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t pair = pair_of(layer);
  const int side = side_of(layer);
  const size_t waiting = pending_of(pairs_[pair], side);
  queries_.attend_heads(
      query_rows(q_rows, row_positions, n_rows), first_head, n_heads, geometry_.group_size(), out,
      [&](uint32_t h, const backend::QueryRows& q, float* device_out) {
        const backend::F16Rows pending{
            reinterpret_cast<const uint16_t*>(slice(pair, h, kPendK)),
            reinterpret_cast<const uint16_t*>(slice(pair, h, kPendV)),
            reinterpret_cast<const int32_t*>(slice(pair, h, kPendPos)), waiting};
        device_.attend_minicache_tier(q, tier(pair, side, h), pending, workspace(), device_out);
      });
}

size_t DeviceMiniCache::head_tokens(uint32_t layer, uint32_t) const {
  const Pair& p = pairs_[pair_of(layer)];
  return p.positions.size() + pending_of(p, side_of(layer));
}

cpu::MiniCacheHeadPair DeviceMiniCache::host_head(size_t pair, uint32_t head) const {
  check_usable();
  const Pair& p = pairs_[pair];
  const size_t dim = geometry_.head_dim, tokens = p.positions.size();
  cpu::MiniCacheHeadPair out(dim, merge_);
  std::lock_guard<std::mutex> lock(copy_out_);  // (snapshots copy heads out from the pool)
  const Context::DeviceScope on_device(ctx_);
  for (int x : {kKeys, kValues}) {
    const Tensor& t = p.tensors[head * 2 + x];
    const bool keys = x == kKeys;
    cpu::MergedLayerPair::Buffers b;
    b.threshold_set = t.threshold_set;
    b.threshold = t.threshold;
    b.slots.resize(tokens);
    b.directions.resize(t.merged * dim);
    b.magnitudes_prev.resize(t.merged);
    b.magnitudes_cur.resize(t.merged);
    b.retained_prev.resize(t.retained.size() * dim);
    b.retained_cur.resize(t.retained.size() * dim);
    const auto down = [&](void* dst, Part part, size_t bytes) {
      if (bytes) device_.to_host(dst, slice(pair, head, part), bytes);
    };
    down(b.slots.data(), keys ? kKSlots : kVSlots, tokens * 4);
    down(b.directions.data(), keys ? kKDir : kVDir, b.directions.size() * 2);
    down(b.magnitudes_prev.data(), keys ? kKMagPrev : kVMagPrev, t.merged * 4);
    down(b.magnitudes_cur.data(), keys ? kKMagCur : kVMagCur, t.merged * 4);
    down(b.retained_prev.data(), keys ? kKRetPrev : kVRetPrev, b.retained_prev.size() * 2);
    down(b.retained_cur.data(), keys ? kKRetCur : kVRetCur, b.retained_cur.size() * 2);
    (keys ? out.keys : out.values) = cpu::MergedLayerPair::restore(dim, merge_, std::move(b));
  }
  out.positions = p.positions;
  return out;
}

void DeviceMiniCache::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                           int32_t* positions) const {
  // The merged rows as the CPU store restores them, then the pending rows, as stored.
  const size_t pair = pair_of(layer);
  const Pair& p = pairs_[pair];
  const int side = side_of(layer);
  const size_t dim = geometry_.head_dim, tokens = p.positions.size();
  const cpu::MiniCacheHeadPair hp = host_head(pair, kv_head);
  if (k) hp.keys.reconstruct(side, 0, tokens, k);
  if (v) hp.values.reconstruct(side, 0, tokens, v);
  if (positions) std::copy_n(p.positions.data(), tokens, positions);
  const size_t waiting = pending_of(p, side);
  if (waiting == 0) return;
  std::vector<uint16_t> wk(waiting * dim), wv(waiting * dim);
  {
    const Context::DeviceScope on_device(ctx_);
    pending_rows(pair, kv_head, 0, waiting, wk.data(), wv.data());
  }
  for (size_t i = 0; i < waiting * dim; ++i) {
    if (k) k[tokens * dim + i] = f16_to_f32(wk[i]);
    if (v) v[tokens * dim + i] = f16_to_f32(wv[i]);
  }
  if (positions) std::copy_n(p.pending.data(), waiting, positions + tokens);
}

// --- Truncation (MiniCacheRepresentation's rule) -------------------------------------------------

std::string DeviceMiniCache::truncate_refusal(uint32_t layer, int32_t position) const {
  const Pair& p = pairs_[pair_of(layer)];
  const auto refuse = [&](uint32_t h, const char* why) {
    return minicache_truncate_refusal(layer, boundary_, h, position, why);
  };
  const size_t kept = cpu::minicache_kept_tokens(p.positions, position);
  const size_t kept_pending = cpu::minicache_kept_tokens(p.pending, position);
  const bool merged_go = !p.positions.empty() && p.positions.back() >= position;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    // cpu::MiniCacheHeadPair::removal_refusal, MergedLayerPair::can_truncate.
    if (kept == SIZE_MAX) return refuse(h, "it holds tokens from that position before older ones");
    for (int x : {kKeys, kValues}) {
      const Tensor& t = p.tensors[h * 2 + x];
      if (!(kept >= p.positions.size() || kept == 0 || kept >= t.threshold_tokens)) {
        return refuse(h, cpu::kMiniCacheFirstMergeRefusal);
      }
    }
    if (p.pending.empty()) continue;
    if (kept_pending == SIZE_MAX || (merged_go && kept_pending > 0)) {
      return refuse(h, "it holds tokens from that position before older ones");
    }
  }
  return {};
}

void DeviceMiniCache::truncate(uint32_t layer, int32_t position) noexcept {
  // Counts only (the arena's rows beyond them are unused): the pair as the CPU's truncate leaves
  // it. The cache calls this for both layers (the second call finds nothing).
  Pair& p = pairs_[pair_of(layer)];
  const size_t kept = cpu::minicache_kept_tokens(p.positions, position);
  if (kept < p.positions.size()) {
    for (Tensor& t : p.tensors) {
      const size_t retained = size_t(
          std::lower_bound(t.retained.begin(), t.retained.end(), uint32_t(kept)) -
          t.retained.begin());
      t.retained.resize(retained);
      t.merged = kept - retained;
      if (kept == 0) t = Tensor{};  // the fresh pair: the next append fixes the threshold
    }
    p.positions.resize(kept);
  }
  const size_t kept_pending = cpu::minicache_kept_tokens(p.pending, position);
  if (kept_pending < p.pending.size()) p.pending.resize(kept_pending);
}

// --- Snapshots (MiniCacheRepresentation's records) -----------------------------------------------

std::vector<TierRecord> DeviceMiniCache::save(uint32_t layer) const {
  const size_t pair = pair_of(layer);
  const Pair& p = pairs_[pair];
  const int side = side_of(layer);
  const size_t dim = geometry_.head_dim, waiting = pending_of(p, side);
  std::vector<TierRecord> out(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    TierRecord& r = out[h];
    r.layer = layer;
    r.kv_head = h;
    if (side == 1) {
      r.kind = "minicache.pending";
    } else {
      r.kind = "minicache.pair";
      minicache_pair_to_record(host_head(pair, h), r);
    }
    std::vector<uint16_t> wk(waiting * dim), wv(waiting * dim);
    if (waiting) {
      check_usable();
      std::lock_guard<std::mutex> lock(copy_out_);
      const Context::DeviceScope on_device(ctx_);
      pending_rows(pair, h, 0, waiting, wk.data(), wv.data());
    }
    r.add("pending.keys").u16 = std::move(wk);
    r.add("pending.values").u16 = std::move(wv);
    r.add("pending.positions").i32 =
        waiting ? p.pending : std::vector<int32_t>{};
  }
  return out;
}

void DeviceMiniCache::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  check_usable();
  const uint32_t heads = geometry_.n_kv_heads;
  const size_t dim = geometry_.head_dim;
  if (!covers(layer)) fail(KVSDK_E_CORRUPT, "snapshot has MiniCache records for layer ", layer,
                           ", which policy '", "minicache", "' does not merge");
  if (records.size() != heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " MiniCache head records, expected ", heads);
  }
  const size_t pair = pair_of(layer);
  Pair& p = pairs_[pair];
  const int side = side_of(layer);
  const std::string kind = side == 1 ? "minicache.pending" : "minicache.pair";
  // Parse and check everything (MiniCacheRepresentation::restore's checks) before any change.
  std::vector<cpu::MiniCacheHeadPair> built;
  std::vector<std::vector<uint16_t>> wk(heads), wv(heads);
  std::vector<int32_t> pending;
  for (uint32_t h = 0; h < heads; ++h) {
    const TierRecord& r = records[h];
    if (r.kind != kind || r.kv_head != h) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", h, " is '", r.kind,
           "' for KV head ", r.kv_head, ", expected '", kind, "' for KV head ", h);
    }
    if (side == 0) built.push_back(minicache_pair_from_record(dim, merge_, r, layer, h));
    wk[h] = r.get("pending.keys").u16;
    wv[h] = r.get("pending.values").u16;
    const std::vector<int32_t>& pos = r.get("pending.positions").i32;
    if (h == 0) pending = pos;
    if (wk[h].size() != pos.size() * dim || wv[h].size() != pos.size() * dim ||
        pos != pending) {
      fail(KVSDK_E_CORRUPT, "MiniCache layer ", layer, " head ", h,
           ": pending rows do not match their positions or head 0's");
    }
  }
  for (uint32_t h = 1; h < heads && side == 0; ++h) {
    if (built[h].positions.size() != built[0].positions.size()) {
      fail(KVSDK_E_CORRUPT, "MiniCache layer ", layer, ": heads hold ",
           built[0].positions.size(), " and ", built[h].positions.size(), " merged tokens");
    }
  }
  if (!pending.empty() && pending_of(p, 1 - side) > 0) {
    fail(KVSDK_E_CORRUPT, "MiniCache layers ", layer, " and ",
         side == 0 ? layer + 1 : layer - 1, " both hold pending rows");
  }
  // The new host view, the room, then the uploads.
  Pair next = p;
  if (side == 0) {
    next.positions = built[0].positions;
    for (uint32_t h = 0; h < heads; ++h) {
      if (built[h].positions != next.positions) {
        fail(KVSDK_E_CORRUPT, "MiniCache layer ", layer, ": heads hold different positions");
      }
      for (int x : {kKeys, kValues}) {
        const cpu::MergedLayerPair& m = x == kKeys ? built[h].keys : built[h].values;
        Tensor& t = next.tensors[h * 2 + x];
        t = Tensor{};
        t.merged = m.merged();
        for (size_t i = 0; i < m.size(); ++i) {
          if (m.is_retained(i)) t.retained.push_back(uint32_t(i));
        }
        t.threshold_set = m.threshold_set();
        t.threshold = m.threshold();
        // (MergedLayerPair::restore: every restored token counts as fixing the threshold.)
        t.threshold_tokens = t.threshold_set ? m.size() : 0;
      }
    }
  }
  if (!pending.empty()) {
    next.pending = pending;
    next.pending_side = side;
  }
  const Context::DeviceScope on_device(ctx_);
  std::vector<Capacity> need(heads);
  for (uint32_t h = 0; h < heads; ++h) {
    need[h].tokens = next.positions.size();
    need[h].pending = next.pending.size();
    for (int x : {kKeys, kValues}) {
      need[h].merged[x] = next.tensors[h * 2 + x].merged;
      need[h].retained[x] = next.tensors[h * 2 + x].retained.size();
    }
  }
  reserve(pair, need);  // (BUDGET: nothing changed)
  try {
    const size_t row_bytes = dim * sizeof(uint16_t);
    for (uint32_t h = 0; h < heads; ++h) {
      const auto up = [&](Part part, const void* src, size_t bytes) {
        if (bytes) device_.to_backend(slice(pair, h, part), src, bytes);
      };
      if (side == 0) {
        for (int x : {kKeys, kValues}) {
          const cpu::MergedLayerPair& m = x == kKeys ? built[h].keys : built[h].values;
          const bool keys = x == kKeys;
          up(keys ? kKSlots : kVSlots, m.slots(), m.size() * 4);
          up(keys ? kKDir : kVDir, m.directions(), m.merged() * row_bytes);
          up(keys ? kKMagPrev : kVMagPrev, m.magnitudes(0), m.merged() * 4);
          up(keys ? kKMagCur : kVMagCur, m.magnitudes(1), m.merged() * 4);
          up(keys ? kKRetPrev : kVRetPrev, m.retained_rows(0), m.retained() * row_bytes);
          up(keys ? kKRetCur : kVRetCur, m.retained_rows(1), m.retained() * row_bytes);
        }
        up(kPositions, next.positions.data(), next.positions.size() * 4);
      }
      if (!pending.empty()) {
        up(kPendK, wk[h].data(), pending.size() * row_bytes);
        up(kPendV, wv[h].data(), pending.size() * row_bytes);
        up(kPendPos, pending.data(), pending.size() * 4);
      }
    }
  } catch (...) {
    failed_ = true;  // (the pair's old rows may be overwritten)
    throw;
  }
  p = std::move(next);
}

}  // namespace kvsdk
