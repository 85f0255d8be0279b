#include "repr/smallkv_repr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/cache.h"
#include "smallkv.h"
#include "util/dtype.h"
#include "cpu_workspace.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

namespace {

constexpr uint64_t kScoreBytes = sizeof(float), kPositionBytes = sizeof(int32_t);

}  // namespace

SmallKvRepresentation::SmallKvRepresentation(const Geometry& g, const kvsdk_policy& p)
    : Representation(g, p),
      match_tokens_(uint32_t(p.match_tokens)),
      layers_(g.n_layers),
      link_(std::make_shared<SmallKvProxyLink>(uint32_t(p.match_tokens))) {
  KVSDK_REQUIRE(p.match_tokens >= 1, "method 'smallkv' needs match_tokens >= 1");
  for (Layer& l : layers_) {
    l.heads.resize(g.n_kv_heads);
    l.mapping.assign(g.n_q_heads, 0);
  }
}

SmallKvRepresentation::~SmallKvRepresentation() { link_->detach(); }

void SmallKvRepresentation::set_proxy(Cache* proxy) {
  if (!proxy) {
    link_->detach();
    return;
  }
  const uint32_t heads = proxy->geometry().n_layers * proxy->geometry().n_q_heads;
  const uint32_t group = geometry_.group_size();
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
      if (!layers_[l].heads[g].matched) continue;
      for (uint32_t j = 0; j < group; ++j) {
        if (layers_[l].mapping[g * group + j] >= heads) {
          fail(KVSDK_E_GEOMETRY, "this cache's heads were matched to a proxy with more heads (",
               "layer ", l, " head ", g * group + j, " maps to proxy head ",
               layers_[l].mapping[g * group + j], ") than this proxy's ", heads);
        }
      }
    }
  }
  SmallKvProxyLink::attach(link_, *proxy);
  if (all_matched()) on_all_matched();
}

uint64_t SmallKvRepresentation::full_row_bytes() const {
  return uint64_t(geometry_.head_dim) * 2 * 2 + kPositionBytes + kScoreBytes;
}

uint64_t SmallKvRepresentation::marginal_row_bytes() const {
  return uint64_t(geometry_.head_dim) * 2 + kPositionBytes + kScoreBytes;
}

uint64_t SmallKvRepresentation::slack_bytes(uint64_t cap) const {
  return uint64_t(double(policy_.evict_slack) * double(cap));
}

uint64_t SmallKvRepresentation::head_bytes(const Head& h) const {
  return h.full_pos.size() * full_row_bytes() + h.marg_pos.size() * marginal_row_bytes();
}

uint64_t SmallKvRepresentation::fixed_bytes(const Layer& l) const {
  return l.started ? (l.mapping.size() + l.match_stats.size()) * 4 : 0;
}

uint64_t SmallKvRepresentation::total_bytes() const {
  uint64_t b = 0;
  for (const Layer& l : layers_) {
    b += fixed_bytes(l);
    for (const Head& h : l.heads) b += head_bytes(h);
  }
  return b;
}

void SmallKvRepresentation::add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const {
  const Layer& L = layers_[layer];
  const uint64_t dim = geometry_.head_dim;
  for (const Head& h : L.heads) {
    by_tier[KVSDK_TIER_EXACT] += h.full_pos.size() * dim * 4;
    by_tier[KVSDK_TIER_VALUE_ONLY] += h.marg_pos.size() * dim * 2;
    by_tier[KVSDK_TIER_METADATA] += h.size() * (kPositionBytes + kScoreBytes);
  }
  by_tier[KVSDK_TIER_METADATA] += fixed_bytes(L);
}

uint64_t SmallKvRepresentation::append_bound(uint32_t layer, size_t n_tokens) const {
  const Layer& L = layers_[layer];
  uint64_t fixed = 0;
  if (!L.started) fixed = uint64_t(geometry_.n_q_heads) * (1 + uint64_t(match_tokens_)) * 4;
  return uint64_t(n_tokens) * geometry_.n_kv_heads * full_row_bytes() + fixed;
}

bool SmallKvRepresentation::all_matched() const {
  for (const Layer& l : layers_) {
    for (const Head& h : l.heads) {
      if (!h.matched) return false;
    }
  }
  return true;
}

void SmallKvRepresentation::drop_finished_stats() noexcept {
  for (Layer& l : layers_) {
    const bool done =
        std::all_of(l.heads.begin(), l.heads.end(), [](const Head& h) { return h.matched; });
    if (done) std::vector<float>().swap(l.match_stats);
  }
  if (all_matched()) on_all_matched();
}

void SmallKvRepresentation::on_all_matched() const noexcept {
  link_->drop_match_stats();
  if (!link_->proxy() || link_->has_read_heads()) return;
  try {
    std::vector<uint8_t> heads(link_->proxy_heads(), 0);
    for (const Layer& L : layers_) {
      for (uint32_t m : L.mapping) heads[m] = 1;  // (< proxy_heads(): checked by set_proxy)
    }
    link_->set_read_heads(proxy_ops(), heads);
  } catch (...) {
    // (allocation) Nothing lost: the large cache's attend computes the probabilities itself.
  }
}

void SmallKvRepresentation::append(uint32_t layer, size_t n, const float* k, const float* v,
                                   const int32_t* positions) {
  Layer& L = layers_[layer];
  // Reserve everything first so that the bookkeeping below cannot fail half-way.
  // Amortized growth (exact-fit reserves would copy every row on every decode step).
  for (Head& h : L.heads) {
    reserve_for_growth(h.full_pos, h.full_pos.size() + n);
    reserve_for_growth(h.full_score, h.full_pos.size() + n);
  }
  const int32_t lo = *std::min_element(positions, positions + n);
  const int32_t hi = *std::max_element(positions, positions + n);
  const bool all_heads_matched =
      std::all_of(L.heads.begin(), L.heads.end(), [](const Head& h) { return h.matched; });
  std::vector<float> stats;  // the layer's first append: its matching statistics
  if (!L.started && !all_heads_matched) {
    stats.assign(size_t(geometry_.n_q_heads) * match_tokens_, 0.0f);
  }
  rows_append(layer, n, k, v, positions);  // (the rows' home; nothing counts them yet)
  if (!L.started) {
    L.match_stats.swap(stats);
    L.started = true;
    L.first_min = lo;  // a cut at or below it undoes the start (truncate())
  }
  // Only this layer's bytes may change here (the Cache charges this layer's change).
  if (all_heads_matched) {
    // The statistics' values are gone: a cut that removes this whole append cannot bring them
    // back (one that keeps part of it leaves an append that frees them too).
    if (!L.match_stats.empty()) L.frozen_through = std::max(L.frozen_through, lo);
    std::vector<float>().swap(L.match_stats);
  }
  L.newest_held = std::max(L.newest_held, hi);
  for (Head& h : L.heads) {
    h.full_pos.insert(h.full_pos.end(), positions, positions + n);
    h.full_score.resize(h.full_pos.size(), 0.0f);
  }
}

void SmallKvRepresentation::rows_append(uint32_t layer, size_t n, const float* k, const float* v,
                                        const int32_t*) {
  const size_t dim = geometry_.head_dim, row = geometry_.kv_elems_per_token();
  Layer& L = layers_[layer];
  for (Head& h : L.heads) {  // (every head's room first: the copy below cannot fail half-way)
    reserve_for_growth(h.full_k, (h.full_pos.size() + n) * dim);
    reserve_for_growth(h.full_v, (h.full_pos.size() + n) * dim);
  }
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
    Head& h = L.heads[g];
    const size_t old = h.full_pos.size();
    h.full_k.resize((old + n) * dim);
    h.full_v.resize((old + n) * dim);
    for (size_t t = 0; t < n; ++t) {
      store_f32(KVSDK_DTYPE_F16, k + t * row + g * dim, dim, h.full_k.data(), (old + t) * dim);
      store_f32(KVSDK_DTYPE_F16, v + t * row + g * dim, dim, h.full_v.data(), (old + t) * dim);
    }
  }
}

void SmallKvRepresentation::rows_full_keys(uint32_t layer, uint32_t kv_head, size_t count,
                                           float* out) const {
  load_f32(KVSDK_DTYPE_F16, layers_[layer].heads[kv_head].full_k.data(), 0,
           count * geometry_.head_dim, out);
}

void SmallKvRepresentation::rows_attend_full(uint32_t layer, uint32_t first, uint32_t n,
                                             const float* q_rows, const int32_t* row_positions,
                                             size_t n_rows, float* out) const {
  const size_t elems = n_rows * geometry_.head_dim;
  for (uint32_t i = 0; i < n; ++i) {
    const Head& H = layers_[layer].heads[first + i];
    const backend::F16Rows full{H.full_k.data(), H.full_v.data(), H.full_pos.data(),
                                H.full_pos.size()};
    ops().attend_smallkv(query_rows(q_rows + i * elems, row_positions, n_rows), full,
                         backend::SmallKvMarginal{}, workspace(), out + i * elems);
  }
}

void SmallKvRepresentation::rows_add_marginal(uint32_t layer, uint32_t first, uint32_t n,
                                              const float* q_rows, const int32_t* row_positions,
                                              size_t n_rows, const HeadWeights* weights,
                                              float* out) const {
  const size_t elems = n_rows * geometry_.head_dim;
  for (uint32_t i = 0; i < n; ++i) {
    if (!weights[i].marginal) continue;
    const Head& H = layers_[layer].heads[first + i];
    const backend::SmallKvMarginal marginal{H.marg_v.data(), H.marg_pos.data(),
                                            H.marg_pos.size(), weights[i].marginal,
                                            weights[i].stride};
    ops().smallkv_add_marginal(query_rows(q_rows + i * elems, row_positions, n_rows), marginal,
                               workspace(), out + i * elems);
  }
}

const SmallKvRepresentation::Head& SmallKvRepresentation::host_head(uint32_t layer,
                                                                    uint32_t kv_head,
                                                                    Head&) const {
  return layers_[layer].heads[kv_head];
}

void SmallKvRepresentation::accumulate_match_stats(uint32_t layer, uint32_t kv_head,
                                                   const float* q_rows,
                                                   const int32_t* row_positions, size_t n_rows,
                                                   AttendUpdate& u) const {
  const Layer& L = layers_[layer];
  const Head& H = L.heads[kv_head];
  if (L.match_stats.empty()) return;
  const uint32_t dim = geometry_.head_dim, group = geometry_.group_size();
  const size_t nf = H.full_pos.size(), m = std::min<size_t>(nf, match_tokens_);
  if (m == 0) return;
  const int32_t limit =
      nf >= match_tokens_ ? H.full_pos[match_tokens_ - 1] : std::numeric_limits<int32_t>::max();
  // The group's statistics, updated on a copy.
  const size_t slice = size_t(group) * match_tokens_;
  const float* src = L.match_stats.data() + size_t(kv_head) * slice;
  u.stats.assign(src, src + slice);
  u.has_stats = true;
  std::vector<float> k(m * dim), q, acc(m);
  rows_full_keys(layer, kv_head, m, k.data());
  std::vector<int32_t> qpos;
  for (uint32_t j = 0; j < group; ++j) {
    q.clear();
    qpos.clear();
    for (size_t r = j; r < n_rows; r += group) {
      if (row_positions[r] > limit) continue;
      q.insert(q.end(), q_rows + r * dim, q_rows + (r + 1) * dim);
      qpos.push_back(row_positions[r]);
    }
    if (qpos.empty()) continue;
    // Eq. 1 of the large model over the first match_tokens tokens.
    cpu::smallkv_accumulated_attention(q.data(), qpos.data(), qpos.size(), k.data(),
                                       H.full_pos.data(), m, dim, geometry_.attn_scale,
                                       acc.data());
    float* dst = u.stats.data() + size_t(j) * match_tokens_;
    for (size_t t = 0; t < m; ++t) dst[t] += acc[t];
  }
  if (nf >= match_tokens_) {
    for (size_t r = 0; r < n_rows; ++r) {
      if (row_positions[r] >= limit) u.stats_done = true;
    }
  }
}

SmallKvRepresentation::Match SmallKvRepresentation::compute_match(uint32_t layer,
                                                                  uint32_t kv_head,
                                                                  const float* stats) const {
  const Head& H = layers_[layer].heads[kv_head];
  const uint32_t group = geometry_.group_size();
  Match m;
  // Matching tokens: the first rows (no row was evicted before the head is matched).
  const size_t n = std::min<size_t>(H.full_pos.size(), match_tokens_);
  const uint32_t n_proxy = link_->proxy_heads();
  std::vector<float> large(size_t(group) * n, 0.0f);
  m.proxy.assign(size_t(n_proxy) * n, 0.0f);
  m.n = n;
  if (stats) {
    for (uint32_t j = 0; j < group; ++j) {
      std::copy_n(stats + size_t(j) * match_tokens_, n, large.data() + size_t(j) * n);
    }
  }
  for (uint32_t p = 0; p < n_proxy; ++p) {
    link_->match_scores(p, H.full_pos.data(), n, m.proxy.data() + size_t(p) * n);
  }
  // Eqs. 2-3: Jaccard of the top 10% tokens (at least one), argmax over every proxy head.
  const size_t top = std::max<size_t>(1, (n + 9) / 10);
  m.map = cpu::smallkv_match_heads(large.data(), group, m.proxy.data(), n_proxy, n, top);
  return m;
}

void SmallKvRepresentation::add_match_scores(const Match& m, float* full_score) const {
  for (uint32_t j = 0; j < geometry_.group_size(); ++j) {
    for (size_t t = 0; t < m.n; ++t) full_score[t] += m.proxy[size_t(m.map[j]) * m.n + t];
  }
}

void SmallKvRepresentation::apply(AttendUpdate& u) const noexcept {
  Layer& L = layers_[u.layer];
  Head& H = L.heads[u.kv_head];
  const uint32_t group = geometry_.group_size();
  // Matching statistics, mapping and scores are sums over every row held: once they changed,
  // no row held then can be taken back exactly (truncate_refusal()).
  if (u.has_stats || u.matched_now || u.has_scores || u.stats_done != H.stats_done) {
    L.frozen_through = std::max(L.frozen_through, u.held_through);
  }
  if (u.has_stats) {
    std::copy(u.stats.begin(), u.stats.end(),
              L.match_stats.begin() + long(size_t(u.kv_head) * group * match_tokens_));
  }
  H.stats_done = u.stats_done;
  if (u.matched_now) {
    std::copy(u.map.begin(), u.map.end(), L.mapping.begin() + long(size_t(u.kv_head) * group));
    H.scores_from = u.scores_from;
    H.matched = true;
    H.stats_done = true;
  }
  if (u.has_scores) {
    H.full_score.swap(u.full_score);
    H.marg_score.swap(u.marg_score);
  }
  if (u.matched_now && all_matched()) on_all_matched();
}

// Spent updates go back to spare_ (apply() left the replaced score buffers in them), so the next
// attend() copies the scores into buffers that already have the capacity instead of allocating.
void SmallKvRepresentation::recycle_staged() const noexcept {
  for (AttendUpdate& u : staged_) {
    if (spare_.size() < spare_.capacity()) spare_.push_back(std::move(u));
  }
  staged_.clear();
}

void SmallKvRepresentation::begin_attend() const noexcept {
  recycle_staged();
  staging_ = true;
}

void SmallKvRepresentation::commit_attend() const noexcept {
  for (AttendUpdate& u : staged_) apply(u);
  recycle_staged();
  staging_ = false;
}

void SmallKvRepresentation::abort_attend() const noexcept {
  recycle_staged();
  staging_ = false;
}

void SmallKvRepresentation::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                   const int32_t* row_positions, size_t n_rows,
                                   float* out) const {
  attend_range(layer, kv_head, 1, q_rows, row_positions, n_rows, out);
}

void SmallKvRepresentation::attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                                         const int32_t* row_positions, size_t n_rows,
                                         float* out) const {
  // Heads in runs whose proxy weights ([n_rows][rows] floats a head, kept until the run's
  // marginal rows are attended) stay within kRunWeights, one head at least: a decode step's
  // heads go together, a long prefill's one by one (one head's weights are large already).
  constexpr size_t kRunWeights = size_t(1) << 20;
  const size_t elems = n_rows * geometry_.head_dim;
  const Layer& L = layers_[layer];
  for (uint32_t first = 0; first < n_kv;) {
    uint32_t n = 1;
    size_t weights = n_rows * L.heads[first].size();
    while (first + n < n_kv && weights + n_rows * L.heads[first + n].size() <= kRunWeights) {
      weights += n_rows * L.heads[first + n].size();
      ++n;
    }
    attend_range(layer, first, n, q_rows + first * elems, row_positions, n_rows,
                 out + first * elems);
    first += n;
  }
}

// The heads [first, first + n) of a layer (q_rows and out [n][n_rows][head_dim]) in five steps,
// so that the rows' two kernels run for every head at once (a device store makes one round trip
// of each per layer, not one per head): each head's matching, the full rows' attention of every
// head, each head's proxy weights, the marginal rows of every head, each head's scores. Every
// update is computed into its head's AttendUpdate first; the state changes only in apply(),
// which cannot fail (once every head succeeded, or in commit_attend() inside a transaction).
void SmallKvRepresentation::attend_range(uint32_t layer, uint32_t first, uint32_t n,
                                         const float* q_rows, const int32_t* row_positions,
                                         size_t n_rows, float* out) const {
  const Layer& L = layers_[layer];
  const uint32_t dim = geometry_.head_dim, group = geometry_.group_size();
  const size_t elems = n_rows * dim;
  // One spare per KV head of the whole cache covers a transaction; reserved once.
  if (spare_.capacity() == 0) spare_.reserve(size_t(geometry_.n_layers) * geometry_.n_kv_heads);
  // (Both grow once to a layer's heads; each keeps its size if the other's growth fails.)
  if (head_weights_.size() < n) head_weights_.resize(n);
  if (heads_.size() < n) heads_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    HeadAttend& ha = heads_[i];
    AttendUpdate& u = ha.u;
    if (!spare_.empty()) {  // (its buffers' capacity, not their contents)
      u = std::move(spare_.back());
      spare_.pop_back();
    }
    u.has_stats = u.stats_done = u.matched_now = u.has_scores = false;
    const uint32_t kv_head = first + i;
    const Head& H = L.heads[kv_head];
    const float* q = q_rows + i * elems;
    u.layer = layer;
    u.kv_head = kv_head;
    u.held_through = L.newest_held;
    u.stats_done = H.stats_done;
    if (!H.matched && !H.stats_done) {
      accumulate_match_stats(layer, kv_head, q, row_positions, n_rows, u);
    }
    ha.scores_from = H.scores_from;
    if (!H.matched && u.stats_done && link_->proxy()) {
      // Matching reads the proxy's statistics of every layer: its whole step must be done.
      int64_t newest = -1;
      for (size_t r = 0; r < n_rows; ++r) newest = std::max<int64_t>(newest, row_positions[r]);
      link_->await_step(newest);
      const float* stats = u.has_stats ? u.stats.data()
                           : L.match_stats.empty()
                               ? nullptr
                               : L.match_stats.data() + size_t(kv_head) * group * match_tokens_;
      const Match m = compute_match(layer, kv_head, stats);
      u.matched_now = true;
      u.map = m.map;
      u.scores_from = ha.scores_from = link_->matched_through();
      u.full_score = H.full_score;
      add_match_scores(m, u.full_score.data());
      u.marg_score = H.marg_score;
      u.has_scores = true;
    }
    ha.proxied = (H.matched || u.matched_now) && link_->proxy() != nullptr;
    if (!H.marg_pos.empty() && !ha.proxied) {
      fail(KVSDK_E_STATE, "layer ", layer, " KV head ", kv_head, " holds ", H.marg_pos.size(),
           " marginal (value-only) tokens whose attention weights come from the proxy: attach "
           "it with kvsdk_cache_set_proxy");
    }
  }
  // Eq. 6 in two halves, by the backend. First the large model's own softmax over the full rows
  // (f16, as stored), which needs nothing from the proxy: the proxy model may still be running
  // this step on another thread (kvsdk_cache_set_proxy_wait), and the wait for its queries below
  // then overlaps this work instead of preceding it.
  rows_attend_full(layer, first, n, q_rows, row_positions, n_rows, out);
  // The matched proxy heads' attention of this step over every held row (Eq. 6 and scores), in
  // reused scratch (one thread per cache).
  bool marginal = false;
  for (uint32_t i = 0; i < n; ++i) {
    HeadAttend& ha = heads_[i];
    const uint32_t kv_head = first + i;
    const Head& H = L.heads[kv_head];
    const size_t nf = H.full_pos.size(), nm = H.marg_pos.size(), rows = nf + nm;
    ha.weights = nullptr;
    ha.stride = rows;
    head_weights_[i] = {};
    if (!ha.proxied) continue;
    const uint32_t* map =
        ha.u.matched_now ? ha.u.map.data() : L.mapping.data() + size_t(kv_head) * group;
    float* w = at_least(ha.w, n_rows * rows).data();
    ha.weights = w;
    if (nm > 0) {
      head_weights_[i] = {w + nf, rows};
      marginal = true;
    }
    std::vector<int32_t>& wanted = at_least(attend_wanted_, rows);
    std::copy(H.full_pos.begin(), H.full_pos.end(), wanted.begin());
    std::copy(H.marg_pos.begin(), H.marg_pos.end(), wanted.begin() + long(nf));
    for (uint32_t j = 0; j < group; ++j) {
      bool seen = false;  // one call per distinct proxy head
      for (uint32_t k = 0; k < j; ++k) seen = seen || map[k] == map[j];
      if (seen) continue;
      attend_rows_.clear();
      attend_rpos_.clear();
      for (size_t r = 0; r < n_rows; ++r) {
        if (map[r % group] == map[j]) {
          attend_rows_.push_back(r);
          attend_rpos_.push_back(row_positions[r]);
        }
      }
      float* part = at_least(attend_part_, attend_rows_.size() * rows).data();
      link_->weights(proxy_ops(), proxy_workspace(), map[j], attend_rpos_.data(),
                     attend_rows_.size(), wanted.data(), rows, part);
      for (size_t r = 0; r < attend_rows_.size(); ++r) {
        std::copy_n(part + r * rows, rows, w + attend_rows_[r] * rows);
      }
    }
  }
  // Then the marginal rows weighted by the proxy's probabilities, and the full rows' share
  // rescaled (the same bits as one attend_smallkv with both).
  if (marginal) {
    rows_add_marginal(layer, first, n, q_rows, row_positions, n_rows, head_weights_.data(), out);
  }
  // Saliency-shift compensation: rows accumulate the proxy's attention of every later step.
  for (uint32_t i = 0; i < n; ++i) {
    HeadAttend& ha = heads_[i];
    AttendUpdate& u = ha.u;
    const Head& H = L.heads[first + i];
    if (ha.proxied) {
      const size_t nf = H.full_pos.size(), nm = H.marg_pos.size();
      if (!u.has_scores) {
        u.full_score = H.full_score;
        u.marg_score = H.marg_score;
        u.has_scores = true;
      }
      for (size_t r = 0; r < n_rows; ++r) {
        if (row_positions[r] <= ha.scores_from) continue;
        const float* wr = ha.weights + r * ha.stride;
        for (size_t t = 0; t < nf; ++t) u.full_score[t] += wr[t];
        for (size_t t = 0; t < nm; ++t) u.marg_score[t] += wr[nf + t];
      }
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    AttendUpdate& u = heads_[i].u;
    if (staging_) {
      staged_.push_back(std::move(u));
    } else {
      apply(u);
      if (spare_.size() < spare_.capacity()) spare_.push_back(std::move(u));
    }
  }
}

size_t SmallKvRepresentation::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return layers_[layer].heads[kv_head].size();
}

namespace {

// Rows of a head in position order into `rows` (its capacity reused): which store (true: full)
// and the index in it.
template <class Row>
void merged_rows(const std::vector<int32_t>& full_pos, const std::vector<int32_t>& marg_pos,
                 std::vector<Row>& rows) {
  const size_t nf = full_pos.size(), nm = marg_pos.size();
  rows.clear();
  reserve_for_growth(rows, nf + nm);
  if (std::is_sorted(full_pos.begin(), full_pos.end()) &&
      std::is_sorted(marg_pos.begin(), marg_pos.end())) {
    // Both kinds are kept in position order, so one merge orders them; on equal positions full
    // rows stay first (what std::inplace_merge or a stable sort gives, without their buffer).
    size_t i = 0, j = 0;
    while (i < nf || j < nm) {
      if (j == nm || (i < nf && full_pos[i] <= marg_pos[j])) {
        rows.push_back({full_pos[i], true, uint32_t(i)});
        ++i;
      } else {
        rows.push_back({marg_pos[j], false, uint32_t(j)});
        ++j;
      }
    }
    return;
  }
  for (size_t i = 0; i < nf; ++i) rows.push_back({full_pos[i], true, uint32_t(i)});
  for (size_t i = 0; i < nm; ++i) rows.push_back({marg_pos[i], false, uint32_t(i)});
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.position < b.position; });
}

}  // namespace

void SmallKvRepresentation::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                                 int32_t* positions) const {
  Head copy;
  const Head& H = host_head(layer, kv_head, copy);
  const size_t dim = geometry_.head_dim;
  std::vector<MergedRow> rows;
  merged_rows(H.full_pos, H.marg_pos, rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    const MergedRow& r = rows[i];
    if (positions) positions[i] = r.position;
    if (k) {
      if (r.full) {
        load_f32(KVSDK_DTYPE_F16, H.full_k.data(), size_t(r.index) * dim, dim, k + i * dim);
      } else {
        std::fill_n(k + i * dim, dim, 0.0f);
      }
    }
    if (v) {
      const uint16_t* src = r.full ? H.full_v.data() : H.marg_v.data();
      load_f32(KVSDK_DTYPE_F16, src, size_t(r.index) * dim, dim, v + i * dim);
    }
  }
}

uint64_t SmallKvRepresentation::bytes_under_cap(const Head& h, uint64_t cap) const {
  const uint64_t cur = head_bytes(h);
  if (cur <= cap) return cur;
  const uint64_t fb = full_row_bytes(), mb = marginal_row_bytes();
  const size_t n = h.size(), nf = h.full_pos.size();
  cpu::SmallKvSplit s = cpu::smallkv_split_budget(size_t(cap / fb), n);
  s.marginal = std::min<size_t>(s.marginal, size_t((cap - (s.critical + s.recent) * fb) / mb));
  const size_t rec = std::min(s.recent, nf), older = n - rec;
  const size_t crit = std::min(s.critical, nf - rec), marg = std::min(s.marginal, older - crit);
  return (crit + rec) * fb + marg * mb;
}

void SmallKvRepresentation::shrunk_to_cap(const Head& h, const float* full_score, uint64_t cap,
                                          size_t extra, Head& out) {
  const uint64_t fb = full_row_bytes(), mb = marginal_row_bytes();
  const size_t dim = geometry_.head_dim;
  std::vector<MergedRow>& rows = evict_rows_;
  merged_rows(h.full_pos, h.marg_pos, rows);
  const size_t n = rows.size();
  // §4 budget allocation: critical : recent : marginal = 2 : 1 : 2 of the head's cap; marginal
  // rows fitted to what a value-only row really costs (its position and score included).
  cpu::SmallKvSplit s = cpu::smallkv_split_budget(size_t(cap / fb), n);
  s.marginal = std::min<size_t>(s.marginal, size_t((cap - (s.critical + s.recent) * fb) / mb));
  reserve_for_growth(evict_scores_, n);
  reserve_for_growth(evict_has_key_, n);
  evict_scores_.resize(n);
  evict_has_key_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    evict_scores_[i] = rows[i].full ? full_score[rows[i].index] : h.marg_score[rows[i].index];
    evict_has_key_[i] = rows[i].full ? 1 : 0;
  }
  cpu::SmallKvSelection& sel = selection_;
  cpu::smallkv_select(evict_scores_.data(), evict_has_key_.data(), n, s, select_scratch_, sel);
  out.stats_done = h.stats_done;
  out.matched = h.matched;
  out.scores_from = h.scores_from;
  const size_t nf = sel.full.size(), nm = sel.marginal.size();
  // Capacity for `extra` more full rows, so that the append that follows needs no allocation.
  out.full_pos.clear();
  out.full_score.clear();
  out.full_k.clear();
  out.full_v.clear();
  out.marg_pos.clear();
  out.marg_score.clear();
  out.marg_v.clear();
  reserve_for_growth(out.full_pos, nf + extra);
  reserve_for_growth(out.full_score, nf + extra);
  reserve_for_growth(out.full_k, (nf + extra) * dim);
  reserve_for_growth(out.full_v, (nf + extra) * dim);
  reserve_for_growth(out.marg_pos, nm);
  reserve_for_growth(out.marg_score, nm);
  reserve_for_growth(out.marg_v, nm * dim);
  for (uint32_t i : sel.full) {
    const MergedRow& r = rows[i];
    out.full_pos.push_back(r.position);
    out.full_score.push_back(full_score[r.index]);
    out.full_k.insert(out.full_k.end(), h.full_k.begin() + long(r.index * dim),
                      h.full_k.begin() + long((r.index + 1) * dim));
    out.full_v.insert(out.full_v.end(), h.full_v.begin() + long(r.index * dim),
                      h.full_v.begin() + long((r.index + 1) * dim));
  }
  for (uint32_t i : sel.marginal) {  // marginal tokens drop K
    const MergedRow& r = rows[i];
    const std::vector<uint16_t>& src = r.full ? h.full_v : h.marg_v;
    out.marg_pos.push_back(r.position);
    out.marg_score.push_back(r.full ? full_score[r.index] : h.marg_score[r.index]);
    out.marg_v.insert(out.marg_v.end(), src.begin() + long(r.index * dim),
                      src.begin() + long((r.index + 1) * dim));
  }
}

uint64_t SmallKvRepresentation::plan_eviction(uint64_t bytes, uint32_t append_layer,
                                              size_t append_tokens,
                                              const int32_t* append_positions) {
  drop_eviction();
  if (!link_->proxy()) {
    fail(KVSDK_E_STATE, "policy 'smallkv' selects the tokens to keep with its proxy's attention: "
         "attach the proxy cache with kvsdk_cache_set_proxy before the cache exceeds its budget");
  }
  if (!all_matched()) {
    // Heads matched now read the proxy's statistics of every layer, through the newest token
    // this cache holds or appends: a proxy on its own thread must have finished that step.
    int64_t newest = -1;
    for (const Layer& L : layers_) newest = std::max<int64_t>(newest, L.newest_held);
    for (size_t t = 0; append_positions && t < append_tokens; ++t) {
      newest = std::max<int64_t>(newest, append_positions[t]);
    }
    link_->await_step(newest);
  }
  try {
    return plan_shrink(bytes, append_layer, append_tokens);
  } catch (...) {
    drop_eviction();  // nothing planned (the spare heads are scratch)
    throw;
  }
}

// Everything is built aside, in plan_ and the layers' spare heads, whose buffers are reused: the
// heads matched now (mapping and scores) and the heads shrunk; commit_eviction() swaps them in.
uint64_t SmallKvRepresentation::plan_shrink(uint64_t bytes, uint32_t append_layer,
                                            size_t append_tokens) {
  EvictionPlan& plan = plan_;
  const uint32_t group = geometry_.group_size(), kv = geometry_.n_kv_heads;
  const uint64_t before = total_bytes();
  // The budget cannot wait for match_tokens tokens: match every head with what it has seen.
  const int64_t through = link_->matched_through();
  std::vector<int>& matched_at = at_least(matched_at_, size_t(geometry_.n_layers) * kv);
  std::fill(matched_at.begin(), matched_at.end(), -1);
  for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
    const Layer& L = layers_[l];
    for (uint32_t g = 0; g < kv; ++g) {
      const Head& H = L.heads[g];
      if (H.matched) continue;
      const float* stats =
          L.match_stats.empty() ? nullptr
                                : L.match_stats.data() + size_t(g) * group * match_tokens_;
      const Match m = compute_match(l, g, stats);
      MatchedHead mh;
      mh.layer = l;
      mh.kv_head = g;
      mh.map = m.map;
      mh.full_score.reserve(H.full_score.size() + (l == append_layer ? append_tokens : 0));
      mh.full_score.assign(H.full_score.begin(), H.full_score.end());
      add_match_scores(m, mh.full_score.data());
      mh.scores_from = through;
      matched_at[size_t(l) * kv + g] = int(plan.matched.size());
      plan.matched.push_back(std::move(mh));
    }
  }
  // Once every head is matched, every layer's matching statistics are freed.
  uint64_t fixed = 0, rows = 0, hi = 0;
  for (const Layer& l : layers_) {
    fixed += l.started ? l.mapping.size() * 4 : 0;
    for (const Head& h : l.heads) {
      rows += head_bytes(h);
      hi = std::max(hi, head_bytes(h));
    }
  }
  uint64_t after = fixed + rows;
  if (before - after < bytes) {
    const uint64_t target = bytes >= before ? 0 : before - bytes;
    uint64_t rows_target = target > fixed ? target - fixed : 0;
    // An eviction that makes room for an append goes down to the rows' cap minus the slack
    // (policy.evict_slack), so that the next appends fit without selecting again; explicit
    // compression (no append) fits exactly.
    if (append_layer != kNoAppend) rows_target -= slack_bytes(rows_target);
    auto total_under = [&](uint64_t cap) {
      uint64_t t = 0;
      for (const Layer& l : layers_) {
        for (const Head& h : l.heads) t += bytes_under_cap(h, cap);
      }
      return t;
    };
    // The largest per-head cap that meets the target. Every head fits rows_target / heads, so the
    // search starts feasible and stays feasible.
    uint64_t lo = rows_target / (uint64_t(geometry_.n_layers) * kv);
    lo = std::min(lo, hi);
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (total_under(mid) <= rows_target) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    for (uint32_t l = 0; l < geometry_.n_layers; ++l) {
      Layer& L = layers_[l];
      if (L.spare.size() < kv) L.spare.resize(kv);
      for (uint32_t g = 0; g < kv; ++g) {
        const Head& h = L.heads[g];
        if (head_bytes(h) <= lo) continue;
        const int mi = matched_at[size_t(l) * kv + g];
        Head& out = L.spare[g];
        plan.shrunk.push_back({l, g});
        shrunk_to_cap(host_head(l, g, host_copy_),
                      mi >= 0 ? plan.matched[size_t(mi)].full_score.data() : h.full_score.data(),
                      lo, l == append_layer ? append_tokens : 0, out);
        if (mi >= 0) {
          out.matched = true;
          out.stats_done = true;
          out.scores_from = through;
        }
        after -= head_bytes(h) - head_bytes(out);
      }
    }
  }
  // The append that follows grows the heads of its layer that keep their vectors: give them the
  // capacity now (only capacity changes), so that it cannot fail after the commit.
  if (append_layer < geometry_.n_layers) {
    Layer& L = layers_[append_layer];
    for (uint32_t g = 0; g < kv; ++g) {
      if (shrunk_in_plan(append_layer, g)) continue;
      Head& h = L.heads[g];
      const size_t n = h.full_pos.size() + append_tokens;
      reserve_for_growth(h.full_pos, n);
      reserve_for_growth(h.full_score, n);
    }
  }
  if (!rows_in_heads()) host_copy_ = Head();  // (the copies' memory goes)
  rows_plan(append_layer, append_tokens);
  plan.active = true;
  return before - after;
}

bool SmallKvRepresentation::shrunk_in_plan(uint32_t layer, uint32_t kv_head) const {
  return std::any_of(plan_.shrunk.begin(), plan_.shrunk.end(), [&](const ShrunkHead& sh) {
    return sh.layer == layer && sh.kv_head == kv_head;
  });
}

void SmallKvRepresentation::rows_plan(uint32_t append_layer, size_t append_tokens) {
  if (append_layer >= geometry_.n_layers) return;
  const size_t dim = geometry_.head_dim;
  Layer& L = layers_[append_layer];
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
    if (shrunk_in_plan(append_layer, g)) continue;  // (shrunk_to_cap gave it the room)
    Head& h = L.heads[g];
    const size_t n = h.full_pos.size() + append_tokens;
    reserve_for_growth(h.full_k, n * dim);
    reserve_for_growth(h.full_v, n * dim);
  }
}

void SmallKvRepresentation::commit_eviction() noexcept {
  if (!plan_.active) return;
  const uint32_t group = geometry_.group_size();
  for (MatchedHead& mh : plan_.matched) {
    Layer& L = layers_[mh.layer];
    Head& H = L.heads[mh.kv_head];
    std::copy(mh.map.begin(), mh.map.end(), L.mapping.begin() + long(size_t(mh.kv_head) * group));
    H.full_score.swap(mh.full_score);
    H.scores_from = mh.scores_from;
    H.matched = true;
    H.stats_done = true;
  }
  // The shrunk heads take the place of the heads, whose buffers the next eviction reuses.
  for (const ShrunkHead& sh : plan_.shrunk) {
    Layer& L = layers_[sh.layer];
    std::swap(L.heads[sh.kv_head], L.spare[sh.kv_head]);
  }
  rows_commit();
  // Which rows stayed (and every head's matching) depended on every row of every layer (the
  // Cache records the same floor for its own check).
  for (Layer& L : layers_) L.frozen_through = std::max(L.frozen_through, L.newest_held);
  drop_finished_stats();
  drop_eviction();
}

void SmallKvRepresentation::drop_eviction() noexcept {
  if (plan_.active) rows_drop();
  plan_.matched.clear();
  plan_.shrunk.clear();  // (plain indices: the capacity stays)
  plan_.active = false;
}

// Truncation (kvsdk_cache_truncate). SmallKV (docs/papers.md) §4 keeps, besides the rows, an
// importance state that sums over them: the large model's Eq. 1 over the matching tokens, the
// head mapping of Eqs. 2-3 chosen from it, and every row's accumulated proxy attention (saliency
// shift compensation). A float sum cannot be taken back bit for bit, and what one attend added
// depended on every row the head held (its softmax), so:
//  - every attend that changed that state, and every eviction, freezes the rows the layer held
//    then (frozen_through: the newest of their positions); a cut at or below it is refused;
//  - rows appended since (appends only) go exactly: their rows, positions and zero scores, and
//    what their append did to the layer: the append that started it (it allocated the matching
//    statistics, zeros) is undone with it; an append that freed the statistics (the layer's heads
//    all matched) freezes its rows, as their values are gone. Matching tokens are the first
//    match_tokens rows of a head, but no matching counted rows that were not frozen, so after a
//    cut among them the next appended rows become matching tokens as they would have;
//  - the proxy link (not saved) must hold nothing of the removed positions: its matching
//    statistics (Eq. 1 of the proxy, while a head still needs them) and its latest queries
//    (which weight the next attend's marginal rows, Eq. 6) come from the proxy's attends, which
//    the app truncates separately and cannot take back either;
//  - after restore(), only rows appended since (restore() freezes the rest).
std::string SmallKvRepresentation::truncate_refusal(uint32_t layer, int32_t position) const {
  const Layer& L = layers_[layer];
  if (L.newest_held < position) return {};  // nothing to remove
  const std::string where = "layer " + std::to_string(layer) + ": ";
  if (position <= L.frozen_through) {
    return where + "SmallKV's importance state (matching statistics, head mapping, rows' " +
           "accumulated proxy attention) already counts the rows held through position " +
           std::to_string(L.frozen_through) + " (an attend, eviction, restore or the end of " +
           "matching while they were held) and cannot be taken back; the earliest position it " +
           "can truncate at is " + std::to_string(int64_t(L.frozen_through) + 1);
  }
  if (link_->proxy() && link_->keeps_match_stats() && link_->matched_through() >= position) {
    return where + "the proxy's matching statistics (SmallKV Eq. 1) count its queries at " +
           "positions up to " + std::to_string(link_->matched_through()) +
           ", which cannot be taken back";
  }
  const int64_t newest_query = link_->newest_query();
  if (newest_query >= position) {
    return where + "the proxy's latest attention pass has queries at positions >= " +
           std::to_string(position) + " (up to " + std::to_string(newest_query) +
           "), which would weight this cache's next attend";
  }
  if (L.started && L.first_min != kUnknown && L.first_min >= position) {
    for (const Head& h : L.heads) {
      for (int32_t p : h.full_pos) {
        if (p < position) {
          return where + "the cut removes the append that started the layer but keeps rows " +
                 "appended after it at older positions (position " + std::to_string(p) +
                 "); only cuts that keep part of the first append or remove every row are exact";
        }
      }
    }
  }
  return {};
}

void SmallKvRepresentation::truncate(uint32_t layer, int32_t position) noexcept {
  Layer& L = layers_[layer];
  const size_t dim = geometry_.head_dim;
  // Keeps the rows before `position` in order (positions, scores, `per_row` f16 arrays).
  const auto compact = [&](std::vector<int32_t>& pos, std::vector<float>& score,
                           std::vector<uint16_t>* a, std::vector<uint16_t>* b) {
    size_t j = 0;
    for (size_t i = 0; i < pos.size(); ++i) {
      if (pos[i] >= position) continue;
      if (j != i) {
        pos[j] = pos[i];
        score[j] = score[i];
        for (std::vector<uint16_t>* x : {a, b}) {
          if (x) std::copy_n(x->data() + i * dim, dim, x->data() + j * dim);
        }
      }
      ++j;
    }
    pos.resize(j);
    score.resize(j);
    for (std::vector<uint16_t>* x : {a, b}) {
      if (x) x->resize(j * dim);
    }
  };
  int32_t newest = -1;
  const bool here = rows_in_heads();  // (elsewhere, rows_truncated() follows the counts)
  for (Head& h : L.heads) {
    compact(h.full_pos, h.full_score, here ? &h.full_k : nullptr, here ? &h.full_v : nullptr);
    compact(h.marg_pos, h.marg_score, here ? &h.marg_v : nullptr, nullptr);
    for (int32_t p : h.full_pos) newest = std::max(newest, p);
    for (int32_t p : h.marg_pos) newest = std::max(newest, p);
  }
  L.newest_held = newest;
  if (L.started && L.first_min != kUnknown && L.first_min >= position) {
    // The append that started the layer is gone with every row (truncate_refusal()): the layer
    // is as before its first append. Nothing else changed since (frozen_through < position).
    L.started = false;
    L.first_min = kNotStarted;
    std::vector<float>().swap(L.match_stats);  // (freeing only)
  }
  rows_truncated(layer);
}

std::vector<TierRecord> SmallKvRepresentation::save(uint32_t layer) const {
  const Layer& L = layers_[layer];
  std::vector<TierRecord> out(geometry_.n_kv_heads + 1);
  TierRecord& lr = out[0];
  lr.layer = layer;
  lr.kind = "smallkv.layer";
  lr.set_scalar("started", L.started ? 1 : 0);
  lr.add("mapping").u32 = L.mapping;
  lr.add("match_stats").f32 = L.match_stats;
  Head copy;
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
    const Head& h = host_head(layer, g, copy);
    TierRecord& r = out[g + 1];
    r.layer = layer;
    r.kv_head = g;
    r.kind = "smallkv.head";
    r.add("full_positions").i32 = h.full_pos;
    r.add("full_keys").u16 = h.full_k;
    r.add("full_values").u16 = h.full_v;
    r.add("full_scores").f32 = h.full_score;
    r.add("marginal_positions").i32 = h.marg_pos;
    r.add("marginal_values").u16 = h.marg_v;
    r.add("marginal_scores").f32 = h.marg_score;
    r.set_scalar("stats_done", h.stats_done ? 1 : 0);
    r.set_scalar("matched", h.matched ? 1 : 0);
    r.set_scalar("scores_from", uint64_t(h.scores_from));
  }
  return out;
}

namespace {

bool flag(const TierRecord& r, const char* name) {
  const uint64_t v = r.scalar(name);
  if (v > 1) fail(KVSDK_E_CORRUPT, "snapshot tier record '", r.kind, "' field '", name, "' is ", v);
  return v == 1;
}

void check_size(const TierRecord& r, const char* name, size_t got, size_t want) {
  if (got != want) {
    fail(KVSDK_E_CORRUPT, "snapshot tier record '", r.kind, "' (layer ", r.layer, ", KV head ",
         r.kv_head, ") field '", name, "' has ", got, " elements, expected ", want);
  }
}

}  // namespace

void SmallKvRepresentation::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  const uint32_t kv = geometry_.n_kv_heads, dim = geometry_.head_dim;
  if (records.size() != size_t(kv) + 1) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " smallkv records, expected ", kv + 1);
  }
  const TierRecord& lr = records[0];
  if (lr.kind != "smallkv.layer") {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record 0 is '", lr.kind,
         "', expected 'smallkv.layer'");
  }
  Layer L;
  L.started = flag(lr, "started");
  L.mapping = lr.get("mapping").u32;
  L.match_stats = lr.get("match_stats").f32;
  check_size(lr, "mapping", L.mapping.size(), geometry_.n_q_heads);
  if (!L.match_stats.empty() || !L.started) {
    check_size(lr, "match_stats", L.match_stats.size(),
               L.started ? size_t(geometry_.n_q_heads) * match_tokens_ : 0);
  }
  for (uint32_t g = 0; g < kv; ++g) {
    const TierRecord& r = records[g + 1];
    if (r.kind != "smallkv.head" || r.kv_head != g) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", g + 1, " is '", r.kind,
           "' for KV head ", r.kv_head, ", expected 'smallkv.head' for KV head ", g);
    }
    Head h;
    h.full_pos = r.get("full_positions").i32;
    h.full_k = r.get("full_keys").u16;
    h.full_v = r.get("full_values").u16;
    h.full_score = r.get("full_scores").f32;
    h.marg_pos = r.get("marginal_positions").i32;
    h.marg_v = r.get("marginal_values").u16;
    h.marg_score = r.get("marginal_scores").f32;
    const size_t nf = h.full_pos.size(), nm = h.marg_pos.size();
    check_size(r, "full_keys", h.full_k.size(), nf * dim);
    check_size(r, "full_values", h.full_v.size(), nf * dim);
    check_size(r, "full_scores", h.full_score.size(), nf);
    check_size(r, "marginal_values", h.marg_v.size(), nm * dim);
    check_size(r, "marginal_scores", h.marg_score.size(), nm);
    for (int32_t p : h.full_pos) {
      if (p < 0) fail(KVSDK_E_CORRUPT, "snapshot smallkv layer ", layer, " has position ", p);
    }
    for (int32_t p : h.marg_pos) {
      if (p < 0) fail(KVSDK_E_CORRUPT, "snapshot smallkv layer ", layer, " has position ", p);
    }
    h.stats_done = flag(r, "stats_done");
    h.matched = flag(r, "matched");
    h.scores_from = int64_t(r.scalar("scores_from"));
    if (nm > 0 && !h.matched) {
      fail(KVSDK_E_CORRUPT, "snapshot smallkv layer ", layer, " KV head ", g,
           " holds marginal tokens but no head matching");
    }
    if (h.size() > 0 && !L.started) {
      fail(KVSDK_E_CORRUPT, "snapshot smallkv layer ", layer, " holds rows but is not started");
    }
    for (int32_t p : h.full_pos) L.newest_held = std::max(L.newest_held, p);
    for (int32_t p : h.marg_pos) L.newest_held = std::max(L.newest_held, p);
    L.heads.push_back(std::move(h));
  }
  // A snapshot does not say which rows the importance state has counted, nor which append
  // started the layer: conservatively, only rows appended after the restore can go (as the
  // Cache's restored floor says too).
  L.frozen_through = L.newest_held;
  L.first_min = L.started ? kUnknown : kNotStarted;
  rows_restore(layer, L.heads);
  layers_[layer] = std::move(L);
}

}  // namespace kvsdk
