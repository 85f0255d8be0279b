// The KIVI tier of a cache (policy 'kivi'): one KiviHeadStore per layer and KV head
// (backends/cpu/kivi_store.h). Internal to cache.cpp; cache.h only forward-declares it.
#pragma once

#include <vector>

#include "kivi_store.h"

namespace kvsdk {

struct KiviTier {
  std::vector<std::vector<cpu::KiviHeadStore>> heads;  // [layer][kv_head]
};

}  // namespace kvsdk
