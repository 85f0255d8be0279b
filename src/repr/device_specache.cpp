#include "repr/device_specache.h"

#include <algorithm>

#include "repr/head_store.h"
#include "repr/kivi_repr.h"
#include "repr/specache_repr.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half_array.h"

namespace kvsdk {

DeviceSpeCache::DeviceSpeCache(const Geometry& g, const kvsdk_policy& p, Context& ctx)
    : Representation(g, p),
      ctx_(ctx),
      device_(ctx.ops()),
      regions_(*ctx.regions()),
      config_(kivi_config(p)),
      fetch_tokens_(size_t(p.fetch_tokens)),
      capacity_(size_t(g.n_layers) * g.n_kv_heads, 0),
      fetched_(size_t(g.n_layers) * g.n_kv_heads),
      queries_(ctx.ops()),
      fetched_pos_(ctx.ops()),
      scores_device_(ctx.ops()),
      hits_(g.n_layers, g.n_kv_heads) {
  KVSDK_REQUIRE(p.quant_bits == 1 || p.quant_bits == 2,
                "method 'specache' keeps a 1- or 2-bit copy (got quant_bits ", p.quant_bits, ")");
  if (!device_.attend_specache_tier || !device_.specache_scores_tier ||
      !device_.specache_select_tier || !device_.specache_shares_tier) {
    fail(KVSDK_E_UNSUPPORTED, "the ", device_.name, " backend has no SpeCache kernels");
  }
  lowbit_ = std::make_unique<DeviceKivi>(g, p, ctx);  // (head_dim checks)
  lowbit_->set_ops(ctx.ops(), ctx.pool().size());
  make_backing(cpu::make_host_backing(cpu::SpeCacheBackingStore::block_elems(g.head_dim)));
  layout_ = layout_for(capacity_);
  regions_.join(this);
}

DeviceSpeCache::~DeviceSpeCache() { regions_.leave(this); }

void DeviceSpeCache::make_backing(std::shared_ptr<cpu::BackingArena> arena) {
  arena_ = std::move(arena);
  backing_.clear();
  backing_.resize(geometry_.n_layers);
  for (auto& layer : backing_) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      layer.emplace_back(geometry_.head_dim, arena_);
    }
  }
}

void DeviceSpeCache::set_backing_file(const std::string& path) {
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
      if (lowbit_->head_tokens(l, h) != 0) {
        fail(KVSDK_E_STATE, "the SpeCache backing file must be set before the first append");
      }
    }
  }
  make_backing(cpu::open_file_backing(
      path, cpu::SpeCacheBackingStore::block_elems(geometry_.head_dim)));
}

// --- Layout of the fetched rows ------------------------------------------------------------------

cuda::ArenaPartition DeviceSpeCache::layout_for(const std::vector<uint64_t>& capacity) const {
  cuda::ArenaPartition p;
  p.tiers = size_t(geometry_.n_kv_heads) * kParts;
  p.slices.resize(size_t(geometry_.n_layers) * p.tiers);
  // Every head's f16 rows first (multiples of 16 bytes, read with vector loads), then the token
  // indices: no slice needs padding, and a tight layout is the bytes the budget charges.
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  uint64_t offset = 0;
  for (Part part : {kKeys, kValues, kTokens}) {
    for (size_t head = 0; head < capacity.size(); ++head) {
      const uint64_t bytes = capacity[head] * (part == kTokens ? sizeof(uint32_t) : row);
      p.slices[head * kParts + part] = {offset, bytes};
      offset += bytes;
    }
  }
  p.reserved = cuda::align_up(offset, 16);
  return p;
}

char* DeviceSpeCache::slice(uint32_t layer, uint32_t head, Part part) const {
  return regions_.base(this) + layout_.at(layer, size_t(head) * kParts + part).offset;
}

void DeviceSpeCache::relayout(const std::vector<uint64_t>& capacity) {
  const cuda::ArenaPartition next = layout_for(capacity);
  regions_.grow(this, std::max(next.reserved, layout_.reserved));  // (BUDGET: nothing changed)
  std::vector<uint64_t> used(layout_.slices.size());
  const uint64_t row = uint64_t(geometry_.head_dim) * sizeof(uint16_t);
  for (size_t i = 0; i < used.size(); ++i) {
    const Part part = Part(i % kParts);
    used[i] = fetched_[i / kParts].size() * (part == kTokens ? sizeof(uint32_t) : row);
  }
  char* const at = regions_.base(this);
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(layout_, next, used)) {
    device_.copy(at + c.dst, at + c.src, size_t(c.bytes));
  }
  layout_ = next;
  capacity_ = capacity;
}

void DeviceSpeCache::reserve_rows(uint32_t layer, uint32_t head, size_t rows) {
  if (capacity_[index(layer, head)] >= rows) return;
  std::vector<uint64_t> next = capacity_;
  // Up to fetch_tokens rows; by half while the copy is shorter than that (a fetch takes every
  // token then, one more each step).
  next[index(layer, head)] = std::max<uint64_t>(
      rows, std::min<uint64_t>(fetch_tokens_, grown_capacity(capacity_[index(layer, head)], rows)));
  if (layout_for(next).reserved > regions_.room_for(this)) {
    next[index(layer, head)] = rows;  // exactly the rows when growth does not fit
  }
  relayout(next);
}

uint64_t DeviceSpeCache::shrink_to_fit() {
  std::vector<uint64_t> tight(capacity_.size());
  for (size_t i = 0; i < tight.size(); ++i) tight[i] = fetched_[i].size();
  if (tight != capacity_) relayout(tight);  // (within the region: it only shrinks)
  return layout_.reserved;
}

// --- Bytes ---------------------------------------------------------------------------------------

void DeviceSpeCache::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  lowbit_->add_bytes(layer, by_tier);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {  // as cpu::SpeCacheFetched::bytes()
    const uint64_t n = fetched_[index(layer, h)].size();
    by_tier[KVSDK_TIER_EXACT] += 2 * 2 * n * geometry_.head_dim;  // fetched f16 rows
    by_tier[KVSDK_TIER_METADATA] += 4 * n;                        // their token indices
  }
}

uint64_t DeviceSpeCache::backing_bytes() const { return arena_->bytes(); }

uint64_t DeviceSpeCache::device_reserved_bytes() const {
  return lowbit_->device_reserved_bytes() + layout_.reserved;
}

uint64_t DeviceSpeCache::append_bound(uint32_t layer, size_t n_tokens) const {
  return lowbit_->append_bound(layer, n_tokens);  // (fetched rows change in prefetch only)
}

size_t DeviceSpeCache::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return lowbit_->head_tokens(layer, kv_head);
}

// --- Append --------------------------------------------------------------------------------------

void DeviceSpeCache::append(uint32_t layer, size_t n, const float* k, const float* v,
                            const int32_t* positions) {
  // The backing blocks first (a full disk or file error then changes nothing), then the low-bit
  // copy (which throws with nothing changed, or marks itself failed), then the backing rows,
  // which cannot fail once reserved. Fetched token indices never move on an append.
  for (cpu::SpeCacheBackingStore& b : backing_[layer]) b.reserve(n);
  const size_t dim = geometry_.head_dim;
  at_least(append_k_, n * dim);
  at_least(append_v_, n * dim);
  lowbit_->append(layer, n, k, v, positions);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    head_rows(k, v, n, h, append_k_.data(), append_v_.data());
    backing_[layer][h].append(append_k_.data(), append_v_.data(), n);
  }
}

// --- Scores, attention and the hit rate ----------------------------------------------------------

float* DeviceSpeCache::score_head(uint32_t layer, uint32_t kv_head,
                                  const backend::QueryRows& host_q) const {
  const size_t n = lowbit_->head_tokens(layer, kv_head);
  // The scores, then room for the selection's tokens or the rows' shares (4 bytes each).
  const size_t floats = host_q.n_rows * n, extra = std::max<size_t>(fetch_tokens_, host_q.n_rows);
  float* d_scores = static_cast<float*>(scores_device_.at_least((floats + extra) * sizeof(float)));
  const backend::QueryRows q = queries_.to_device(host_q);
  const DeviceKivi::DeviceView view = lowbit_->device_view(layer, kv_head);
  device_.specache_scores_tier(q, view.tier, view.residual, workspace(), d_scores);
  return d_scores;
}

void DeviceSpeCache::measure(uint32_t layer, uint32_t h, const float* q_rows,
                             const int32_t* row_positions) const {
  // The real query's low-bit attention on the fetched tokens: the first query (its group's rows)
  // of the first attend after a prefetch, as the host store measures it; one float per row
  // comes back.
  const size_t group = geometry_.group_size(), n = lowbit_->head_tokens(layer, h);
  float* d_scores = score_head(layer, h, query_rows(q_rows, row_positions, group));
  float* d_shares = d_scores + group * n;
  device_.specache_shares_tier(d_scores, group, n,
                               reinterpret_cast<const uint32_t*>(slice(layer, h, kTokens)),
                               fetched_[index(layer, h)].size(), d_shares);
  reserve_for_growth(shares_, group);
  shares_.resize(group);
  device_.to_host(shares_.data(), d_shares, group * sizeof(float));
  double share = 0;
  for (size_t r = 0; r < group; ++r) share += shares_[r];
  hits_.measured(layer, h, share / double(group));
}

void DeviceSpeCache::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                            const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, kv_head, 1, q_rows, row_positions, n_rows, out);
}

void DeviceSpeCache::attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                                  const int32_t* row_positions, size_t n_rows, float* out) const {
  attend_range(layer, 0, n_kv, q_rows, row_positions, n_rows, out);
}

void DeviceSpeCache::attend_range(uint32_t layer, uint32_t first, uint32_t n_heads,
                                  const float* q_rows, const int32_t* row_positions,
                                  size_t n_rows, float* out) const {
  lowbit_->check_usable();
  const Context::DeviceScope on_device(ctx_);
  const size_t group = geometry_.group_size(), per_head = n_rows * geometry_.head_dim;
  for (uint32_t i = 0; i < n_heads; ++i) {
    if (hits_.pending(layer, first + i) && n_rows >= group) {
      measure(layer, first + i, q_rows + i * per_head, row_positions);
    }
  }
  // The fetched rows' positions (the copy's, by token index) for the kernel's causal mask: every
  // head's at fetch_tokens apart, in one transfer.
  const size_t stride = std::max<size_t>(fetch_tokens_, 1);
  reserve_for_growth(fetched_pos_host_, n_heads * stride);
  fetched_pos_host_.resize(n_heads * stride);
  size_t used = 0;
  for (uint32_t i = 0; i < n_heads; ++i) {
    const std::vector<uint32_t>& tokens = fetched_[index(layer, first + i)];
    const int32_t* pos = lowbit_->row_positions(layer, first + i);
    for (size_t j = 0; j < tokens.size(); ++j) fetched_pos_host_[i * stride + j] = pos[tokens[j]];
    if (!tokens.empty()) used = i * stride + tokens.size();
  }
  int32_t* d_pos =
      static_cast<int32_t*>(fetched_pos_.at_least(n_heads * stride * sizeof(int32_t)));
  if (used) device_.to_backend(d_pos, fetched_pos_host_.data(), used * sizeof(int32_t));
  queries_.attend_heads(
      query_rows(q_rows, row_positions, n_rows), first, n_heads, uint32_t(group), out,
      [&](uint32_t head, const backend::QueryRows& q, float* device_out) {
        const DeviceKivi::DeviceView view = lowbit_->device_view(layer, head);
        backend::F16Rows fetched;
        fetched.k = reinterpret_cast<const uint16_t*>(slice(layer, head, kKeys));
        fetched.v = reinterpret_cast<const uint16_t*>(slice(layer, head, kValues));
        fetched.positions = d_pos + (head - first) * stride;
        fetched.n_tokens = fetched_[index(layer, head)].size();
        device_.attend_specache_tier(q, view.tier, view.residual, fetched,
                                     reinterpret_cast<const uint32_t*>(slice(layer, head, kTokens)),
                                     workspace(), device_out);
      });
}

void DeviceSpeCache::begin_attend() const noexcept { hits_.begin(); }
void DeviceSpeCache::commit_attend() const noexcept { hits_.commit(); }
void DeviceSpeCache::abort_attend() const noexcept { hits_.abort(); }
double DeviceSpeCache::hit_rate() const { return hits_.rate(); }

// --- Prefetch ------------------------------------------------------------------------------------

uint64_t DeviceSpeCache::prefetch_bound(uint32_t layer, uint32_t kv_head) const {
  const uint64_t rows = std::min<uint64_t>(fetch_tokens_, lowbit_->head_tokens(layer, kv_head));
  const uint64_t most = rows * (4 + 2 * 2 * uint64_t(geometry_.head_dim));  // index + f16 k, v
  const uint64_t now =
      fetched_[index(layer, kv_head)].size() * (4 + 4 * uint64_t(geometry_.head_dim));
  return most > now ? most - now : 0;
}

void DeviceSpeCache::prefetch(uint32_t layer, uint32_t kv_head, const float* q_rows,
                              const int32_t* row_positions, size_t n_rows) {
  const size_t group = geometry_.group_size();
  KVSDK_REQUIRE(n_rows == group, "SpeCache prefetches with one speculative query per step (got ",
                n_rows / group, ")");
  lowbit_->check_usable();
  const Context::DeviceScope on_device(ctx_);
  // One speculative query per head of the group, at the first row's position (as the host
  // store: the positions of the other rows are that one's).
  const size_t n = lowbit_->head_tokens(layer, kv_head);
  reserve_for_growth(fetched_pos_host_, group);
  fetched_pos_host_.assign(group, row_positions[0]);
  float* d_scores =
      score_head(layer, kv_head, query_rows(q_rows, fetched_pos_host_.data(), group));
  // The selection where the scores are; the k token indices come back.
  uint32_t* d_tokens = reinterpret_cast<uint32_t*>(d_scores + group * n);
  device_.specache_select_tier(d_scores, group, n, fetch_tokens_, workspace(), d_tokens);
  const size_t kept = std::min(fetch_tokens_, n);
  reserve_for_growth(selected_, kept);
  selected_.resize(kept);
  if (kept) device_.to_host(selected_.data(), d_tokens, kept * sizeof(uint32_t));
  cpu::specache_fetch(backing_[layer][kv_head], selected_, staged_fetch_);
  reserve_rows(layer, kv_head, selected_.size());
  upload_fetch(layer, kv_head, staged_fetch_);
  hits_.prefetched(layer, kv_head);
}

void DeviceSpeCache::upload_fetch(uint32_t layer, uint32_t kv_head,
                                  const cpu::SpeCacheFetched& f) {
  std::vector<uint32_t>& mirror = fetched_[index(layer, kv_head)];
  reserve_for_growth(mirror, f.tokens.size());
  mirror.clear();  // (a failure below leaves the head without a fetch: consistent)
  const backend::HostCopy copies[] = {
      {slice(layer, kv_head, kKeys), f.k.data(), f.k.size() * sizeof(uint16_t)},
      {slice(layer, kv_head, kValues), f.v.data(), f.v.size() * sizeof(uint16_t)},
      {slice(layer, kv_head, kTokens), f.tokens.data(), f.tokens.size() * sizeof(uint32_t)}};
  if (!f.tokens.empty()) backend::to_backend_all(device_, copies, 3);
  mirror.assign(f.tokens.begin(), f.tokens.end());
}

void DeviceSpeCache::download_fetch(uint32_t layer, uint32_t kv_head, std::vector<uint16_t>& k,
                                    std::vector<uint16_t>& v) const {
  const size_t elems = fetched_[index(layer, kv_head)].size() * geometry_.head_dim;
  k.resize(elems);
  v.resize(elems);
  if (elems == 0) return;
  device_.to_host(k.data(), slice(layer, kv_head, kKeys), elems * sizeof(uint16_t));
  device_.to_host(v.data(), slice(layer, kv_head, kValues), elems * sizeof(uint16_t));
}

// --- Reads, snapshots, truncation ----------------------------------------------------------------

void DeviceSpeCache::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                          int32_t* positions) const {
  const Context::DeviceScope on_device(ctx_);
  const cpu::KiviHeadStore copy = lowbit_->stage_head(layer, kv_head);
  const size_t n = copy.size(), dim = geometry_.head_dim;
  std::vector<float> kf(k ? 0 : n * dim), vf(v ? 0 : n * dim);
  float* kd = k ? k : kf.data();
  float* vd = v ? v : vf.data();
  copy.read_rows(0, n, kd, vd);
  std::vector<uint16_t> fk, fv;
  download_fetch(layer, kv_head, fk, fv);
  const std::vector<uint32_t>& tokens = fetched_[index(layer, kv_head)];
  for (size_t i = 0; i < tokens.size(); ++i) {  // what attention substitutes
    f16_to_f32_array(&fk[i * dim], kd + size_t(tokens[i]) * dim, dim);
    f16_to_f32_array(&fv[i * dim], vd + size_t(tokens[i]) * dim, dim);
  }
  if (positions) std::copy_n(copy.positions().data(), n, positions);
}

std::vector<TierRecord> DeviceSpeCache::save(uint32_t layer) const {
  const Context::DeviceScope on_device(ctx_);
  std::vector<TierRecord> out;
  out.reserve(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    std::vector<uint16_t> fk, fv;
    download_fetch(layer, h, fk, fv);
    out.push_back(specache_head_record(layer, h, lowbit_->stage_head(layer, h), backing_[layer][h],
                                       fetched_[index(layer, h)], std::move(fk), std::move(fv)));
  }
  return out;
}

void DeviceSpeCache::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  std::vector<cpu::SpeCacheHead> heads =
      specache_layer_from_records(geometry_, config_, fetch_tokens_, arena_, layer, records);
  std::vector<cpu::KiviHeadStore> copies;
  for (const cpu::SpeCacheHead& s : heads) copies.push_back(s.lowbit());
  const Context::DeviceScope on_device(ctx_);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    reserve_rows(layer, h, heads[h].fetched().tokens.size());
  }
  lowbit_->restore_heads(layer, copies);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    upload_fetch(layer, h, heads[h].fetched());
    backing_[layer][h] = std::move(heads[h].backing());
    hits_.forget(layer, h);
  }
}

std::string DeviceSpeCache::truncate_refusal(uint32_t layer, int32_t position) const {
  return lowbit_->truncate_refusal(layer, position);
}

void DeviceSpeCache::truncate(uint32_t layer, int32_t position) noexcept {
  // The backing first: it reads the copy's positions of the rows it drops (those after the
  // quantized blocks, as SpeCacheHead::remove_from).
  size_t removed = 0;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    removed += backing_[layer][h].remove_from(lowbit_->quantized_tokens(layer, h),
                                              lowbit_->row_positions(layer, h), position);
  }
  lowbit_->truncate(layer, position);
  if (removed == 0) return;  // the layer's current step still exists: its fetch stays
  // The fetched rows were chosen for a step that no longer exists (specache_repr.cpp explains).
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    fetched_[index(layer, h)].clear();
    hits_.forget(layer, h);
  }
}

}  // namespace kvsdk
