// Policy presets and their parameters (one preset per method of docs/papers.md, and the
// compositions listed there): defaults, parsing of preset names such as "xkv+kivi2", and
// validation.
#pragma once

#include <string>

#include "kvsdk.h"

namespace kvsdk {

kvsdk_policy policy_defaults(kvsdk_method method);
// Validates a caller's struct (any struct_size) and returns the known version.
kvsdk_policy policy_from_c(const kvsdk_policy* caller);
// Throws KVSDK_E_UNSUPPORTED when this build cannot run the policy yet.
void require_policy_implemented(const kvsdk_policy& policy);
// "snapkv+kivi2"-style canonical name.
std::string policy_spec(const kvsdk_policy& policy);
bool method_valid(int32_t method);
// Whether the method scores tokens with an observation window of queries (SnapKV, PyramidKV, XKV,
// and SpindleKV's deep layers): kvsdk_cache_observe keeps the window, snapshots save it.
bool method_uses_window(int32_t method);

}  // namespace kvsdk
