// The first published size of every versioned struct of include/kvsdk.h (the struct_size rule of
// its ABI rules). A struct grows only at its end, so the first version's size is the end of its
// last first-version field; it never changes when later fields are added. Calls accept any
// struct_size from this size up: input structs through read_versioned, output structs through
// write_versioned (util/options.h).
#pragma once

#include <cstddef>

#include "kvsdk.h"

namespace kvsdk {

#define KVSDK_END_OF(type, field) (offsetof(type, field) + sizeof(static_cast<type*>(nullptr)->field))

// Inputs.
constexpr size_t kContextOptionsSizeV1 = KVSDK_END_OF(kvsdk_context_options, budget_bytes);
constexpr size_t kGeometrySizeV1 = KVSDK_END_OF(kvsdk_geometry, attn_scale);
constexpr size_t kSaveOptionsSizeV1 = KVSDK_END_OF(kvsdk_save_options, max_journal_percent);
// (kvsdk_policy: kPolicySizeV1 in core/policy.h, with the defaults its versions imply.)

// Outputs.
constexpr size_t kCacheStatsSizeV1 = KVSDK_END_OF(kvsdk_cache_stats, context_used_bytes);
constexpr size_t kLayerStatsSizeV1 = KVSDK_END_OF(kvsdk_layer_stats, bytes_by_tier);
constexpr size_t kLoadInfoSizeV1 = KVSDK_END_OF(kvsdk_load_info, journal_frames_dropped);

#undef KVSDK_END_OF

}  // namespace kvsdk
