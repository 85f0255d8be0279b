// C ABI: initialising and parsing a kvsdk_policy (the presets' defaults and the preset-name
// grammar live in core/policy.cpp). Kept apart from the core so that the entry points that fill
// an app's struct follow the struct_size rules of include/kvsdk.h like every other *_init_sized
// (util/options.h, init_versioned).
#include <cstddef>

#include "core/method_traits.h"
#include "core/policy.h"
#include "kvsdk.h"
#include "util/error.h"
#include "util/options.h"

using namespace kvsdk;

namespace {

// Checks the method first, so that a bad method writes nothing either.
void init_policy(kvsdk_policy* policy, size_t struct_size, int32_t method) {
  KVSDK_REQUIRE(policy != nullptr, "policy is NULL");
  KVSDK_REQUIRE(method_valid(method), "method ", method, " is not a kvsdk_method");
  init_versioned(policy, struct_size, policy_defaults(kvsdk_method(method)), kPolicySizeV1,
                 "policy");
}

// Checks everything (and parses) first, so that a failure writes nothing.
void parse_policy(kvsdk_policy* policy, size_t struct_size, const char* spec) {
  KVSDK_REQUIRE(policy != nullptr, "policy is NULL");
  KVSDK_REQUIRE(spec != nullptr, "spec is NULL");
  require_init_size(struct_size, kPolicySizeV1, "policy");
  init_versioned(policy, struct_size, parse_policy_spec(spec), kPolicySizeV1, "policy");
}

}  // namespace

extern "C" {

KVSDK_API kvsdk_status kvsdk_policy_init_sized(kvsdk_policy* policy, size_t struct_size,
                                               int32_t method) {
  return guard("kvsdk_policy_init_sized", [&] { init_policy(policy, struct_size, method); });
}

// Frozen at the first version's size (before evict_slack): an app built before *_init_sized
// existed may have a struct that small, and a cache created from it evicts with slack 0, as then.
KVSDK_API kvsdk_status(kvsdk_policy_init)(kvsdk_policy* policy, int32_t method) {
  return guard("kvsdk_policy_init", [&] { init_policy(policy, kPolicySizeV1, method); });
}

KVSDK_API kvsdk_status kvsdk_policy_parse_sized(kvsdk_policy* policy, size_t struct_size,
                                                const char* spec) {
  return guard("kvsdk_policy_parse_sized", [&] { parse_policy(policy, struct_size, spec); });
}

// Frozen at the first version's size, as kvsdk_policy_init: an app built before
// kvsdk_policy_parse_sized existed may have a struct that small.
KVSDK_API kvsdk_status(kvsdk_policy_parse)(kvsdk_policy* policy, const char* spec) {
  return guard("kvsdk_policy_parse", [&] { parse_policy(policy, kPolicySizeV1, spec); });
}

}  // extern "C"
