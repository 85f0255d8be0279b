// Re-appends the rows of one cache into another cache that has a different policy, through the
// public C API only: how `kvsdk recompress` applies a new policy to a saved conversation.
#pragma once

#include "kvsdk.h"

namespace kvsdk_cli {

// Copies every layer of `src` into `dst` (same geometry) in stored order, in chunks (the caller
// then sets the budget and compresses, so the policy allocates over every layer at once). Works when
// the KV heads of each layer hold the same positions (caches whose policy evicts per layer or not
// at all, such as `full`, `streaming_llm` or `kivi`); a source evicted per KV head returns
// KVSDK_E_UNSUPPORTED, because append takes every KV head of a token at once. Importance state
// is not in such a source: the new policy ranks tokens by what it has (positions, recency).
kvsdk_status reappend(const kvsdk_cache* src, kvsdk_cache* dst, const char** detail);

}  // namespace kvsdk_cli
