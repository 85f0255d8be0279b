// A KIVI tier given as raw buffers (backend::KiviTier: what a device store keeps in its arena) as
// the KiviHeadStore that holds them, so that the CPU tables' attend_kivi_tier and a device
// store's host copies (reads, snapshots) run the CPU store's own code on the same bytes.
#pragma once

#include <cstddef>

#include "backend_ops.h"
#include "kivi_store.h"
#include "specache.h"

namespace kvsdk::cpu {

// The store of `tier`'s quantized tokens followed by `residual`'s exact rows (host pointers;
// positions: the tier's, then the residual's). A copy, checked as a snapshot's buffers are:
// throws kvsdk::Error (KVSDK_E_CORRUPT) when the sizes do not make a store of head_dim `dim`.
KiviHeadStore kivi_store_from_tier(const backend::KiviTier& tier, const backend::F16Rows& residual,
                                   size_t dim);

// The SpeCacheFetched of fetched rows given as raw buffers (backend_ops.h attend_specache_tier):
// the tokens fetched_tokens[0 .. fetched.n_tokens) with fetched.k / fetched.v [n][dim] (host
// pointers), copied. fetched.positions is not read: the CPU's SpeCache attention
// (specache_attend) puts each fetched row at its token's position in the copy. Throws
// kvsdk::Error (KVSDK_E_INVALID_ARG) unless the tokens are strictly ascending and below
// `copy_tokens` (the copy's quantized plus residual tokens).
SpeCacheFetched specache_fetched_from_rows(const backend::F16Rows& fetched,
                                           const uint32_t* fetched_tokens, size_t copy_tokens,
                                           size_t dim);

}  // namespace kvsdk::cpu
