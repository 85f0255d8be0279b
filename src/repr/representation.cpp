#include "core/representation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/method_traits.h"
#include "core/policy.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/thread_pool.h"

namespace kvsdk {

backend::Workspace& Representation::workspace() const {
  const size_t slot = ThreadPool::current_slot();
  if (slot >= ws_.size()) {
    fail(KVSDK_E_INTERNAL, "attend on thread slot ", slot, " of a store set up for ", ws_.size());
  }
  backend::WorkspaceHandle& h = ws_[slot];
  if (!h) h = backend::WorkspaceHandle(*ops_);
  return h.get();
}

void Representation::attend_range(uint32_t /*layer*/, uint32_t /*kv_head*/,
                                  const float* /*q_rows*/, const int32_t* /*row_positions*/,
                                  size_t /*n_rows*/, size_t /*first*/, size_t /*count*/,
                                  const backend::PartialState& /*out*/) const {
  fail(KVSDK_E_INTERNAL, "attend_range on a store that attends whole heads only");
}

void Representation::prefetch(uint32_t /*layer*/, uint32_t /*kv_head*/, const float* /*q_rows*/,
                              const int32_t* /*row_positions*/, size_t /*n_rows*/) {
  fail(KVSDK_E_UNSUPPORTED, "prefetch (speculative queries) is SpeCache's; policy '",
       policy_spec(policy_), "' does not use it");
}

void Representation::set_backing_file(const std::string& /*path*/) {
  fail(KVSDK_E_UNSUPPORTED, "a backing file is SpeCache's; policy '", policy_spec(policy_),
       "' has no backing store");
}

namespace {

[[noreturn]] void not_a_row_store(const kvsdk_policy& p, const char* what) {
  fail(KVSDK_E_INTERNAL, what, " called on a store of policy '", policy_spec(p),
       "' that the selection stage does not evict");
}

}  // namespace

const int32_t* Representation::row_positions(uint32_t, uint32_t) const {
  not_a_row_store(policy_, "row_positions");
}

void Representation::load_keys(uint32_t, uint32_t, size_t, size_t, float*) const {
  not_a_row_store(policy_, "load_keys");
}

uint64_t Representation::plan_keep(uint32_t, const std::vector<std::vector<uint32_t>>&,
                                   const IncomingRows*) {
  not_a_row_store(policy_, "plan_keep");
}

uint64_t Representation::layer_token_bytes(uint64_t) const {
  not_a_row_store(policy_, "layer_token_bytes");
}

uint64_t Representation::layer_token_capacity(uint64_t, uint64_t) const {
  not_a_row_store(policy_, "layer_token_capacity");
}

void Representation::restore_exact(uint32_t layer, std::vector<ExactStore> heads) {
  for (const ExactStore& h : heads) {
    if (h.size() != 0) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has exact rows, but policy '",
           policy_spec(policy_), "' holds it compressed");
    }
  }
}


void Representation::attention_lse(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                   const int32_t* row_positions, size_t n_rows, float* lse,
                                   LseScratch& s) const {
  const size_t n = head_tokens(layer, kv_head), dim = geometry_.head_dim;
  float* k = at_least(s.k, n * dim).data();
  float* v = at_least(s.v, n * dim).data();  // (read() fills both; values unused)
  int32_t* pos = at_least(s.pos, n).data();
  if (n > 0) read(layer, kv_head, k, v, pos);
  const float scale = geometry_.attn_scale;
  for (size_t r = 0; r < n_rows; ++r) {
    const float* q = q_rows + r * dim;
    // Two passes (max, then the sum of exponentials below it) in double: the weights of the
    // merge are differences of log-sum-exps, whose error is what the merged output inherits.
    double m = -std::numeric_limits<double>::infinity();
    for (size_t t = 0; t < n; ++t) {
      if (pos[t] > row_positions[r]) continue;
      double d = 0.0;
      for (size_t c = 0; c < dim; ++c) d += double(q[c]) * double(k[t * dim + c]);
      m = std::max(m, d * scale);
    }
    if (m == -std::numeric_limits<double>::infinity()) {
      lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    double sum = 0.0;
    for (size_t t = 0; t < n; ++t) {
      if (pos[t] > row_positions[r]) continue;
      double d = 0.0;
      for (size_t c = 0; c < dim; ++c) d += double(q[c]) * double(k[t * dim + c]);
      sum += std::exp(d * scale - m);
    }
    lse[r] = float(m + std::log(sum));
  }
}


std::unique_ptr<Representation> make_representation(const Geometry& geometry,
                                                    const kvsdk_policy& policy) {
  const auto make = method_traits(policy).make_store;
  return make ? make(geometry, policy) : nullptr;
}

void Representation::append_host(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                                 const int32_t* positions) {
  const size_t elems = n_tokens * geometry_.kv_elems_per_token();
  load_f32(geometry_.dtype, k, 0, elems, at_least(host_k_, elems).data());
  load_f32(geometry_.dtype, v, 0, elems, at_least(host_v_, elems).data());
  append(layer, n_tokens, host_k_.data(), host_v_.data(), positions);
}

void Representation::attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                                  const int32_t* row_positions, size_t n_rows,
                                  float* out) const {
  const size_t elems = n_rows * geometry().head_dim;
  for (uint32_t g = 0; g < n_kv; ++g) {
    attend(layer, g, q_rows + g * elems, row_positions, n_rows, out + g * elems);
  }
}

void Representation::read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                               int32_t* positions) const {
  const size_t n = head_tokens(layer, kv_head) * geometry_.head_dim;
  std::vector<float> kf(k ? n : 0), vf(v ? n : 0);
  read(layer, kv_head, k ? kf.data() : nullptr, v ? vf.data() : nullptr, positions);
  if (k) store_f32(geometry_.dtype, kf.data(), n, k, 0);
  if (v) store_f32(geometry_.dtype, vf.data(), n, v, 0);
}

void Representation::head_rows(const float* k, const float* v, size_t n, uint32_t head,
                               float* k_out, float* v_out) const {
  const size_t dim = geometry_.head_dim, row = geometry_.kv_elems_per_token();
  for (size_t t = 0; t < n; ++t) {
    std::copy_n(k + t * row + head * dim, dim, k_out + t * dim);
    std::copy_n(v + t * row + head * dim, dim, v_out + t * dim);
  }
}

}  // namespace kvsdk
