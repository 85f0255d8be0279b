#include "repr/minicache_repr.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "attention.h"
#include "repr/kivi_repr.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"

namespace kvsdk {

namespace {

constexpr size_t kChunk = 256;  // rows of f32 scratch per attention chunk

void put_f32_scalar(TierRecord& r, const std::string& name, float x) { r.add(name).f32 = {x}; }
float get_f32_scalar(const TierRecord& r, const std::string& name) {
  const TierField& f = r.get(name);
  if (f.f32.size() != 1) {
    fail(KVSDK_E_CORRUPT, "snapshot tier record '", r.kind, "' field '", name,
         "' is not a scalar");
  }
  return f.f32[0];
}

void merged_to_record(const cpu::MergedLayerPair& m, const std::string& pre, TierRecord& r) {
  cpu::MergedLayerPair::Buffers b = m.buffers();
  r.set_scalar(pre + "threshold_set", b.threshold_set ? 1 : 0);
  put_f32_scalar(r, pre + "threshold", b.threshold);
  r.add(pre + "slots").u32 = std::move(b.slots);
  r.add(pre + "directions").u16 = std::move(b.directions);
  r.add(pre + "magnitudes_prev").f32 = std::move(b.magnitudes_prev);
  r.add(pre + "magnitudes_cur").f32 = std::move(b.magnitudes_cur);
  r.add(pre + "retained_prev").u16 = std::move(b.retained_prev);
  r.add(pre + "retained_cur").u16 = std::move(b.retained_cur);
}

cpu::MergedLayerPair merged_from_record(size_t dim, const cpu::MiniCacheConfig& c,
                                        const std::string& pre, const TierRecord& r) {
  cpu::MergedLayerPair::Buffers b;
  const uint64_t set = r.scalar(pre + "threshold_set");
  if (set > 1) fail(KVSDK_E_CORRUPT, "MiniCache record field '", pre, "threshold_set' is ", set);
  b.threshold_set = set == 1;
  b.threshold = get_f32_scalar(r, pre + "threshold");
  b.slots = r.get(pre + "slots").u32;
  b.directions = r.get(pre + "directions").u16;
  b.magnitudes_prev = r.get(pre + "magnitudes_prev").f32;
  b.magnitudes_cur = r.get(pre + "magnitudes_cur").f32;
  b.retained_prev = r.get(pre + "retained_prev").u16;
  b.retained_cur = r.get(pre + "retained_cur").u16;
  return cpu::MergedLayerPair::restore(dim, c, std::move(b));
}

}  // namespace

uint32_t minicache_boundary(const Geometry& g, const kvsdk_policy& p) {
  if (p.boundary_layer < 0) return g.n_layers / 2;
  KVSDK_REQUIRE(uint32_t(p.boundary_layer) < g.n_layers, "policy.boundary_layer is ",
                p.boundary_layer, " but the geometry has ", g.n_layers, " layers");
  return uint32_t(p.boundary_layer);
}

std::string minicache_truncate_refusal(uint32_t layer, uint32_t boundary, uint32_t kv_head,
                                       int32_t position, const char* why) {
  const uint32_t first = boundary + (layer - boundary) / 2 * 2;
  return "layer " + std::to_string(layer) + " (MiniCache pair " + std::to_string(first) + "+" +
         std::to_string(first + 1) + ", KV head " + std::to_string(kv_head) +
         ") cannot remove its tokens at positions >= " + std::to_string(position) + ": " + why;
}

void minicache_pair_to_record(const cpu::MiniCacheHeadPair& hp, TierRecord& r) {
  merged_to_record(hp.keys, "keys.", r);
  merged_to_record(hp.values, "values.", r);
  r.add("positions").i32 = hp.positions;
}

cpu::MiniCacheHeadPair minicache_pair_from_record(size_t dim, const cpu::MiniCacheConfig& c,
                                                  const TierRecord& r, uint32_t layer,
                                                  uint32_t head) {
  cpu::MiniCacheHeadPair hp(dim, c);
  hp.keys = merged_from_record(dim, c, "keys.", r);
  hp.values = merged_from_record(dim, c, "values.", r);
  hp.positions = r.get("positions").i32;
  if (hp.keys.size() != hp.positions.size() || hp.values.size() != hp.positions.size()) {
    fail(KVSDK_E_CORRUPT, "MiniCache layer ", layer, " head ", head, ": ", hp.keys.size(),
         " key and ", hp.values.size(), " value tokens for ", hp.positions.size(), " positions");
  }
  return hp;
}

MiniCacheRepresentation::MiniCacheRepresentation(const Geometry& g, const kvsdk_policy& p)
    : Representation(g, p),
      boundary_(minicache_boundary(g, p)),
      merge_{p.merge_t, p.retain_ratio},
      quant_(kivi_config(p)),
      kivi_(p.quant_bits != 0),
      pairs_((g.n_layers - boundary_) / 2) {
  for (Pair& pair : pairs_) make_stores(pair);
}

void MiniCacheRepresentation::make_stores(Pair& p) const {
  p.f16.clear();
  p.kivi.clear();
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    if (kivi_) {
      p.kivi.emplace_back(geometry_.head_dim, merge_, quant_);
    } else {
      p.f16.emplace_back(geometry_.head_dim, merge_);
    }
  }
  p.pending.assign(geometry_.n_kv_heads, Pending{});
  p.pending_side = 0;
}

bool MiniCacheRepresentation::covers(uint32_t layer) const {
  return layer >= boundary_ && layer < geometry_.n_layers && pair_of(layer) < pairs_.size();
}

size_t MiniCacheRepresentation::merged_tokens(const Pair& p) const {
  return kivi_ ? p.kivi[0].size() : p.f16[0].positions.size();
}

size_t MiniCacheRepresentation::pending_tokens(uint32_t layer) const {
  return pending_of(pairs_[pair_of(layer)], side_of(layer));
}

void MiniCacheRepresentation::add_bytes(uint32_t layer, uint64_t t[KVSDK_TIER_SLOTS]) const {
  const Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const uint64_t dim = geometry_.head_dim;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    if (kivi_) {
      const cpu::MiniCacheKiviBytes b = p.kivi[h].bytes();
      // merged (norms) and retained rows are the same size in both layers: half each.
      t[KVSDK_TIER_MERGED] += b.merged / 2 + b.retained / 2;
      if (side == 0) {
        t[KVSDK_TIER_QUANTIZED] += b.quantized;
        // The retention threshold is state only once a token fixed it (an empty pair, as made at
        // cache creation, holds nothing to charge).
        t[KVSDK_TIER_METADATA] += b.metadata - (p.kivi[h].size() == 0 ? sizeof(float) : 0);
      }
    } else {
      const cpu::MiniCacheHeadPair& hp = p.f16[h];
      for (const cpu::MergedLayerPair* m : {&hp.keys, &hp.values}) {
        // This layer's magnitudes and retained rows.
        t[KVSDK_TIER_MERGED] += 4 * uint64_t(m->merged()) + 2 * uint64_t(m->retained()) * dim;
        if (side == 0) {
          t[KVSDK_TIER_MERGED] += 2 * uint64_t(m->merged()) * dim;  // shared f16 directions
          // Slots, and the threshold once tokens fixed it (see above).
          t[KVSDK_TIER_METADATA] += 4 * uint64_t(m->size()) + (m->size() ? sizeof(float) : 0);
        }
      }
      if (side == 0) t[KVSDK_TIER_METADATA] += 4 * uint64_t(hp.positions.size());
    }
    if (pending_of(p, side) > 0) {
      const Pending& q = p.pending[h];
      t[KVSDK_TIER_EXACT] += 2 * uint64_t(q.k.size() + q.v.size());
      t[KVSDK_TIER_METADATA] += 4 * uint64_t(q.size());
    }
  }
}

uint64_t MiniCacheRepresentation::pair_store_bytes_bound(const Pair& p, uint32_t h,
                                                         size_t n) const {
  const uint64_t dim = geometry_.head_dim;
  // The first merged token of a head also fixes the retention threshold, which is charged from
  // then on (add_bytes): one float per tensor for f16 pairs, one per head for KIVI pairs.
  const bool first = n > 0 && (kivi_ ? p.kivi[h].size() : p.f16[h].positions.size()) == 0;
  if (!kivi_) {
    // Per token and tensor: a slot, then either both layers' f16 rows (retained) or one f16
    // direction and two f32 magnitudes (merged); plus the token's position.
    return uint64_t(n) * (2 * (4 + std::max(4 * dim, 2 * dim + 8)) + 4) +
           (first ? 2 * sizeof(float) : 0);
  }
  // Per token: slot + position, then either four f16 rows (retained) or four f32 norms (merged);
  // the KIVI store of directions grows by at most its largest projected size over every number
  // of merged tokens (a flush can shrink it, so it is not monotone).
  const cpu::KiviHeadStore& d = p.kivi[h].directions();
  const uint64_t now = d.bytes().total();
  uint64_t kivi_growth = 0;
  for (size_t k = 0; k <= n; ++k) {
    const uint64_t b = d.projected_bytes(k).total();
    if (b > now) kivi_growth = std::max(kivi_growth, b - now);
  }
  return uint64_t(n) * (8 + std::max<uint64_t>(8 * dim, 16)) + kivi_growth +
         (first ? sizeof(float) : 0);
}

uint64_t MiniCacheRepresentation::append_bound(uint32_t layer, size_t n) const {
  // Bounds the change of the representation's total bytes (both layers of the pair): the merged
  // store's growth, plus the rows that become pending, minus the partner's pending rows merged.
  const Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const size_t waiting = pending_of(p, 1 - side);
  const size_t common = std::min(n, waiting);
  const uint64_t row = 4 * uint64_t(geometry_.head_dim) + 4;  // f16 k + v, int32 position
  uint64_t grow = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) grow += pair_store_bytes_bound(p, h, common);
  grow += uint64_t(n - common) * row * geometry_.n_kv_heads;
  const uint64_t released = uint64_t(common) * row * geometry_.n_kv_heads;
  return grow > released ? grow - released : 0;
}

void MiniCacheRepresentation::append(uint32_t layer, size_t n, const float* k, const float* v,
                                     const int32_t* positions) {
  if (n == 0) return;
  Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const size_t dim = geometry_.head_dim, row = geometry_.kv_elems_per_token();
  const size_t waiting = pending_of(p, 1 - side);
  const size_t common = std::min(n, waiting);
  // Validate before anything changes: a merged token has one position in both layers.
  for (size_t i = 0; i < common; ++i) {
    const int32_t want = p.pending[0].positions[i];
    KVSDK_REQUIRE(positions[i] == want, "MiniCache layer ", layer, ": token ", i,
                  " has position ", positions[i], " but the same token of the partner layer ",
                  partner(layer), " has position ", want, " (a layer pair merges the same tokens)");
  }
  const uint32_t heads = geometry_.n_kv_heads;
  if (common > 0) {
    // Both layers' rows as f16 (the leader waited as f16; rounding the partner too keeps the
    // result independent of which layer led).
    // (in reused scratch: one thread per cache)
    float* kp = at_least(merge_kp_, common * dim).data();
    float* vp = at_least(merge_vp_, common * dim).data();
    float* kc = at_least(merge_kc_, common * dim).data();
    float* vc = at_least(merge_vc_, common * dim).data();
    for (uint32_t h = 0; h < heads; ++h) {
      const Pending& q = p.pending[h];
      float* ko = side == 1 ? kp : kc;  // the partner's (waiting) side
      float* vo = side == 1 ? vp : vc;
      float* kn = side == 1 ? kc : kp;  // this layer's side
      float* vn = side == 1 ? vc : vp;
      for (size_t i = 0; i < common * dim; ++i) {
        ko[i] = f16_to_f32(q.k[i]);
        vo[i] = f16_to_f32(q.v[i]);
      }
      for (size_t t = 0; t < common; ++t) {
        for (size_t d = 0; d < dim; ++d) {
          kn[t * dim + d] = f16_to_f32(f32_to_f16(k[t * row + h * dim + d]));
          vn[t * dim + d] = f16_to_f32(f32_to_f16(v[t * row + h * dim + d]));
        }
      }
      if (kivi_) {
        p.kivi[h].append(kp, vp, kc, vc, positions, common, merge_scratch_);
      } else {
        p.f16[h].append(kp, vp, kc, vc, positions, common, merge_scratch_);
      }
    }
    for (Pending& q : p.pending) {  // release the merged rows of the waiting side
      q.k.erase(q.k.begin(), q.k.begin() + common * dim);
      q.v.erase(q.v.begin(), q.v.begin() + common * dim);
      q.positions.erase(q.positions.begin(), q.positions.begin() + common);
    }
  }
  if (n > common) {  // the rest of this append waits for the partner
    p.pending_side = side;
    for (uint32_t h = 0; h < heads; ++h) {
      Pending& q = p.pending[h];
      for (size_t t = common; t < n; ++t) {
        for (size_t d = 0; d < dim; ++d) {
          q.k.push_back(f32_to_f16(k[t * row + h * dim + d]));
          q.v.push_back(f32_to_f16(v[t * row + h * dim + d]));
        }
      }
      q.positions.insert(q.positions.end(), positions + common, positions + n);
    }
  }
}

template <typename Sink>
void MiniCacheRepresentation::for_rows(uint32_t layer, uint32_t h, Sink&& sink) const {
  const Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const size_t dim = geometry_.head_dim;
  std::vector<float> k(kChunk * dim), v(kChunk * dim);
  const size_t merged = merged_tokens(p);
  for (size_t first = 0; first < merged; first += kChunk) {
    const size_t n = std::min(kChunk, merged - first);
    const int32_t* pos;
    if (kivi_) {
      p.kivi[h].read_rows(side, first, n, k.data(), v.data());
      pos = p.kivi[h].positions().data() + first;
    } else {
      p.f16[h].keys.reconstruct(side, first, n, k.data());
      p.f16[h].values.reconstruct(side, first, n, v.data());
      pos = p.f16[h].positions.data() + first;
    }
    sink(k.data(), v.data(), pos, n);
  }
  const size_t waiting = pending_of(p, side);
  const Pending& q = p.pending[h];
  for (size_t first = 0; first < waiting; first += kChunk) {  // exact rows, as stored
    const size_t n = std::min(kChunk, waiting - first);
    for (size_t i = 0; i < n * dim; ++i) {
      k[i] = f16_to_f32(q.k[first * dim + i]);
      v[i] = f16_to_f32(q.v[first * dim + i]);
    }
    sink(k.data(), v.data(), q.positions.data() + first, n);
  }
}

void MiniCacheRepresentation::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                     const int32_t* row_positions, size_t n_rows,
                                     float* out) const {
  // The pair's rows of this layer, then its rows waiting for the partner, in one softmax.
  const Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const size_t waiting = pending_of(p, side);
  backend::F16Rows pending;
  if (waiting > 0) {
    const Pending& q = p.pending[kv_head];
    pending = {q.k.data(), q.v.data(), q.positions.data(), waiting};
  }
  const backend::QueryRows qr = query_rows(q_rows, row_positions, n_rows);
  if (kivi_) {
    ops().attend_minicache_kivi(qr, p.kivi[kv_head], side, pending, workspace(), out);
  } else {
    ops().attend_minicache(qr, p.f16[kv_head], side, pending, workspace(), out);
  }
}

size_t MiniCacheRepresentation::head_tokens(uint32_t layer, uint32_t /*kv_head*/) const {
  const Pair& p = pairs_[pair_of(layer)];
  return merged_tokens(p) + pending_of(p, side_of(layer));
}

void MiniCacheRepresentation::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                                   int32_t* positions) const {
  const size_t dim = geometry_.head_dim;
  size_t at = 0;
  for_rows(layer, kv_head, [&](const float* kc, const float* vc, const int32_t* pos, size_t n) {
    if (k) std::copy_n(kc, n * dim, k + at * dim);
    if (v) std::copy_n(vc, n * dim, v + at * dim);
    if (positions) std::copy_n(pos, n, positions + at);
    at += n;
  });
}

std::string MiniCacheRepresentation::truncate_refusal(uint32_t layer, int32_t position) const {
  const Pair& p = pairs_[pair_of(layer)];
  const auto refuse = [&](uint32_t h, const char* why) {
    return minicache_truncate_refusal(layer, boundary_, h, position, why);
  };
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const std::vector<int32_t>& merged = kivi_ ? p.kivi[h].positions() : p.f16[h].positions;
    const char* why = kivi_ ? p.kivi[h].removal_refusal(position)
                            : p.f16[h].removal_refusal(position);
    if (why) return refuse(h, why);
    if (p.pending.empty() || p.pending[h].size() == 0) continue;
    // The leading layer holds its pending rows after the merged ones: if a merged token goes,
    // every pending row must go too, and the pending rows that go must be the newest.
    const std::vector<int32_t>& waiting = p.pending[h].positions;
    const size_t kept = cpu::minicache_kept_tokens(waiting, position);
    const bool merged_go = !merged.empty() && merged.back() >= position;
    if (kept == SIZE_MAX || (merged_go && kept > 0)) {
      return refuse(h, "it holds tokens from that position before older ones");
    }
  }
  return {};
}

void MiniCacheRepresentation::truncate(uint32_t layer, int32_t position) noexcept {
  // Cuts the whole pair: the cache calls this for both layers (the second call finds nothing).
  Pair& p = pairs_[pair_of(layer)];
  const size_t dim = geometry_.head_dim;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    if (kivi_) {
      p.kivi[h].remove_from(position);
    } else {
      p.f16[h].remove_from(position);
    }
  }
  // Pending rows are exact rows no merge saw: the newest go as if never appended.
  for (Pending& q : p.pending) {
    const size_t kept = cpu::minicache_kept_tokens(q.positions, position);
    if (kept >= q.size()) continue;
    q.positions.resize(kept);  // shrinking: no allocation
    q.k.resize(kept * dim);
    q.v.resize(kept * dim);
  }
}

std::vector<TierRecord> MiniCacheRepresentation::save(uint32_t layer) const {
  const Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  std::vector<TierRecord> out(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    TierRecord& r = out[h];
    r.layer = layer;
    r.kv_head = h;
    if (side == 1) {
      r.kind = "minicache.pending";
    } else if (kivi_) {
      r.kind = "minicache_kivi.pair";
      cpu::MiniCacheKiviPair::Buffers b = p.kivi[h].buffers();
      r.set_scalar("threshold_set", b.threshold_set ? 1 : 0);
      put_f32_scalar(r, "threshold", b.threshold);
      r.add("slots").u32 = std::move(b.slots);
      r.add("positions").i32 = std::move(b.positions);
      r.add("norm_k_prev").f32 = std::move(b.norm_k_prev);
      r.add("norm_k_cur").f32 = std::move(b.norm_k_cur);
      r.add("norm_v_prev").f32 = std::move(b.norm_v_prev);
      r.add("norm_v_cur").f32 = std::move(b.norm_v_cur);
      r.add("retained_k_prev").u16 = std::move(b.retained_k_prev);
      r.add("retained_k_cur").u16 = std::move(b.retained_k_cur);
      r.add("retained_v_prev").u16 = std::move(b.retained_v_prev);
      r.add("retained_v_cur").u16 = std::move(b.retained_v_cur);
      kivi_store_to_record(p.kivi[h].directions(), "directions.", r);
    } else {
      r.kind = "minicache.pair";
      minicache_pair_to_record(p.f16[h], r);
    }
    // This layer's waiting rows (empty unless it leads its partner).
    const bool mine = pending_of(p, side) > 0;
    r.add("pending.keys").u16 = mine ? p.pending[h].k : std::vector<uint16_t>{};
    r.add("pending.values").u16 = mine ? p.pending[h].v : std::vector<uint16_t>{};
    r.add("pending.positions").i32 = mine ? p.pending[h].positions : std::vector<int32_t>{};
  }
  return out;
}

void MiniCacheRepresentation::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  const uint32_t heads = geometry_.n_kv_heads;
  const size_t dim = geometry_.head_dim;
  if (!covers(layer)) fail(KVSDK_E_CORRUPT, "snapshot has MiniCache records for layer ", layer,
                           ", which policy '", "minicache", "' does not merge");
  if (records.size() != heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " MiniCache head records, expected ", heads);
  }
  Pair& p = pairs_[pair_of(layer)];
  const int side = side_of(layer);
  const std::string kind =
      side == 1 ? "minicache.pending" : kivi_ ? "minicache_kivi.pair" : "minicache.pair";
  // Build everything aside; commit only when every record is consistent.
  Pair built;
  std::vector<Pending> pending(heads);
  for (uint32_t h = 0; h < heads; ++h) {
    const TierRecord& r = records[h];
    if (r.kind != kind || r.kv_head != h) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", h, " is '", r.kind,
           "' for KV head ", r.kv_head, ", expected '", kind, "' for KV head ", h);
    }
    if (side == 0 && kivi_) {
      cpu::MiniCacheKiviPair::Buffers b;
      const uint64_t set = r.scalar("threshold_set");
      if (set > 1) fail(KVSDK_E_CORRUPT, "MiniCache record field 'threshold_set' is ", set);
      b.threshold_set = set == 1;
      b.threshold = get_f32_scalar(r, "threshold");
      b.slots = r.get("slots").u32;
      b.positions = r.get("positions").i32;
      b.norm_k_prev = r.get("norm_k_prev").f32;
      b.norm_k_cur = r.get("norm_k_cur").f32;
      b.norm_v_prev = r.get("norm_v_prev").f32;
      b.norm_v_cur = r.get("norm_v_cur").f32;
      b.retained_k_prev = r.get("retained_k_prev").u16;
      b.retained_k_cur = r.get("retained_k_cur").u16;
      b.retained_v_prev = r.get("retained_v_prev").u16;
      b.retained_v_cur = r.get("retained_v_cur").u16;
      b.directions = kivi_store_from_record(dim, quant_, "directions.", r).buffers();
      built.kivi.push_back(cpu::MiniCacheKiviPair::restore(dim, merge_, quant_, std::move(b)));
    } else if (side == 0) {
      built.f16.push_back(minicache_pair_from_record(dim, merge_, r, layer, h));
    }
    Pending& q = pending[h];
    q.k = r.get("pending.keys").u16;
    q.v = r.get("pending.values").u16;
    q.positions = r.get("pending.positions").i32;
    if (q.k.size() != q.size() * dim || q.v.size() != q.size() * dim ||
        q.positions != pending[0].positions) {
      fail(KVSDK_E_CORRUPT, "MiniCache layer ", layer, " head ", h,
           ": pending rows do not match their positions or head 0's");
    }
  }
  if (side == 0) {
    const size_t merged = kivi_ ? built.kivi[0].size() : built.f16[0].positions.size();
    for (uint32_t h = 1; h < heads; ++h) {
      const size_t m = kivi_ ? built.kivi[h].size() : built.f16[h].positions.size();
      if (m != merged) {
        fail(KVSDK_E_CORRUPT, "MiniCache layer ", layer, ": heads hold ", merged, " and ", m,
             " merged tokens");
      }
    }
  }
  // Only one layer of a pair can be waiting for the other.
  if (pending[0].size() > 0 && pending_of(p, 1 - side) > 0) {
    fail(KVSDK_E_CORRUPT, "MiniCache layers ", layer, " and ", partner(layer),
         " both hold pending rows");
  }
  if (side == 0) {
    p.f16 = std::move(built.f16);
    p.kivi = std::move(built.kivi);
  }
  if (pending[0].size() > 0) {
    p.pending = std::move(pending);
    p.pending_side = side;
  }
}

}  // namespace kvsdk
