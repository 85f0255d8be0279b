#include "core/representation.h"

#include <algorithm>

#include "core/error.h"
#include "core/policy.h"

namespace kvsdk {

void Representation::prefetch(uint32_t /*layer*/, uint32_t /*kv_head*/, const float* /*q_rows*/,
                              const int32_t* /*row_positions*/, size_t /*n_rows*/) {
  fail(KVSDK_E_UNSUPPORTED, "prefetch (speculative queries) is SpeCache's; policy '",
       policy_spec(policy_), "' does not use it");
}

void Representation::set_backing_file(const std::string& /*path*/) {
  fail(KVSDK_E_UNSUPPORTED, "a backing file is SpeCache's; policy '", policy_spec(policy_),
       "' has no backing store");
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
