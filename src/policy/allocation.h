// Allocation of a cache's token capacity across layers (stage 2 of a policy, docs/papers.md). Every
// function returns per-layer token counts (per KV head: every head of a layer keeps the same number
// of rows) that never exceed the layer's length and sum to min(capacity, total length), so the byte
// budget converted into `capacity` is used exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::policy {

// Equal shares, water-filled: a layer shorter than its share gives the rest to the others.
std::vector<uint64_t> allocate_uniform(const std::vector<uint64_t>& lengths, uint64_t capacity);

// PyramidKV/SpindleKV linear schedule (SpindleKV §3.3, Eq. 5-6): the context part (beyond the
// `protected_tokens` observation window of each layer) keeps a ratio that decreases linearly from
// layer 0 to the last layer, with the mean equal to the overall ratio; `beta` is the minimal
// ratio and `alpha` the overall ratio above which layer 0 keeps everything.
std::vector<uint64_t> allocate_pyramid(const std::vector<uint64_t>& lengths,
                                       const std::vector<uint64_t>& protected_tokens,
                                       uint64_t capacity, double alpha, double beta);

// XKV Algorithm 1 (XKV paper §IV, Eq. (4), (17), (18)): greedy wait-list allocation over the
// per-layer importance vectors w_i. Mode N: exactly min(N, sum |w_i|) tokens that maximise
// R_avg = mean_i Sum(TopK(n_i, w_i)) / Sum(w_i). Mode R_avg: the smallest total reaching
// R_avg >= target. A layer whose weights sum to zero contributes no retention (gain 0).
std::vector<uint64_t> xkv_allocate_total(const std::vector<std::vector<float>>& w, uint64_t n);
std::vector<uint64_t> xkv_allocate_retention(const std::vector<std::vector<float>>& w,
                                             double target_avg_retention);
// R_avg of an allocation (Eq. (4) averaged over layers).
double xkv_average_retention(const std::vector<std::vector<float>>& w,
                             const std::vector<uint64_t>& n);

// Splits `capacity` by `shares` (largest remainder, exact sum): allocation profiles.
std::vector<uint64_t> allocate_by_shares(const std::vector<double>& shares, uint64_t capacity);

}  // namespace kvsdk::policy
