#include "repr/specache_repr.h"

#include <algorithm>

#include "attention.h"
#include "repr/kivi_repr.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"

namespace kvsdk {

SpeCacheRepresentation::SpeCacheRepresentation(const Geometry& g, const kvsdk_policy& p)
    : Representation(g, p),
      config_(kivi_config(p)),
      fetch_tokens_(size_t(p.fetch_tokens)),
      hits_(g.n_layers, g.n_kv_heads) {
  KVSDK_REQUIRE(p.quant_bits == 1 || p.quant_bits == 2,
                "method 'specache' keeps a 1- or 2-bit copy (got quant_bits ", p.quant_bits, ")");
  arena_ = cpu::make_host_backing(cpu::SpeCacheBackingStore::block_elems(g.head_dim));
  make_heads();
}

void SpeCacheRepresentation::make_heads() {
  heads_.clear();
  heads_.resize(geometry_.n_layers);
  attend_scores_.assign(geometry_.n_kv_heads, AttendScores{});
  hits_ = SpeCacheHitRate(geometry_.n_layers, geometry_.n_kv_heads);
  for (auto& layer : heads_) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      layer.emplace_back(geometry_.head_dim, config_, arena_);
    }
  }
}

void SpeCacheRepresentation::set_backing_file(const std::string& path) {
  for (const auto& layer : heads_) {
    for (const cpu::SpeCacheHead& h : layer) {
      if (h.lowbit().size() != 0) {
        fail(KVSDK_E_STATE, "the SpeCache backing file must be set before the first append");
      }
    }
  }
  arena_ = cpu::open_file_backing(path, cpu::SpeCacheBackingStore::block_elems(geometry_.head_dim));
  make_heads();
}

void SpeCacheRepresentation::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  for (const cpu::SpeCacheHead& h : heads_[layer]) {
    const cpu::KiviBytes b = h.lowbit().bytes();
    by_tier[KVSDK_TIER_QUANTIZED] += b.codes + b.scales_zeros;
    by_tier[KVSDK_TIER_EXACT] += b.residual;  // the f16 residual window is exact
    by_tier[KVSDK_TIER_METADATA] += b.positions;
    const cpu::SpeCacheFetched& f = h.fetched();
    by_tier[KVSDK_TIER_EXACT] += 2 * uint64_t(f.k.size() + f.v.size());  // fetched f16 rows
    by_tier[KVSDK_TIER_METADATA] += 4 * uint64_t(f.tokens.size());      // their token indices
  }
}

uint64_t SpeCacheRepresentation::backing_bytes() const {
  return arena_->bytes();  // every block of every head, allocated headroom included
}

uint64_t SpeCacheRepresentation::append_bound(uint32_t layer, size_t n_tokens) const {
  // Only the low-bit copy grows on append (fetched rows change in prefetch); exact, like KIVI's.
  uint64_t before = 0, after = 0;
  for (const cpu::SpeCacheHead& h : heads_[layer]) {
    before += h.lowbit().bytes().total();
    after += h.lowbit().projected_bytes(n_tokens).total();
  }
  return after > before ? after - before : 0;
}

void SpeCacheRepresentation::append(uint32_t layer, size_t n, const float* k, const float* v,
                                    const int32_t* positions) {
  // Grow every head's backing store first: a full disk or file error then changes no head.
  for (cpu::SpeCacheHead& h : heads_[layer]) h.backing().reserve(n);
  const size_t dim = geometry_.head_dim;
  // One head's rows at a time, in reused scratch.
  std::vector<float>& kf = at_least(append_k_, n * dim);
  std::vector<float>& vf = at_least(append_v_, n * dim);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    head_rows(k, v, n, h, kf.data(), vf.data());
    heads_[layer][h].append(kf.data(), vf.data(), positions, n);
  }
}

void SpeCacheRepresentation::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                    const int32_t* row_positions, size_t n_rows,
                                    float* out) const {
  const cpu::SpeCacheHead& h = heads_[layer][kv_head];
  backend::Workspace& ws = workspace();
  const backend::QueryRows rows = query_rows(q_rows, row_positions, n_rows);
  const size_t group = geometry_.group_size(), dim = geometry_.head_dim, n = h.lowbit().size();
  const bool measure = hits_.pending(layer, kv_head);
  AttendScores& kept = attend_scores_[kv_head];
  kept.valid = false;
  // The last query (its group's rows share one position) may be the speculative token that
  // prefetch() is called with next: its scores are kept. Scoring costs one dot product per row
  // and token in a pass that dequantizes anyway. A decode step attends the output token and the
  // speculative token in one call (SpeCache §3.3: both are decoded together), so the low-bit
  // copy is dequantized once for both.
  const size_t last = n_rows >= group ? n_rows - group : 0;  // the last query's first row
  const bool keep = n_rows >= group && std::all_of(row_positions + last, row_positions + n_rows,
                                                   [&](int32_t p) { return p == row_positions[last]; });
  if (!measure && !keep) {
    ops().attend_specache(rows, h.lowbit(), h.fetched(), ws, out);
    return;
  }
  std::vector<float>& scores = at_least(kept.scores, n_rows * n);
  float* shares = measure ? at_least(kept.shares, n_rows).data() : nullptr;
  ops().attend_specache_scored(rows, h.lowbit(), h.fetched(), ws, out, scores.data(), shares);
  if (measure) {
    // The real query's attention (over the low-bit keys) on the rows the speculative token
    // fetched, averaged over the group's heads into the running hit rate (SpeCache
    // (docs/papers.md) §4 reports this share): the first query of the first attend after a
    // prefetch (the output token; a call that also attends the speculative token has it last).
    // Its rows share one position, so they all see tokens or none do (then the share is 0).
    double share = 0;
    for (size_t r = 0; r < group; ++r) share += shares[r];
    hits_.measured(layer, kv_head, share / double(group));
  }
  if (keep) {
    kept.layer = layer;
    kept.tokens = n;
    kept.position = row_positions[last];
    kept.first_row = last;
    kept.ops = &ops();
    std::copy_n(q_rows + last * dim, group * dim, at_least(kept.q, group * dim).data());
    kept.valid = true;
  }
}

void SpeCacheRepresentation::begin_attend() const noexcept { hits_.begin(); }
void SpeCacheRepresentation::commit_attend() const noexcept { hits_.commit(); }
void SpeCacheRepresentation::abort_attend() const noexcept { hits_.abort(); }

size_t SpeCacheRepresentation::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].lowbit().size();
}

void SpeCacheRepresentation::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                                  int32_t* positions) const {
  const cpu::SpeCacheHead& h = heads_[layer][kv_head];
  const size_t n = h.lowbit().size(), dim = geometry_.head_dim;
  std::vector<float> kf(k ? 0 : n * dim), vf(v ? 0 : n * dim);
  float* kd = k ? k : kf.data();
  float* vd = v ? v : vf.data();
  h.lowbit().read_rows(0, n, kd, vd);
  const cpu::SpeCacheFetched& f = h.fetched();
  for (size_t i = 0; i < f.tokens.size(); ++i) {  // what specache_attend substitutes
    for (size_t d = 0; d < dim; ++d) {
      kd[size_t(f.tokens[i]) * dim + d] = f16_to_f32(f.k[i * dim + d]);
      vd[size_t(f.tokens[i]) * dim + d] = f16_to_f32(f.v[i * dim + d]);
    }
  }
  if (positions) std::copy_n(h.lowbit().positions().data(), n, positions);
}

uint64_t SpeCacheRepresentation::prefetch_bound(uint32_t layer, uint32_t kv_head) const {
  const cpu::SpeCacheHead& h = heads_[layer][kv_head];
  const uint64_t rows = std::min(fetch_tokens_, h.lowbit().size());
  const uint64_t most = rows * (4 + 2 * 2 * uint64_t(geometry_.head_dim));  // index + f16 k, v
  const uint64_t now = h.fetched().bytes();
  return most > now ? most - now : 0;
}

void SpeCacheRepresentation::prefetch(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                      const int32_t* row_positions, size_t n_rows) {
  const size_t group = geometry_.group_size();
  KVSDK_REQUIRE(n_rows == group, "SpeCache prefetches with one speculative query per step (got ",
                n_rows / group, ")");
  // One speculative query per head of the group, all at the first row's position.
  const int32_t pos = row_positions[0];
  const size_t dim = geometry_.head_dim, n = heads_[layer][kv_head].lowbit().size();
  AttendScores& kept = attend_scores_[kv_head];
  if (kept.valid && kept.layer == layer && kept.tokens == n && kept.position == pos &&
      kept.ops == &ops() && std::equal(q_rows, q_rows + group * dim, kept.q.begin())) {
    // This query's attention pass already scored the low-bit keys (used up here).
    kept.valid = false;
    ops().specache_select_scored(kept.scores.data() + kept.first_row * n, group, n,
                                 fetch_tokens_, workspace(), kept.selected, nullptr);
  } else {
    ops().specache_select({q_rows, &pos, n_rows, dim, geometry_.attn_scale},
                          heads_[layer][kv_head].lowbit(), fetch_tokens_, workspace(),
                          kept.selected, nullptr);
  }
  heads_[layer][kv_head].fetch(kept.selected);
  hits_.prefetched(layer, kv_head);
}

double SpeCacheRepresentation::hit_rate() const { return hits_.rate(); }

// Truncation. What a SpeCache layer holds per KV head, and what each part needs:
//  - the low-bit KIVI copy: KIVI's streaming rule. A flush quantized its block from the f16
//    residual rows held then, so only residual rows appended after the last flush can go
//    (every row before the first flush).
//  - the f16 backing store (SpeCache §3.2, the full-precision cache off the budget): one row per
//    token in the same order, nothing shared between rows, so the same rows simply go.
//    (It could in principle un-flush a block too, since the copy's blocks are quantized from the
//    same f16 bits, but the KIVI rule is kept: the shadow stays a plain KIVI store and kvsdk.h
//    states one rule for both.)
//  - the rows prefetch() fetched for the next step (§3.3: the speculative token's top-k). They
//    were chosen for a step after the removed tokens, which no longer exists; a cache that never
//    received them holds the rows its own last prefetch chose, which this one cannot know. They
//    are all dropped when the layer loses a token, and the app prefetches again with its next
//    speculative queries (the same queries give the same rows: the low-bit keys they are scored
//    on are the same bits again). Until then attention uses the low-bit rows alone.
//  - attend() keeps nothing in snapshots: the kept single-query scores of the layer are dropped
//    (they scored removed tokens), and the hit rate is a measurement of the attends that ran,
//    the removed steps' included (not saved, never affects results; kvsdk_cache_fetch_stats).
std::string SpeCacheRepresentation::truncate_refusal(uint32_t layer, int32_t position) const {
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const cpu::SpeCacheHead& s = heads_[layer][h];
    if (s.can_remove_from(position)) continue;
    return "layer " + std::to_string(layer) + " KV head " + std::to_string(h) +
           ": SpeCache's low-bit copy quantized tokens at positions >= " +
           std::to_string(position) + " (or tokens appended with them) into a KIVI block; " +
           "only its exact residual rows appended since the last flush can go (it holds " +
           std::to_string(s.lowbit().residual_tokens()) + ")";
  }
  return {};
}

void SpeCacheRepresentation::truncate(uint32_t layer, int32_t position) noexcept {
  size_t removed = 0;
  for (cpu::SpeCacheHead& h : heads_[layer]) removed += h.remove_from(position);
  if (removed == 0) return;  // the layer's current step still exists: its fetch stays
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    heads_[layer][h].drop_fetch();
    hits_.forget(layer, h);  // no prefetch to measure until the next one
  }
  for (AttendScores& a : attend_scores_) a.valid = a.valid && a.layer != layer;
}

TierRecord specache_head_record(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& lowbit,
                                const cpu::SpeCacheBackingStore& backing,
                                const std::vector<uint32_t>& fetched_tokens,
                                std::vector<uint16_t> fetched_k, std::vector<uint16_t> fetched_v) {
  const size_t dim = lowbit.head_dim();
  TierRecord r;
  r.layer = layer;
  r.kv_head = kv_head;
  r.kind = "specache.head";
  kivi_store_to_record(lowbit, "lowbit.", r);
  std::vector<uint16_t> bk(backing.size() * dim), bv(backing.size() * dim);
  for (size_t t = 0; t < backing.size(); ++t) {
    std::copy_n(backing.key_row(t), dim, &bk[t * dim]);
    std::copy_n(backing.value_row(t), dim, &bv[t * dim]);
  }
  // "backing.*": left out of snapshots unless kvsdk_save_options.include_backing (formats/).
  r.add("backing.keys").u16 = std::move(bk);
  r.add("backing.values").u16 = std::move(bv);
  r.add("fetched_tokens").u32 = fetched_tokens;
  r.add("fetched_keys").u16 = std::move(fetched_k);
  r.add("fetched_values").u16 = std::move(fetched_v);
  return r;
}

namespace {

cpu::SpeCacheHead specache_head_from_record(const Geometry& g, const cpu::KiviConfig& config,
                                            size_t fetch_tokens,
                                            const std::shared_ptr<cpu::BackingArena>& arena,
                                            uint32_t layer, uint32_t h, const TierRecord& r) {
  const size_t dim = g.head_dim;
  if (r.kind != "specache.head" || r.kv_head != h) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", h, " is '", r.kind,
         "' for KV head ", r.kv_head, ", expected 'specache.head' for KV head ", h);
  }
  cpu::KiviHeadStore lowbit = kivi_store_from_record(dim, config, "lowbit.", r);
  const size_t n = lowbit.size();
  // Saved without its backing store (include_backing = 0): rebuilt from the low-bit copy, so
  // every later fetch of these tokens carries low-bit precision (tokens appended after the load
  // get their f16 rows): the cache is identical to the saved one only until its next prefetch.
  std::vector<uint16_t> rebuilt_k, rebuilt_v;
  const bool with_backing = r.has("backing.keys") || r.has("backing.values");
  if (!with_backing) {
    std::vector<float> kf(n * dim), vf(n * dim);
    lowbit.read_rows(0, n, kf.data(), vf.data());
    rebuilt_k.resize(n * dim);
    rebuilt_v.resize(n * dim);
    for (size_t i = 0; i < n * dim; ++i) {
      rebuilt_k[i] = f32_to_f16(kf[i]);
      rebuilt_v[i] = f32_to_f16(vf[i]);
    }
  }
  const std::vector<uint16_t>& bk = with_backing ? r.get("backing.keys").u16 : rebuilt_k;
  const std::vector<uint16_t>& bv = with_backing ? r.get("backing.values").u16 : rebuilt_v;
  if (bk.size() != n * dim || bv.size() != n * dim) {
    fail(KVSDK_E_CORRUPT, "snapshot SpeCache layer ", layer, " head ", h, ": backing rows hold ",
         bk.size(), "/", bv.size(), " values, expected ", n * dim, " (", n, " tokens)");
  }
  cpu::SpeCacheFetched f;
  f.tokens = r.get("fetched_tokens").u32;
  f.k = r.get("fetched_keys").u16;
  f.v = r.get("fetched_values").u16;
  if (f.k.size() != f.tokens.size() * dim || f.v.size() != f.tokens.size() * dim ||
      f.tokens.size() > std::min(fetch_tokens, n)) {
    fail(KVSDK_E_CORRUPT, "snapshot SpeCache layer ", layer, " head ", h, ": ", f.tokens.size(),
         " fetched tokens with ", f.k.size(), "/", f.v.size(), " values do not fit ", n,
         " tokens and fetch_tokens ", fetch_tokens);
  }
  for (size_t i = 0; i < f.tokens.size(); ++i) {
    if (f.tokens[i] >= n || (i > 0 && f.tokens[i] <= f.tokens[i - 1])) {
      fail(KVSDK_E_CORRUPT, "snapshot SpeCache layer ", layer, " head ", h,
           ": fetched token indices are not ascending below ", n);
    }
  }
  cpu::SpeCacheBackingStore backing(dim, arena);
  backing.append_f16(bk.data(), bv.data(), n);
  return cpu::SpeCacheHead(std::move(lowbit), std::move(backing), std::move(f));
}

}  // namespace

std::vector<TierRecord> SpeCacheRepresentation::save(uint32_t layer) const {
  std::vector<TierRecord> out;
  out.reserve(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const cpu::SpeCacheHead& s = heads_[layer][h];
    out.push_back(specache_head_record(layer, h, s.lowbit(), s.backing(), s.fetched().tokens,
                                       s.fetched().k, s.fetched().v));
  }
  return out;
}

std::vector<cpu::SpeCacheHead> specache_layer_from_records(
    const Geometry& g, const cpu::KiviConfig& config, size_t fetch_tokens,
    const std::shared_ptr<cpu::BackingArena>& arena, uint32_t layer,
    const std::vector<TierRecord>& records) {
  if (records.size() != g.n_kv_heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " SpeCache head records, expected ", g.n_kv_heads);
  }
  std::vector<cpu::SpeCacheHead> heads;
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
    heads.push_back(
        specache_head_from_record(g, config, fetch_tokens, arena, layer, h, records[h]));
  }
  return heads;
}

void SpeCacheRepresentation::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  heads_[layer] =
      specache_layer_from_records(geometry_, config_, fetch_tokens_, arena_, layer, records);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) hits_.forget(layer, h);
  for (AttendScores& a : attend_scores_) a.valid = a.valid && a.layer != layer;
}

}  // namespace kvsdk
