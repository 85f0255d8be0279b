// Mini-prefill planner (XKV paper §IV-A, Fig. 6-8): during a first pass over the prompt without a
// cache, the host feeds each layer's keys and observation-window queries; the planner reduces them
// to one importance vector per layer (window attention, pooled, averaged over KV heads), discards
// the tensors, and at the end runs XKV Algorithm 1 to return the allocation of the real prefill.
#pragma once

#include <cstdint>
#include <vector>

#include "core/geometry.h"
#include "kvsdk.h"

namespace kvsdk::policy {

class Planner {
 public:
  Planner(const Geometry& g, const kvsdk_policy& p)
      : g_(g), p_(p), w_(g.n_layers), prot_(g.n_layers, 0), fed_(g.n_layers, false) {}

  void feed_layer(uint32_t layer, size_t n_tokens, const void* k, const int32_t* positions,
                  size_t n_queries, const void* q, const int32_t* q_positions);
  // Rows per KV head per layer: the protected window plus the XKV allocation of the context.
  std::vector<uint64_t> finish(int32_t mode, double value) const;
  const Geometry& geometry() const { return g_; }

 private:
  Geometry g_;
  kvsdk_policy p_;
  std::vector<std::vector<float>> w_;  // per layer importance of the context part
  std::vector<uint64_t> prot_;         // per layer observation-window rows always kept
  std::vector<bool> fed_;
};

// XKV Algorithm 1 in either kvsdk_alloc_mode, with the mode/value checks of the C API.
std::vector<uint64_t> plan_xkv_checked(const std::vector<std::vector<float>>& w, int32_t mode,
                                       double value);

}  // namespace kvsdk::policy
