#include "repr/smallkv_proxy.h"

#include <algorithm>
#include <limits>

#include "core/cache.h"
#include "smallkv.h"
#include "util/dtype.h"
#include "util/error.h"

namespace kvsdk {

// Held by the tap closure installed on the proxy: when the proxy's tap goes away (the proxy cache
// is destroyed, or the link detaches), the link forgets the proxy.
struct SmallKvTapHandle {
  std::shared_ptr<SmallKvProxyLink> link;  // set once the tap is installed
  ~SmallKvTapHandle() {
    if (!link) return;
    link->proxy_ = nullptr;
    link->latest_.clear();
  }
};

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
  self->matched_through_ = -1;
  self->stats_dropped_ = false;
  handle->link = self;
  proxy.set_attention_tap(std::move(tap));
}

void SmallKvProxyLink::detach() noexcept {
  if (proxy_) proxy_->set_attention_tap({});  // the handle's destructor clears proxy_
  proxy_ = nullptr;
  latest_.clear();
}

uint32_t SmallKvProxyLink::proxy_heads() const {
  return proxy_ ? proxy_->geometry().n_layers * proxy_->geometry().n_q_heads : 0;
}

void SmallKvProxyLink::drop_match_stats() noexcept {
  stats_dropped_ = true;
  std::vector<float>().swap(match_stats_);
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
  std::vector<LatestQueries> latest(n_kv_heads);
  std::vector<Sum> sums;
  int64_t through = matched_through_;
  for (uint32_t kv_head = 0; kv_head < n_kv_heads; ++kv_head) {
    const float* qh = q_rows + size_t(kv_head) * n_rows * dim;
    latest[kv_head].rows.assign(qh, qh + n_rows * dim);
    latest[kv_head].positions.assign(row_positions, row_positions + n_rows);
    if (stats_dropped_) continue;
    // Eq. 1 over the first match_tokens rows, for the queries among those tokens.
    const ExactStore& s = proxy_->exact_rows(layer, kv_head);
    const size_t m = std::min<size_t>(s.size(), match_tokens_);
    if (m == 0) continue;
    const int32_t limit = s.size() >= match_tokens_ ? s.positions[match_tokens_ - 1]
                                                    : std::numeric_limits<int32_t>::max();
    std::vector<float> k, q;
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
  // Nothing below can fail.
  for (uint32_t kv_head = 0; kv_head < n_kv_heads; ++kv_head) {
    LatestQueries& lq = latest_[size_t(layer) * g.n_kv_heads + kv_head];
    lq.rows.swap(latest[kv_head].rows);
    lq.positions.swap(latest[kv_head].positions);
  }
  for (const Sum& sum : sums) {
    float* dst = match_stats_.data() + sum.offset;
    for (size_t t = 0; t < sum.acc.size(); ++t) dst[t] += sum.acc[t];
  }
  matched_through_ = through;
}

void SmallKvProxyLink::match_scores(uint32_t head, const int32_t* positions, size_t n,
                                    float* out) const {
  const Geometry& g = proxy_->geometry();
  const uint32_t layer = head / g.n_q_heads, kv_head = (head % g.n_q_heads) / g.group_size();
  const ExactStore& s = proxy_->exact_rows(layer, kv_head);
  const size_t m = std::min<size_t>(s.size(), match_tokens_);
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

void SmallKvProxyLink::weights(uint32_t head, const int32_t* row_positions, size_t n_rows,
                               const int32_t* wanted, size_t n_wanted, float* out) const {
  const Geometry& g = proxy_->geometry();
  const uint32_t dim = g.head_dim, group = g.group_size();
  const uint32_t layer = head / g.n_q_heads, h = head % g.n_q_heads;
  const uint32_t kv_head = h / group, j = h % group;
  const LatestQueries& lq = latest_[size_t(layer) * g.n_kv_heads + kv_head];
  // The proxy's query of head h at each row's position (the latest pass over that layer).
  std::vector<std::pair<int32_t, uint32_t>> by_pos;
  for (size_t r = j; r < lq.positions.size(); r += group) {
    by_pos.emplace_back(lq.positions[r], uint32_t(r));
  }
  std::sort(by_pos.begin(), by_pos.end());
  std::vector<float> q(n_rows * dim);
  for (size_t r = 0; r < n_rows; ++r) {
    const auto it = std::lower_bound(by_pos.begin(), by_pos.end(),
                                     std::make_pair(row_positions[r], uint32_t(0)));
    if (it == by_pos.end() || it->first != row_positions[r]) {
      fail(KVSDK_E_STATE, "the proxy cache has not attended position ", row_positions[r],
           " in its layer ", layer, ": run the proxy model on the same tokens just before the "
           "large model (smallkv uses the proxy's attention of the same step)");
    }
    std::copy_n(lq.rows.data() + size_t(it->second) * dim, dim, q.data() + r * dim);
  }
  const ExactStore& s = proxy_->exact_rows(layer, kv_head);
  std::vector<float> k;
  proxy_keys(s, s.size(), dim, k);
  cpu::smallkv_proxy_weights(q.data(), row_positions, n_rows, k.data(), s.positions.data(),
                             s.size(), dim, g.attn_scale, wanted, n_wanted, out);
}

}  // namespace kvsdk
