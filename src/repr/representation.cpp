#include "core/representation.h"

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

}  // namespace kvsdk
