#include "journal.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "kvsdk_generated.h"
#include "policy_state.h"
#include "tier_schema.h"
#include "tier_state.h"
#include "util/error.h"
#include "util/positions.h"
#include "util/thread_pool.h"
#include "xxhash64.h"

namespace kvsdk::format {

namespace {

// How one head changed: segments in new row order, and which current rows are new.
struct HeadPlan {
  uint32_t layer = 0;
  uint32_t head = 0;
  std::vector<fb::Segment> segments;
  std::vector<size_t> new_rows;  // indices into the head's current rows
};

void add_segment(std::vector<fb::Segment>& segs, uint64_t base_begin, uint64_t count) {
  if (!segs.empty()) {
    fb::Segment& last = segs.back();
    const bool both_new = last.base_begin() == kNewRows && base_begin == kNewRows;
    const bool contiguous = last.base_begin() != kNewRows && base_begin != kNewRows &&
                            last.base_begin() + last.count() == base_begin;
    if (both_new || contiguous) {
      last = fb::Segment(last.base_begin(), last.count() + count);
      return;
    }
  }
  segs.emplace_back(base_begin, count);
}

HeadPlan plan_head(uint32_t layer, uint32_t head, const std::vector<uint64_t>& before,
                   const std::vector<uint64_t>& now) {
  HeadPlan p;
  p.layer = layer;
  p.head = head;
  p.segments = match_in_order(before, now, &p.new_rows);
  return p;
}

bool unchanged(const HeadPlan& p, size_t before_rows) {
  if (before_rows == 0) return p.segments.empty();
  return p.segments.size() == 1 && p.segments[0].base_begin() == 0 &&
         p.segments[0].count() == before_rows;
}

// One HeadDelta of a part: a head's segments (first entry only) and new rows [begin, end).
struct Entry {
  size_t plan;
  bool with_segments;
  size_t begin, end;
};

}  // namespace

// Matches current rows against the previous keys in order: survivors of eviction keep their
// relative order, so each current row either continues the previous match, jumps forward over
// evicted rows, or is new.
std::vector<fb::Segment> match_in_order(const std::vector<uint64_t>& before,
                                        const std::vector<uint64_t>& now,
                                        std::vector<size_t>* new_rows) {
  std::vector<fb::Segment> segs;
  size_t j = 0;
  std::unordered_map<uint64_t, std::vector<size_t>> where;  // built on the first mismatch
  bool indexed = false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (j < before.size() && now[i] == before[j]) {
      add_segment(segs, j, 1);
      ++j;
      continue;
    }
    // Once every previous row is matched, the rest is new (an append-only delta: no index).
    if (j == before.size()) {
      add_segment(segs, kNewRows, 1);
      if (new_rows) new_rows->push_back(i);
      continue;
    }
    if (!indexed) {
      for (size_t b = 0; b < before.size(); ++b) where[before[b]].push_back(b);
      indexed = true;
    }
    size_t found = before.size();
    auto it = where.find(now[i]);
    if (it != where.end()) {
      auto pos = std::lower_bound(it->second.begin(), it->second.end(), j);
      if (pos != it->second.end()) found = *pos;
    }
    if (found < before.size()) {
      add_segment(segs, found, 1);
      j = found + 1;
    } else {
      add_segment(segs, kNewRows, 1);
      if (new_rows) new_rows->push_back(i);
    }
  }
  return segs;
}

uint64_t row_fingerprint(int32_t position, const uint16_t* k, const uint16_t* v,
                         size_t head_dim, bool xxh3) {
  if (xxh3) {
    const uint64_t seed = xxh3_64(&position, sizeof position, 0x6b7673646b726f77ull);
    return xxh3_64(v, head_dim * 2, xxh3_64(k, head_dim * 2, seed));
  }
  const uint64_t seed = xxh64(&position, sizeof position, 0x6b7673646b726f77ull);
  return xxh64(v, head_dim * 2, xxh64(k, head_dim * 2, seed));
}

namespace {

// fingerprint(), also handing back each layer's records (built once: the delta writes them).
// The rows' pass is split by KV head over `pool` (each head's fingerprints are its own vector,
// so the result is the same for any pool); the stores are only read.
Fingerprints fingerprint_with(const StoreView& cache, std::vector<std::vector<TierRecord>>* records,
                              bool xxh3, ThreadPool* pool) {
  const Geometry& g = cache.geometry();
  Fingerprints fp;
  std::vector<std::vector<uint64_t>>& out = fp.rows;
  const size_t heads = size_t(g.n_layers) * g.n_kv_heads;
  out.resize(heads);
  for (size_t i = 0; i < heads; ++i) out[i].resize(cache.exact_rows(uint32_t(i / g.n_kv_heads),
                                                                    uint32_t(i % g.n_kv_heads)).size());
  const auto one_head = [&](size_t i) {
    const ExactStore& e = cache.exact_rows(uint32_t(i / g.n_kv_heads), uint32_t(i % g.n_kv_heads));
    std::vector<uint64_t>& f = out[i];
    for (size_t r = 0; r < e.size(); ++r) {
      f[r] = row_fingerprint(e.positions[r], e.k.data() + r * g.head_dim,
                             e.v.data() + r * g.head_dim, g.head_dim, xxh3);
    }
  };
  if (pool && pool->size() > 1 && heads > 1) {
    pool->run(heads, one_head);
  } else {
    for (size_t i = 0; i < heads; ++i) one_head(i);
  }
  fp.tiers.resize(g.n_layers);
  std::vector<std::vector<TierRecord>> own;
  if (!records) records = &own;
  records->assign(g.n_layers, {});
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    std::vector<TierRecord> r = cache.tier_records(l);
    out.push_back(r.empty() ? std::vector<uint64_t>{} : std::vector<uint64_t>{tier_records_hash(r)});
    fp.tiers[l] = sign_layer(r);
    (*records)[l] = std::move(r);
  }
  fp.windows = window_fingerprints(cache);
  fp.scores = score_base(cache);
  return fp;
}

}  // namespace

Fingerprints fingerprint(const StoreView& cache, bool xxh3, ThreadPool* pool) {
  return fingerprint_with(cache, nullptr, xxh3, pool);
}

DeltaFrames build_delta(const StoreView& cache, const JournalBase& base, uint64_t max_frame_bytes,
                        ThreadPool* pool) {
  const Geometry& g = cache.geometry();
  DeltaFrames d;
  std::vector<std::vector<TierRecord>> records;
  d.now = fingerprint_with(cache, &records, uses_xxh3(base.format_major), pool);
  const std::vector<std::vector<uint64_t>>& now_rows = d.now.rows;
  if (base.rows.size() != now_rows.size()) fail(KVSDK_E_INTERNAL, "journal base of another shape");
  std::vector<HeadPlan> plans;
  const size_t n_heads_total = size_t(g.n_layers) * g.n_kv_heads;
  std::vector<uint32_t> tier_layers;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    if (base.rows[n_heads_total + l] != now_rows[n_heads_total + l]) tier_layers.push_back(l);
  }
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      const size_t idx = size_t(l) * g.n_kv_heads + h;
      HeadPlan p = plan_head(l, h, base.rows[idx], now_rows[idx]);
      if (!unchanged(p, base.rows[idx].size())) plans.push_back(std::move(p));
    }
  }
  // Pack entries into parts of at most max_frame_bytes (rows and segments).
  const uint64_t row_bytes = sizeof(int32_t) + uint64_t(g.head_dim) * 4;
  std::vector<std::vector<Entry>> parts(1);
  uint64_t used = 0;
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    const HeadPlan& p = plans[pi];
    const uint64_t seg_bytes = p.segments.size() * sizeof(fb::Segment);
    if (used > 0 && used + seg_bytes + row_bytes > max_frame_bytes) {
      parts.emplace_back();
      used = 0;
    }
    used += seg_bytes;
    size_t r = 0;
    bool first = true;
    do {
      uint64_t fit = used < max_frame_bytes ? (max_frame_bytes - used) / row_bytes : 0;
      if (fit == 0 && !first) {
        parts.emplace_back();
        used = 0;
        fit = max_frame_bytes / row_bytes;
      }
      const size_t take = size_t(std::min<uint64_t>(std::max<uint64_t>(fit, 1), p.new_rows.size() - r));
      parts.back().push_back({pi, first, r, r + take});
      used += take * row_bytes;
      r += take;
      first = false;
    } while (r < p.new_rows.size());
  }
  // Serialize.
  const size_t dim = g.head_dim;
  std::vector<uint64_t> appended(g.n_layers);
  for (uint32_t l = 0; l < g.n_layers; ++l) appended[l] = cache.layer(l).appended_tokens;
  for (size_t part = 0; part < parts.size(); ++part) {
    flatbuffers::FlatBufferBuilder fbb(1024);
    std::vector<flatbuffers::Offset<fb::HeadDelta>> heads;
    std::vector<int32_t> pos;
    std::vector<uint16_t> k, v;
    for (const Entry& e : parts[part]) {
      const HeadPlan& p = plans[e.plan];
      const ExactStore& s = cache.exact_rows(p.layer, p.head);
      pos.clear();
      k.clear();
      v.clear();
      for (size_t i = e.begin; i < e.end; ++i) {
        const size_t row = p.new_rows[i];
        pos.push_back(s.positions[row]);
        k.insert(k.end(), s.k.begin() + row * dim, s.k.begin() + (row + 1) * dim);
        v.insert(v.end(), s.v.begin() + row * dim, s.v.begin() + (row + 1) * dim);
      }
      const auto rows =
          fb::CreateExactRows(fbb, fbb.CreateVector(pos), fbb.CreateVector(k), fbb.CreateVector(v));
      flatbuffers::Offset<flatbuffers::Vector<const fb::Segment*>> segs = 0;
      if (e.with_segments) segs = fbb.CreateVectorOfStructs(p.segments);
      heads.push_back(fb::CreateHeadDelta(fbb, p.layer, p.head, segs, rows));
    }
    const bool last = part + 1 == parts.size();
    // The policy state goes into the last part: observation windows as the queries they kept
    // plus their new ones (format major 3), H2O scores (every observe changes each of them in
    // place, mostly in their low bits) as differences against the scores of the same rows at
    // the base (format 3.1), else whole.
    const bool v3 = base.format_major >= 3;
    const bool score_diffs = base.format_major > 3 || (v3 && base.format_minor >= 1);
    const auto policy_state =
        last ? build_policy_state(fbb, cache, v3 ? &base.windows : nullptr,
                                  score_diffs ? &base.scores : nullptr,
                                  score_diffs ? &d.now.scores : nullptr)
             : flatbuffers::Offset<fb::PolicyState>(0);
    // Changed compressed layers go into the last part too: field by field against their records
    // at the base (format major 3; by typed table and field id from major 4), or whole (older
    // files, or a layer whose records changed shape; as typed tables from major 4). A delta
    // continues its file in the file's format: a 3.x file gets 3.x deltas.
    const bool typed = base.format_major >= 4;
    flatbuffers::Offset<flatbuffers::Vector<uint32_t>> tier_layer_vec = 0;
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::TierState>>> tier_vec = 0;
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::TierRecordDelta>>> delta_vec = 0;
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::TypedTierState>>> typed_vec = 0;
    if (last && !tier_layers.empty()) {
      std::vector<flatbuffers::Offset<fb::TierState>> states;
      std::vector<flatbuffers::Offset<fb::TypedTierState>> typed_states;
      std::vector<flatbuffers::Offset<fb::TierRecordDelta>> deltas;
      for (uint32_t l : tier_layers) {
        if (base.format_major >= 3 && l < base.tiers.size() && can_delta(base.tiers[l], records[l])) {
          for (const auto& rd : build_layer_delta(fbb, base.tiers[l], records[l], typed)) {
            deltas.push_back(rd);
          }
          continue;
        }
        for (const TierRecord& r : records[l]) {
          if (typed) typed_states.push_back(build_typed_tier(fbb, r));
          else states.push_back(build_tier_state(fbb, r));
        }
      }
      tier_layer_vec = fbb.CreateVector(tier_layers);
      if (!states.empty()) tier_vec = fbb.CreateVector(states);
      if (!typed_states.empty()) typed_vec = fbb.CreateVector(typed_states);
      if (!deltas.empty()) delta_vec = fbb.CreateVector(deltas);
    }
    const auto delta = fb::CreateJournalDelta(
        fbb, base.next_sequence, uint32_t(part), uint32_t(parts.size()), fbb.CreateVector(heads),
        last ? fbb.CreateVector(appended) : 0, policy_state, tier_layer_vec, tier_vec, delta_vec,
        typed_vec);
    fbb.Finish(fb::CreateFrame(fbb, fb::Payload::JournalDelta, delta.Union()),
               fb::FrameIdentifier());
    d.parts.emplace_back(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  }
  return d;
}

void apply_delta(const Geometry& g, const std::vector<const fb::JournalDelta*>& parts,
                 uint16_t format_major, std::vector<LayerState>& layers,
                 std::vector<std::vector<TierRecord>>& tiers) {
  const size_t dim = g.head_dim;
  struct HeadWork {
    const flatbuffers::Vector<const fb::Segment*>* segments = nullptr;
    std::vector<const fb::ExactRows*> rows;
  };
  std::map<std::pair<uint32_t, uint32_t>, HeadWork> work;  // ordered: deterministic
  const flatbuffers::Vector<uint64_t>* appended = nullptr;
  for (const fb::JournalDelta* part : parts) {
    if (part->layer_appended_tokens()) {
      if (part != parts.back()) fail(KVSDK_E_CORRUPT, "journal: appended counts before last part");
      appended = part->layer_appended_tokens();
    }
    if (!part->heads()) continue;
    for (const fb::HeadDelta* hd : *part->heads()) {
      if (hd->layer() >= g.n_layers || hd->kv_head() >= g.n_kv_heads) {
        fail(KVSDK_E_CORRUPT, "journal: head (", hd->layer(), ", ", hd->kv_head(),
             ") outside the geometry");
      }
      HeadWork& w = work[{hd->layer(), hd->kv_head()}];
      const bool first = w.segments == nullptr && w.rows.empty();
      if (first != (hd->segments() != nullptr)) {
        fail(KVSDK_E_CORRUPT, "journal: segments of head (", hd->layer(), ", ", hd->kv_head(),
             ") missing or repeated");
      }
      if (hd->segments()) w.segments = hd->segments();
      const fb::ExactRows* r = hd->new_rows();
      if (!r || !r->positions() || !r->keys() || !r->values()) {
        fail(KVSDK_E_CORRUPT, "journal: head delta without rows");
      }
      const size_t n = r->positions()->size();
      if (r->keys()->size() != n * dim || r->values()->size() != n * dim) {
        fail(KVSDK_E_CORRUPT, "journal: row arrays of mismatched sizes");
      }
      check_positions(r->positions()->data(), n, "journal: new rows' positions",
                      KVSDK_E_CORRUPT);
      w.rows.push_back(r);
    }
  }
  if (!appended || appended->size() != g.n_layers) {
    fail(KVSDK_E_CORRUPT, "journal: last part lacks the per-layer appended counts");
  }
  for (auto& [key, w] : work) {
    ExactStore& old = layers[key.first].heads[key.second];
    std::vector<const fb::ExactRows*> src = w.rows;
    size_t src_i = 0, src_row = 0;
    // A leading copy of the previous rows from the first one stays where it is, and only what
    // follows is rebuilt: an append-only delta costs its new rows, not the head's whole state
    // (a journal of many deltas would otherwise load in time quadratic in their number).
    uint64_t keep = 0, total = 0, available = old.size();
    for (const fb::ExactRows* r : w.rows) available += r->positions()->size();
    for (const fb::Segment* s : *w.segments) {
      if (s->count() > available - total) {
        fail(KVSDK_E_CORRUPT, "journal: segments hold more rows than there are");
      }
      total += s->count();
    }
    ExactStore next;
    uint64_t copied_end = 0;  // copy segments move forward: survivors keep their order
    bool first_segment = true;
    for (const fb::Segment* s : *w.segments) {
      const uint64_t count = s->count();
      if (first_segment && s->base_begin() == 0 && count <= old.size()) {
        first_segment = false;
        keep = count;
        copied_end = count;
        next.positions.reserve(total - keep);
        next.k.reserve((total - keep) * dim);
        next.v.reserve((total - keep) * dim);
        continue;
      }
      first_segment = false;
      if (s->base_begin() != kNewRows) {
        const uint64_t b = s->base_begin();
        if (b < copied_end || b > old.size() || count > old.size() - b) {
          fail(KVSDK_E_CORRUPT, "journal: segment copies rows out of order or beyond the "
               "previous state");
        }
        copied_end = b + count;
        next.positions.insert(next.positions.end(), old.positions.begin() + b,
                              old.positions.begin() + b + count);
        next.k.insert(next.k.end(), old.k.begin() + b * dim, old.k.begin() + (b + count) * dim);
        next.v.insert(next.v.end(), old.v.begin() + b * dim, old.v.begin() + (b + count) * dim);
        continue;
      }
      for (uint64_t c = 0; c < count; ++c) {
        while (src_i < src.size() && src_row >= src[src_i]->positions()->size()) {
          ++src_i;
          src_row = 0;
        }
        if (src_i == src.size()) fail(KVSDK_E_CORRUPT, "journal: segments need more new rows");
        const fb::ExactRows* r = src[src_i];
        next.positions.push_back(r->positions()->Get(uint32_t(src_row)));
        const uint16_t* k = r->keys()->data() + src_row * dim;
        const uint16_t* v = r->values()->data() + src_row * dim;
        next.k.insert(next.k.end(), k, k + dim);
        next.v.insert(next.v.end(), v, v + dim);
        ++src_row;
      }
    }
    while (src_i < src.size() && src_row >= src[src_i]->positions()->size()) {
      ++src_i;
      src_row = 0;
    }
    if (src_i != src.size()) fail(KVSDK_E_CORRUPT, "journal: new rows left over after segments");
    if (keep == 0) {
      old = std::move(next);
    } else {
      old.positions.resize(keep);
      old.k.resize(keep * dim);
      old.v.resize(keep * dim);
      old.positions.insert(old.positions.end(), next.positions.begin(), next.positions.end());
      old.k.insert(old.k.end(), next.k.begin(), next.k.end());
      old.v.insert(old.v.end(), next.v.begin(), next.v.end());
    }
  }
  for (uint32_t l = 0; l < g.n_layers; ++l) layers[l].appended_tokens = appended->Get(l);
  const fb::JournalDelta* last = parts.back();
  if (last->tier_layers()) {
    std::vector<std::vector<TierRecord>> replaced(g.n_layers);
    std::vector<bool> listed(g.n_layers, false);
    for (uint32_t l : *last->tier_layers()) {
      if (l >= g.n_layers || listed[l]) fail(KVSDK_E_CORRUPT, "journal: bad tier layer list");
      listed[l] = true;
    }
    // Whole records: generic TierStates up to format major 3, typed tables from major 4.
    const bool typed = format_major >= 4;
    if ((typed && last->tiers()) || (!typed && last->typed_tiers())) {
      fail(KVSDK_E_CORRUPT, "journal: ", typed ? "untyped" : "typed",
           " tier records in a format ", format_major, " file");
    }
    const auto take = [&](TierRecord r) {
      if (r.layer >= g.n_layers || !listed[r.layer]) {
        fail(KVSDK_E_CORRUPT, "journal: tier record for a layer the delta does not replace");
      }
      replaced[r.layer].push_back(std::move(r));
    };
    if (last->tiers()) {
      for (const fb::TierState* t : *last->tiers()) take(read_tier_state(*t));
    }
    if (last->typed_tiers()) {
      for (const fb::TypedTierState* t : *last->typed_tiers()) take(read_typed_tier(*t));
    }
    if (tiers.size() != g.n_layers) tiers.resize(g.n_layers);
    if (last->tier_deltas()) {
      if (format_major < 3) {
        fail(KVSDK_E_CORRUPT, "journal: field deltas of compressed stores in a format ",
             format_major, " file");
      }
      // A layer's records come whole or as deltas of all its records before, in order.
      std::vector<size_t> next(g.n_layers, 0);
      for (const fb::TierRecordDelta* d : *last->tier_deltas()) {
        const uint32_t l = d->layer();
        if (l >= g.n_layers || !listed[l] || (next[l] == 0 && !replaced[l].empty())) {
          fail(KVSDK_E_CORRUPT, "journal: tier record delta for a layer the delta does not "
               "replace, or replaces whole");
        }
        if (next[l] >= tiers[l].size()) {
          fail(KVSDK_E_CORRUPT, "journal: more tier record deltas for layer ", l,
               " than it had records");
        }
        replaced[l].push_back(apply_record_delta(*d, tiers[l][next[l]], typed));
        ++next[l];
      }
      for (uint32_t l = 0; l < g.n_layers; ++l) {
        if (next[l] != 0 && next[l] != tiers[l].size()) {
          fail(KVSDK_E_CORRUPT, "journal: layer ", l, " has ", next[l], " tier record deltas for ",
               tiers[l].size(), " records");
        }
      }
    }
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      if (listed[l]) tiers[l] = std::move(replaced[l]);
    }
  }
}

}  // namespace kvsdk::format
