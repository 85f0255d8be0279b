// MiniCache cross-layer merge and restore on the device (Liu et al. 2024, docs/papers.md; the
// method as fixed in backends/cpu/minicache_merge.h): for each token the rows of layers l-1
// and l are merged into one f16 direction by SLERP (t = 0.6) with one magnitude per layer, and
// restored as ||x|| · e; retained tokens keep both f16 rows.
//
// The kernels compute, per token, what the CPU computes (norms, cos Ω and the SLERP weights in
// f64, the direction rounded to f16, magnitudes ||x|| / ||e_f16||) and the angular distance Ω/π.
// Which tokens are retained (the ceil(γ·n) most distant at prefill, a threshold afterwards) is a
// sort over n floats and stays with the caller, like the slot bookkeeping.
//
// Device pointers; enqueued on `stream`. Throws kvsdk::Error: KVSDK_E_INVALID_ARG for dim 0 or t
// outside [0, 1], KVSDK_E_BACKEND for launch failures.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// prev/cur f32 [n][dim] (same tokens of layers l-1 and l). Writes direction f16 [n][dim],
// mag_prev/mag_cur [n] and distance [n] (Ω/π; 1 when either row is zero, whose direction and
// magnitudes are then 0).
void minicache_merge(const float* prev, const float* cur, size_t n, size_t dim, float t,
                     uint16_t* direction, float* mag_prev, float* mag_cur, float* distance,
                     cudaStream_t stream);

// The slot of a token: its merged index, or kMiniCacheRetained | its retained index.
constexpr uint32_t kMiniCacheRetained = 0x80000000u;

// Restores n tokens of one layer: out f32 [n][dim] from slot [n], direction f16 [merged][dim],
// mag [merged] (that layer's magnitudes) and retained f16 [retained][dim] (that layer's rows).
void minicache_restore(const uint32_t* slot, const uint16_t* direction, const float* mag,
                       const uint16_t* retained, size_t n, size_t dim, float* out,
                       cudaStream_t stream);

}  // namespace kvsdk::cuda
