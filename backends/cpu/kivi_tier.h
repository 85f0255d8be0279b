// A KIVI tier given as raw buffers (backend::KiviTier: what a device store keeps in its arena) as
// the KiviHeadStore that holds them, so that the CPU tables' attend_kivi_tier and a device
// store's host copies (reads, snapshots) run the CPU store's own code on the same bytes.
#pragma once

#include <cstddef>

#include "backend_ops.h"
#include "kivi_store.h"

namespace kvsdk::cpu {

// The store of `tier`'s quantized tokens followed by `residual`'s exact rows (host pointers;
// positions: the tier's, then the residual's). A copy, checked as a snapshot's buffers are:
// throws kvsdk::Error (KVSDK_E_CORRUPT) when the sizes do not make a store of head_dim `dim`.
KiviHeadStore kivi_store_from_tier(const backend::KiviTier& tier, const backend::F16Rows& residual,
                                   size_t dim);

}  // namespace kvsdk::cpu
