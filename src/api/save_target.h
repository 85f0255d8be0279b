// Save-time compression (kvsdk_save_options.target_policy, `kvsdk recompress`): a cache converted
// to another policy and budget, built beside the live cache, which stays as it is. The contract
// (what converts exactly, what is refused) is include/kvsdk.h's "Targeted saves".
#pragma once

#include <cstdint>
#include <memory>

#include "kvsdk.h"

namespace kvsdk {

class Cache;

// The target fields of a caller's kvsdk_save_options (NULL: none).
struct SaveTarget {
  bool set = false;       // target_policy was given
  kvsdk_policy policy{};  // validated (policy_from_c, require_policy_implemented)
  uint64_t budget = 0;    // target_budget_bytes (0: the source cache's own budget)
};

// Reads and validates the target fields: KVSDK_E_INVALID_ARG for a bad policy or a budget
// without one, KVSDK_E_UNSUPPORTED for a policy this build cannot create.
SaveTarget save_target_from_c(const kvsdk_save_options* options);

// A new cache on `source`'s context (charged to it) holding `source` converted to `target`:
// the same method and quant_bits: an exact copy (Cache::fork) given the budget; otherwise
// every layer's rows re-appended in stored order, then the budget set over every layer at
// once. `source` is not changed. Throws kvsdk::Error (KVSDK_E_UNSUPPORTED for a pair that
// cannot be converted, KVSDK_E_BUDGET, ...), charging nothing then.
std::unique_ptr<Cache> convert_cache(const Cache& source, const SaveTarget& target);

}  // namespace kvsdk
