// Policy presets and their parameters (one preset per method of docs/papers.md, and the
// compositions listed there): defaults, parsing of preset names such as "xkv+kivi2", and
// validation.
#pragma once

#include <cstddef>
#include <string>

#include "core/method_traits.h"
#include "kvsdk.h"

namespace kvsdk {

// kvsdk_policy's sizes by version: the first (up to match_tokens), with evict_slack, and with
// kivi_weight_bits. A caller's struct_size below kPolicySizeV1 is refused; fields past its size
// take the defaults (of their version: see policy_from_c).
constexpr size_t kPolicySizeV1 = offsetof(kvsdk_policy, evict_slack);
constexpr size_t kPolicySizeV2 = offsetof(kvsdk_policy, evict_slack) + sizeof(float);
constexpr size_t kPolicySizeV3 = offsetof(kvsdk_policy, kivi_weight_bits) + sizeof(int32_t);
// kivi_weight_bits: what structs and snapshots from before the field get (the first kernels').
constexpr int32_t kLegacyKiviWeightBits = 14;
// evict_slack: default (1/16 of a layer's cap, see kvsdk.h) and largest value.
constexpr float kDefaultEvictSlack = 0.0625f;
constexpr float kMaxEvictSlack = 0.5f;

kvsdk_policy policy_defaults(kvsdk_method method);
// Validates a caller's struct (any struct_size) and returns the known version.
kvsdk_policy policy_from_c(const kvsdk_policy* caller);
// Throws KVSDK_E_UNSUPPORTED when this build cannot run the policy yet.
void require_policy_implemented(const kvsdk_policy& policy);
// Parses a preset name such as "full", "snapkv" or "xkv+kivi2" (kvsdk_policy_parse_sized's
// grammar) into the method's defaults with the overlay's quant_bits; a full-size struct
// (struct_size = sizeof(kvsdk_policy)). Throws KVSDK_E_INVALID_ARG on a name that does not parse.
kvsdk_policy parse_policy_spec(const std::string& spec);
// KVSDK_QUANT_RESIDUAL_AUTO resolved (include/kvsdk.h): `policy` unchanged when its
// quant_residual is explicit; otherwise the window for its KIVI width at `head_dim`.
kvsdk_policy resolve_auto_residual(const kvsdk_policy& policy, uint32_t head_dim);
// kivi_weight_bits 0 (the default) resolved to 7 or 14 by quant_bits (include/kvsdk.h); a policy
// without KIVI codes (quant_bits 0) keeps 0.
kvsdk_policy resolve_auto_weight_bits(const kvsdk_policy& policy);
// "snapkv+kivi2"-style canonical name.
std::string policy_spec(const kvsdk_policy& policy);

}  // namespace kvsdk
