// Policy presets and their parameters (one preset per method of docs/papers.md, and the
// compositions listed there): defaults, parsing of preset names such as "xkv+kivi2", and
// validation.
#pragma once

#include <string>

#include "core/method_traits.h"
#include "kvsdk.h"

namespace kvsdk {

kvsdk_policy policy_defaults(kvsdk_method method);
// Validates a caller's struct (any struct_size) and returns the known version.
kvsdk_policy policy_from_c(const kvsdk_policy* caller);
// Throws KVSDK_E_UNSUPPORTED when this build cannot run the policy yet.
void require_policy_implemented(const kvsdk_policy& policy);
// "snapkv+kivi2"-style canonical name.
std::string policy_spec(const kvsdk_policy& policy);

}  // namespace kvsdk
