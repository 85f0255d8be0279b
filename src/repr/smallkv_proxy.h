// SmallKV's link to the proxy (SmallKV (docs/papers.md) §4): the cache of a smaller model of the
// same family (policy 'full') that runs on the same tokens just before the large model. The link
// listens to the proxy's attention through Cache::set_attention_tap and keeps
//  - each proxy (layer, KV head)'s latest packed query rows, so that the large cache can compute
//    the matched proxy head's attention of the same step over the proxy's full cache (Eq. 6), and
//  - Eq. 1 of every proxy head over the first match_tokens tokens (for the head matching, Eq. 2/3).
// Proxy heads are numbered across layers: layer * n_q_heads + head.
//
// A proxy cache on a device (its rows in a device arena, Cache::device_rows): the probabilities
// are computed there by the proxy context's own smallkv_softmax (the reference's bits), the
// query rows going up and one float per proxy row coming back; only Eq. 1's statistics, while
// some large head is not matched, read the proxy's first rows through a host copy.
//
// Lifetime: the representation owns the link through a shared_ptr; the tap installed on the proxy
// holds a handle whose destructor clears the link's proxy pointer, so destroying the proxy cache
// (or replacing its tap) detaches it, and the representation removes its tap when it dies.
// Working state outside the budget: the latest query rows of one step, the proxy's matching
// statistics (proxy heads x match_tokens floats until the matching is done), and the proxy's
// probabilities of the latest step per proxy head (at most proxy heads x proxy rows floats):
// the large model's query heads of every layer share the proxy's few heads, so each head's
// softmax of a step is computed once, at the first large layer that needs it, and reused by the
// others until the proxy's next queries for that layer replace it. Nothing of it is saved.
//
// Threads (kvsdk_cache_set_proxy_wait): the proxy may run on its own thread, concurrently with
// the large cache's step over the same positions, as SmallKV's Algorithm 1 runs the two models in
// parallel. The tap (proxy thread) publishes each layer's queries under mu_; the large cache's
// calls wait on cv_ for what they read: weights() for the queries of one proxy layer at the
// step's positions, await_step() for every layer (the matching statistics are sums over all
// layers). Once a layer's queries of a step are published, the proxy's thread touches neither
// that layer's rows nor its entries here until its next step, which the host starts only after
// the large cache's step returned (the header's contract); so the large cache reads them
// without the lock. The fields both threads write (statistics, matched_through_,
// stats_dropped_, latest_, probs_ validity) change only under mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backend_ops.h"

namespace kvsdk {

class Cache;

class SmallKvProxyLink {
 public:
  explicit SmallKvProxyLink(uint32_t match_tokens);
  ~SmallKvProxyLink();

  // Installs the tap on `proxy` (which must be a 'full' cache without a tap; checked by the
  // caller) and resets the per-proxy state. `self` is the shared_ptr that owns this link. On
  // failure (allocation) the previous link is kept.
  static void attach(const std::shared_ptr<SmallKvProxyLink>& self, Cache& proxy);
  // Removes the tap from the proxy, if any.
  void detach() noexcept;
  Cache* proxy() const { return proxy_; }
  uint32_t proxy_heads() const;  // query heads of the proxy over all its layers

  // The tap: records the query rows of this step of every KV head of one proxy layer (q_rows
  // [n_kv_heads][n_rows][head_dim], row_positions [n_rows], the same for every head) and adds
  // Eq. 1 of the queries among the first match_tokens tokens. Computes everything before it
  // changes anything: on failure (allocation) the link is unchanged.
  void on_proxy_queries(uint32_t layer, uint32_t n_kv_heads, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows);

  // Proxy head `head`'s Eq. 1 scores at `positions` (the large cache's matching tokens), written
  // to out [n] (0 for a position the proxy does not hold among its first match_tokens rows).
  void match_scores(uint32_t head, const int32_t* positions, size_t n, float* out) const;
  // The largest query position counted in the matching statistics (-1: none yet).
  int64_t matched_through() const;
  // Frees the matching statistics (every large head is matched).
  void drop_match_stats() noexcept;
  // Whether the matching statistics are still kept (a large head is not matched yet).
  bool keeps_match_stats() const;

  // How long the large cache's calls wait for the proxy's thread (kvsdk_cache_set_proxy_wait):
  // 0 = never (the proxy ran first, on the same thread).
  void set_wait_ms(uint32_t ms);
  // Once every large head is matched: the proxy heads the large cache reads (`heads` [proxy
  // heads], non-zero: read) and the large cache's backend. With a wait set, the proxy's thread
  // then computes those heads' probabilities of a decode step itself, as it publishes their
  // layer's queries, so that the large cache's attend finds them done (weights()). Called by
  // the large cache's thread; the proxy's thread sees it at its next step.
  void set_read_heads(const backend::Ops& ops, const std::vector<uint8_t>& heads);
  bool has_read_heads() const;
  // Returns once the proxy's latest pass over every layer has queries at `position` or later
  // (the proxy's step through `position` is complete), waiting up to the wait set; without waiting
  // (wait 0) returns at once, as the proxy then ran first. Throws KVSDK_E_STATE on timeout.
  void await_step(int64_t position) const;
  // The newest position among the proxy's latest queries of every layer (-1: none; INT32_MAX
  // for a query without a position), for the large cache's kvsdk_cache_truncate: those queries
  // serve the large cache's next attend (Eq. 6), so they must not come from removed tokens.
  int64_t newest_query() const;

  // The attention probabilities of proxy head `head` at this step for the query rows at
  // `row_positions` [n_rows] over the proxy's full cache, gathered at `wanted` [n_wanted]
  // positions into out [n_rows][n_wanted] (0 for a position the proxy does not hold), by the
  // backend's smallkv_softmax in `ws`. Throws KVSDK_E_STATE when the proxy has not attended a
  // row's position in its latest pass over that layer.
  void weights(const backend::Ops& ops, backend::Workspace& ws, uint32_t head,
               const int32_t* row_positions, size_t n_rows, const int32_t* wanted,
               size_t n_wanted, float* out) const;

 private:
  struct LatestQueries {
    std::vector<float> rows;       // [n_rows][head_dim], packed as Cache::attend packs them
    std::vector<int32_t> positions;  // [n_rows]
  };
  // One proxy head's probabilities over the proxy's rows for its query at `position`, valid
  // while the proxy held `n` rows and has not attended that layer again.
  struct StepProbs {
    bool valid = false;
    int32_t position = 0;
    size_t n = 0;
    std::vector<float> p;  // [n]
  };
  // The row of `head`'s query at `position` in the proxy's latest pass over its layer (-1: none).
  int64_t find_query(uint32_t head, int32_t position) const;
  // Waits (up to the wait set) until `head`'s layer has queries at every one of `positions` [n] and
  // returns their rows' start in latest_ (into query_rows_); throws KVSDK_E_STATE without them.
  void await_queries(uint32_t head, const int32_t* positions, size_t n) const;

  // The proxy's thread: computes the read heads' probabilities of this layer's single-query step
  // into staged_probs_ (false: none computed, e.g. a prefill chunk or no wait set).
  bool precompute_probs(uint32_t layer, uint32_t n_kv_heads, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows);

  // One proxy KV head's rows as the softmax reads them: the positions on the host, the keys on
  // the host (k) or, for a proxy cache on a device, where its store keeps them (device: the
  // backend memory of the proxy's context; nothing is copied out).
  struct ProxyRows {
    const int32_t* positions = nullptr;
    size_t n = 0;
    const uint16_t* k = nullptr;
    bool on_device = false;
    backend::F16Rows device;
  };
  ProxyRows rows_of(uint32_t layer, uint32_t kv_head) const;
  // The softmax of `qr` (host rows) over `rows` into out [qr.n_rows][rows.n] (host): by `ops` in
  // `ws` for host rows; on the device with the proxy context's own table for device rows (the
  // reference's bits there: the CUDA table's smallkv_softmax), only the probabilities coming
  // back. `side`: the calling thread's device buffers (made on first use).
  struct DeviceSoftmax;
  void softmax(const backend::Ops& ops, backend::Workspace& ws,
               std::unique_ptr<DeviceSoftmax>& side, const ProxyRows& rows,
               const backend::QueryRows& qr, float* out) const;
  // The device buffers of the large cache's thread (weights()) and of the proxy's
  // (precompute_probs()), released with the proxy.
  mutable std::unique_ptr<DeviceSoftmax> large_side_, proxy_side_;

  // set_read_heads(): written by the large cache's thread under mu_, read by the proxy's.
  const backend::Ops* read_ops_ = nullptr;
  std::vector<uint8_t> read_heads_;
  // The proxy thread's own workspace and staged probabilities (the proxy's thread only).
  backend::WorkspaceHandle proxy_ws_;
  std::vector<StepProbs> staged_probs_;  // [proxy head of one layer]
  std::vector<float> proxy_probs_;  // one KV head's rows of probabilities, [group][tokens]
  std::vector<uint8_t> proxy_read_heads_;  // read_heads_ as the proxy's thread last copied it
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};  // bumped under mu_ with every publication
  // How long a waiting call spins before it blocks (util/spin_wait.h): a decode step's proxy
  // layer takes tens of microseconds on the models kvsdk is measured with.
  static constexpr std::chrono::microseconds kSpin{300};
  std::chrono::steady_clock::time_point deadline() const;  // now + wait_ms_ (mu_ held)
  uint32_t wait_ms_ = 0;
  std::vector<int64_t> newest_;  // [proxy layer] newest position of its latest queries (-1: none)

  uint32_t match_tokens_;
  Cache* proxy_ = nullptr;
  mutable std::vector<StepProbs> probs_;  // [proxy head]
  // weights()' working memory, reused (one thread per cache): the proxy's rows in position order
  // (when they are not already), and each wanted position's proxy row (-1: not held).
  mutable std::vector<uint32_t> by_pos_;
  mutable std::vector<int64_t> row_of_;
  mutable std::vector<std::pair<int32_t, uint32_t>> query_at_;  // (position, latest row)
  mutable std::vector<const float*> query_rows_;  // await_queries()' result, per position
  std::vector<LatestQueries> latest_;  // [layer * n_kv_heads + kv_head] of the proxy
  // The rows of one proxy attend, staged before they replace latest_'s by swapping buffers: the
  // two sets of buffers trade places every step and keep their capacity, so a decode step
  // allocates nothing once both have grown.
  std::vector<LatestQueries> staged_;
  std::vector<float> match_keys_;  // the proxy's first match_tokens keys in f32 (Eq. 1), reused
  std::vector<float> match_stats_;     // [proxy head][match_tokens]
  int64_t matched_through_ = -1;
  bool stats_dropped_ = false;

  friend struct SmallKvTapHandle;
};

}  // namespace kvsdk
