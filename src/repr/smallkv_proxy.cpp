#include "repr/smallkv_proxy.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/cache.h"
#include "repr/device_queries.h"
#include "smallkv.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/spin_wait.h"

namespace kvsdk {

// Held by the tap closure installed on the proxy: when the proxy's tap goes away (the proxy cache
// is destroyed, or the link detaches), the link forgets the proxy.
struct SmallKvTapHandle {
  std::shared_ptr<SmallKvProxyLink> link;  // set once the tap is installed
  ~SmallKvTapHandle() {
    if (!link) return;
    link->proxy_ = nullptr;
    link->latest_.clear();
    link->probs_.clear();
    link->newest_.clear();
    link->large_side_.reset();
    link->proxy_side_.reset();
  }
};

// The device buffers of softmax() on one thread: the queries and positions going up, the
// probabilities coming down, and a workspace of the proxy context's table.
struct SmallKvProxyLink::DeviceSoftmax {
  explicit DeviceSoftmax(const backend::Ops& device)
      : ws(device), queries(device), probs(device) {}
  backend::WorkspaceHandle ws;
  DeviceQueries queries;
  DeviceScratch probs;
};

SmallKvProxyLink::SmallKvProxyLink(uint32_t match_tokens) : match_tokens_(match_tokens) {}
SmallKvProxyLink::~SmallKvProxyLink() = default;

namespace {

// Rows of one proxy KV head as f32 keys, with their positions.
void proxy_keys(const ExactStore& s, size_t n, uint32_t dim, std::vector<float>& k) {
  k.resize(n * dim);
  load_f32(KVSDK_DTYPE_F16, s.k.data(), 0, n * dim, k.data());
}

}  // namespace

void SmallKvProxyLink::attach(const std::shared_ptr<SmallKvProxyLink>& self, Cache& proxy) {
  // Allocate everything first: a failure leaves the previous link (and its tap) in place.
  const Geometry& g = proxy.geometry();
  std::vector<LatestQueries> latest(size_t(g.n_layers) * g.n_kv_heads);
  std::vector<float> stats(size_t(g.n_layers) * g.n_q_heads * self->match_tokens_, 0.0f);
  std::vector<StepProbs> probs(size_t(g.n_layers) * g.n_q_heads);
  auto handle = std::make_shared<SmallKvTapHandle>();
  Cache::AttentionTap tap = [handle](uint32_t layer, uint32_t n_kv_heads, const float* q_rows,
                                     const int32_t* row_positions, size_t n_rows) {
    handle->link->on_proxy_queries(layer, n_kv_heads, q_rows, row_positions, n_rows);
  };
  // Nothing below can fail.
  self->detach();
  self->proxy_ = &proxy;
  self->latest_.swap(latest);
  self->match_stats_.swap(stats);
  self->probs_.swap(probs);
  self->matched_through_ = -1;
  self->stats_dropped_ = false;
  self->newest_.assign(g.n_layers, -1);
  self->read_ops_ = nullptr;
  self->read_heads_.clear();
  handle->link = self;
  proxy.set_attention_tap(std::move(tap));
}

void SmallKvProxyLink::detach() noexcept {
  if (proxy_) proxy_->set_attention_tap({});  // the handle's destructor clears proxy_
  proxy_ = nullptr;
  large_side_.reset();
  proxy_side_.reset();
  read_ops_ = nullptr;
  latest_.clear();
  probs_.clear();
  newest_.clear();
}

uint32_t SmallKvProxyLink::proxy_heads() const {
  return proxy_ ? proxy_->geometry().n_layers * proxy_->geometry().n_q_heads : 0;
}

void SmallKvProxyLink::drop_match_stats() noexcept {
  std::vector<float> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  stats_dropped_ = true;
  dropped.swap(match_stats_);
}

bool SmallKvProxyLink::keeps_match_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !stats_dropped_;
}

int64_t SmallKvProxyLink::matched_through() const {
  std::lock_guard<std::mutex> lock(mu_);
  return matched_through_;
}

void SmallKvProxyLink::set_wait_ms(uint32_t ms) {
  std::lock_guard<std::mutex> lock(mu_);
  wait_ms_ = ms;
}

std::chrono::steady_clock::time_point SmallKvProxyLink::deadline() const {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms_);
}

void SmallKvProxyLink::await_step(int64_t position) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (wait_ms_ == 0 || !proxy_) return;
  const auto done = [&] {
    return std::all_of(newest_.begin(), newest_.end(), [&](int64_t p) { return p >= position; });
  };
  if (!spin_then_wait(lock, cv_, generation_, kSpin, deadline(), done)) {
    size_t l = 0;
    while (l < newest_.size() && newest_[l] >= position) ++l;
    fail(KVSDK_E_STATE, "the proxy cache has not attended position ", position, " in its layer ",
         l, " within ", wait_ms_, " ms (kvsdk_cache_set_proxy_wait): run the proxy model on the "
         "same tokens, on its own thread, while the large model runs them");
  }
}

int64_t SmallKvProxyLink::newest_query() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t newest = -1;
  for (const LatestQueries& lq : latest_) {
    for (int32_t p : lq.positions) newest = std::max<int64_t>(newest, p);
  }
  return newest;
}

void SmallKvProxyLink::on_proxy_queries(uint32_t layer, uint32_t n_kv_heads,
                                        const float* q_rows, const int32_t* row_positions,
                                        size_t n_rows) {
  const Geometry& g = proxy_->geometry();
  const uint32_t dim = g.head_dim, group = g.group_size();
  // Computed aside first: each head's latest rows, and the Eq. 1 sums to add to the statistics.
  struct Sum {
    size_t offset;  // into match_stats_
    std::vector<float> acc;
  };
  if (staged_.size() < n_kv_heads) staged_.resize(n_kv_heads);
  std::vector<LatestQueries>& latest = staged_;
  std::vector<Sum> sums;
  int64_t through;
  bool dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    through = matched_through_;
    dropped = stats_dropped_;
  }
  for (uint32_t kv_head = 0; kv_head < n_kv_heads; ++kv_head) {
    const float* qh = q_rows + size_t(kv_head) * n_rows * dim;
    latest[kv_head].rows.assign(qh, qh + n_rows * dim);
    latest[kv_head].positions.assign(row_positions, row_positions + n_rows);
    if (dropped) continue;
    // Eq. 1 over the first match_tokens rows, for the queries among those tokens.
    const ProxyRows held = rows_of(layer, kv_head);
    const size_t m = std::min<size_t>(held.n, match_tokens_);
    if (m == 0) continue;
    const int32_t limit = held.n >= match_tokens_ ? held.positions[match_tokens_ - 1]
                                                  : std::numeric_limits<int32_t>::max();
    // Once the queries are past the matched tokens (every decode step after matching), Eq. 1 has
    // nothing to add: return before touching any buffer (or copying a device proxy's keys out).
    bool any = false;
    for (size_t r = 0; r < n_rows && !any; ++r) any = row_positions[r] <= limit;
    if (!any) continue;
    const ExactStore& s = proxy_->exact_rows(layer, kv_head);  // (a device proxy's: staged)
    std::vector<float>& k = match_keys_;
    std::vector<float> q;
    std::vector<int32_t> qpos;
    proxy_keys(s, m, dim, k);
    for (uint32_t j = 0; j < group; ++j) {
      q.clear();
      qpos.clear();
      for (size_t r = j; r < n_rows; r += group) {
        if (row_positions[r] > limit) continue;
        q.insert(q.end(), qh + r * dim, qh + (r + 1) * dim);
        qpos.push_back(row_positions[r]);
        through = std::max<int64_t>(through, row_positions[r]);
      }
      if (qpos.empty()) continue;
      const size_t head = size_t(layer) * g.n_q_heads + size_t(kv_head) * group + j;
      sums.push_back(Sum{head * match_tokens_, std::vector<float>(m)});
      cpu::smallkv_accumulated_attention(q.data(), qpos.data(), qpos.size(), k.data(),
                                         s.positions.data(), m, dim, g.attn_scale,
                                         sums.back().acc.data());
    }
  }
  int64_t newest = -1;
  for (size_t r = 0; r < n_rows; ++r) newest = std::max<int64_t>(newest, row_positions[r]);
  const bool computed = precompute_probs(layer, n_kv_heads, q_rows, row_positions, n_rows);
  // Nothing below can fail. Published under the lock: the large cache may be waiting for it.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t kv_head = 0; kv_head < n_kv_heads; ++kv_head) {
      LatestQueries& lq = latest_[size_t(layer) * g.n_kv_heads + kv_head];
      lq.rows.swap(latest[kv_head].rows);
      lq.positions.swap(latest[kv_head].positions);
    }
    // New queries of this layer: its heads' probabilities of the previous step are stale, or
    // computed above for this step.
    for (uint32_t h = 0; h < g.n_q_heads; ++h) {
      StepProbs& sp = probs_[size_t(layer) * g.n_q_heads + h];
      sp.valid = false;
      if (computed && staged_probs_[h].valid) std::swap(sp, staged_probs_[h]);
    }
    if (!stats_dropped_) {  // (the statistics may have been dropped while these were computed)
      for (const Sum& sum : sums) {
        float* dst = match_stats_.data() + sum.offset;
        for (size_t t = 0; t < sum.acc.size(); ++t) dst[t] += sum.acc[t];
      }
      matched_through_ = through;
    }
    newest_[layer] = newest;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
}

void SmallKvProxyLink::set_read_heads(const backend::Ops& ops,
                                      const std::vector<uint8_t>& heads) {
  std::lock_guard<std::mutex> lock(mu_);
  read_ops_ = &ops;
  read_heads_ = heads;
}

bool SmallKvProxyLink::has_read_heads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_ops_ != nullptr;
}

bool SmallKvProxyLink::precompute_probs(uint32_t layer, uint32_t n_kv_heads, const float* q_rows,
                                        const int32_t* row_positions, size_t n_rows) {
  const Geometry& g = proxy_->geometry();
  const uint32_t dim = g.head_dim, group = g.group_size();
  const backend::Ops* ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wait_ms_ == 0 || read_ops_ == nullptr || read_heads_.size() != proxy_heads()) {
      return false;
    }
    ops = read_ops_;
    if (proxy_read_heads_ != read_heads_) {
      try {
        proxy_read_heads_ = read_heads_;  // (once per link: its capacity stays)
      } catch (...) {
        return false;
      }
    }
  }
  // A decode step: one query per proxy head (weights() keeps one position per head).
  if (n_rows != group || n_kv_heads != g.n_kv_heads) return false;
  try {
    if (!proxy_ws_) proxy_ws_ = backend::WorkspaceHandle(*ops);
    staged_probs_.resize(g.n_q_heads);
    for (uint32_t kv_head = 0; kv_head < g.n_kv_heads; ++kv_head) {
      const uint32_t h0 = kv_head * group;
      bool any = false;
      for (uint32_t j = 0; j < group; ++j) {
        staged_probs_[h0 + j].valid = false;
        any = any || proxy_read_heads_[size_t(layer) * g.n_q_heads + h0 + j];
      }
      if (!any) continue;
      const ProxyRows st = rows_of(layer, kv_head);
      const size_t n = st.n;
      // Every query row of the KV head in one call, so its keys are read (and converted) once:
      // each row's probabilities are those of a call for that row alone (smallkv_softmax's
      // contract), i.e. weights()' own bits. Rows no large head reads are computed and dropped.
      std::vector<float>& all = at_least(proxy_probs_, size_t(group) * n);
      const backend::QueryRows qr{q_rows + size_t(kv_head) * n_rows * dim, row_positions, group,
                                  dim, g.attn_scale};
      softmax(*ops, proxy_ws_.get(), proxy_side_, st, qr, all.data());
      for (uint32_t j = 0; j < group; ++j) {
        if (!proxy_read_heads_[size_t(layer) * g.n_q_heads + h0 + j]) continue;
        StepProbs& sp = staged_probs_[h0 + j];
        reserve_for_growth(sp.p, n);
        sp.p.assign(all.begin() + long(size_t(j) * n), all.begin() + long(size_t(j + 1) * n));
        sp.valid = true;
        sp.position = row_positions[j];
        sp.n = n;
      }
    }
  } catch (...) {
    return false;  // (allocation) the large cache's attend computes them itself
  }
  return true;
}

void SmallKvProxyLink::match_scores(uint32_t head, const int32_t* positions, size_t n,
                                    float* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Geometry& g = proxy_->geometry();
  const uint32_t layer = head / g.n_q_heads, kv_head = (head % g.n_q_heads) / g.group_size();
  const ProxyRows s = rows_of(layer, kv_head);
  const size_t m = std::min<size_t>(s.n, match_tokens_);
  for (size_t i = 0; i < n; ++i) {
    out[i] = 0.0f;
    if (match_stats_.empty()) continue;
    for (size_t t = 0; t < m; ++t) {
      if (s.positions[t] == positions[i]) {
        out[i] = match_stats_[size_t(head) * match_tokens_ + t];
        break;
      }
    }
  }
}

int64_t SmallKvProxyLink::find_query(uint32_t head, int32_t position) const {
  const Geometry& g = proxy_->geometry();
  const uint32_t group = g.group_size(), layer = head / g.n_q_heads, h = head % g.n_q_heads;
  const uint32_t kv_head = h / group, j = h % group;
  const LatestQueries& lq = latest_[size_t(layer) * g.n_kv_heads + kv_head];
  // Rows of head h are j, j + group, ... (Cache::attend's packing). A decode step has one; a
  // prefill many, searched in position order.
  const size_t n_rows = lq.positions.size();
  if (n_rows <= 8 * size_t(group)) {
    for (size_t r = j; r < n_rows; r += group) {
      if (lq.positions[r] == position) return int64_t(r);
    }
    return -1;
  }
  query_at_.clear();
  for (size_t r = j; r < n_rows; r += group) query_at_.emplace_back(lq.positions[r], uint32_t(r));
  std::sort(query_at_.begin(), query_at_.end());
  const auto it =
      std::lower_bound(query_at_.begin(), query_at_.end(), std::make_pair(position, uint32_t(0)));
  return it != query_at_.end() && it->first == position ? int64_t(it->second) : -1;
}

void SmallKvProxyLink::await_queries(uint32_t head, const int32_t* positions, size_t n) const {
  const Geometry& g = proxy_->geometry();
  const uint32_t layer = head / g.n_q_heads, h = head % g.n_q_heads;
  const LatestQueries& lq = latest_[size_t(layer) * g.n_kv_heads + h / g.group_size()];
  query_rows_.resize(n);
  size_t missing = 0;  // the first position without a query
  const auto found = [&] {
    for (missing = 0; missing < n; ++missing) {
      const int64_t r = find_query(head, positions[missing]);
      if (r < 0) return false;
      query_rows_[missing] = lq.rows.data() + size_t(r) * g.head_dim;
    }
    return true;
  };
  std::unique_lock<std::mutex> lock(mu_);
  if (found()) return;
  if (wait_ms_ > 0 && spin_then_wait(lock, cv_, generation_, kSpin, deadline(), found)) return;
  if (wait_ms_ > 0) {
    fail(KVSDK_E_STATE, "the proxy cache has not attended position ", positions[missing],
         " in its layer ", layer, " within ", wait_ms_, " ms (kvsdk_cache_set_proxy_wait): run "
         "the proxy model on the same tokens, on its own thread, while the large model runs them");
  }
  fail(KVSDK_E_STATE, "the proxy cache has not attended position ", positions[missing],
       " in its layer ", layer, ": run the proxy model on the same tokens just before the large "
       "model (smallkv uses the proxy's attention of the same step)");
}

void SmallKvProxyLink::weights(const backend::Ops& ops, backend::Workspace& ws, uint32_t head,
                               const int32_t* row_positions, size_t n_rows, const int32_t* wanted,
                               size_t n_wanted, float* out) const {
  const Geometry& g = proxy_->geometry();
  const uint32_t group = g.group_size(), layer = head / g.n_q_heads;
  const uint32_t kv_head = (head % g.n_q_heads) / group;
  // First the queries (waiting for the proxy's thread, if it runs on one): only once they are
  // published has the proxy finished appending this step's rows to the layer read below.
  await_queries(head, row_positions, n_rows);
  const ProxyRows s = rows_of(layer, kv_head);
  const size_t n = s.n;
  // Each wanted position's proxy row. A 'full' proxy that appended one token per position from
  // some start holds position p at row p - start; otherwise binary search over its rows in
  // position order.
  row_of_.resize(n_wanted);
  const bool consecutive =
      n > 0 && int64_t(s.positions[n - 1]) - s.positions[0] == int64_t(n) - 1 &&
      std::adjacent_find(s.positions, s.positions + n,
                         [](int32_t a, int32_t b) { return b <= a; }) == s.positions + n;
  if (consecutive) {
    const int64_t first = s.positions[0];
    for (size_t i = 0; i < n_wanted; ++i) {
      const int64_t row = int64_t(wanted[i]) - first;
      row_of_[i] = row >= 0 && row < int64_t(n) ? row : -1;
    }
  } else {
    by_pos_.resize(n);
    for (size_t t = 0; t < n; ++t) by_pos_[t] = uint32_t(t);
    std::stable_sort(by_pos_.begin(), by_pos_.end(), [&](uint32_t a, uint32_t b) {
      return s.positions[a] < s.positions[b];
    });
    for (size_t i = 0; i < n_wanted; ++i) {
      const auto it =
          std::lower_bound(by_pos_.begin(), by_pos_.end(), wanted[i],
                           [&](uint32_t row, int32_t p) { return s.positions[row] < p; });
      row_of_[i] = it != by_pos_.end() && s.positions[*it] == wanted[i] ? int64_t(*it) : -1;
    }
  }
  StepProbs& sp = probs_[head];
  for (size_t r = 0; r < n_rows; ++r) {
    if (!(sp.valid && sp.position == row_positions[r] && sp.n == n)) {
      const float* q = query_rows_[r];
      sp.valid = false;
      reserve_for_growth(sp.p, n);
      sp.p.resize(n);
      const backend::QueryRows qr{q, row_positions + r, 1, g.head_dim, g.attn_scale};
      softmax(ops, ws, large_side_, s, qr, sp.p.data());
      sp.valid = true;
      sp.position = row_positions[r];
      sp.n = n;
    }
    float* o = out + r * n_wanted;
    for (size_t i = 0; i < n_wanted; ++i) o[i] = row_of_[i] < 0 ? 0.0f : sp.p[size_t(row_of_[i])];
  }
}

}  // namespace kvsdk

namespace kvsdk {

SmallKvProxyLink::ProxyRows SmallKvProxyLink::rows_of(uint32_t layer, uint32_t kv_head) const {
  ProxyRows r;
  if (proxy_->device_rows(layer, kv_head, r.device, r.positions)) {
    r.n = r.device.n_tokens;
    r.on_device = true;
    return r;
  }
  const ExactStore& s = proxy_->exact_rows(layer, kv_head);
  r.positions = s.positions.data();
  r.n = s.size();
  r.k = s.k.data();
  return r;
}

void SmallKvProxyLink::softmax(const backend::Ops& ops, backend::Workspace& ws,
                               std::unique_ptr<DeviceSoftmax>& side, const ProxyRows& rows,
                               const backend::QueryRows& qr, float* out) const {
  if (!rows.on_device) return ops.smallkv_softmax(qr, rows.k, rows.positions, rows.n, ws, out);
  const Context& ctx = proxy_->context();
  const Context::DeviceScope on_device(ctx);
  if (!side) side = std::make_unique<DeviceSoftmax>(ctx.ops());
  const backend::QueryRows qd = side->queries.to_device(qr);
  const size_t bytes = qr.n_rows * rows.n * sizeof(float);
  float* const p = static_cast<float*>(side->probs.at_least(std::max<size_t>(bytes, 1)));
  ctx.ops().smallkv_softmax(qd, rows.device.k, rows.device.positions, rows.n, side->ws.get(), p);
  if (bytes) ctx.ops().to_host(out, p, bytes);
}

}  // namespace kvsdk
