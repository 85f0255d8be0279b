// Token selection for one KV head (the eviction step of the eviction presets): which of `n`
// candidate rows (in storage order, oldest first) survive when only `k` may stay. Survivors keep
// their order and positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::policy {

// Keeps the first `sinks` rows, the newest `recent` rows, and fills the rest of the k slots with
// the rows of the middle range that have the highest `scores` (ties: the older row wins). With
// `scores` NULL the middle contributes its newest rows (pure recency, StreamingLLM).
// sinks and recent are clipped so that sinks + recent <= k. Returns ascending row indices,
// exactly min(k, n) of them.
std::vector<uint32_t> select_keep(size_t n, size_t k, size_t sinks, size_t recent,
                                  const float* scores);
// The same into `keep` (replaced), with `mid` as working memory: both keep their capacity, so a
// selection pass of the decode path allocates nothing once they have grown to the layer's rows.
void select_keep(size_t n, size_t k, size_t sinks, size_t recent, const float* scores,
                 std::vector<uint32_t>& keep, std::vector<uint32_t>& mid);

}  // namespace kvsdk::policy
