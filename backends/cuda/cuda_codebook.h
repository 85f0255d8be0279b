// SpindleKV codebook gather on the device (Tang et al. 2025, SpindleKV (docs/papers.md) Eq. 14):
// row r of a shallow layer is reconstructed as C[index[r]] · magnitude[r] from the f16 unit-vector
// codebook, in exactly the arithmetic of backends/cpu/spindlekv_codebook.cpp (one f16->f32
// conversion and one f32 multiply per element), so results are bit-identical to the CPU's
// reconstruct().
//
// Device pointers; enqueued on `stream`. Indices must be < the number of entries (the codebook
// builder guarantees it; not checked on the device). Throws kvsdk::Error: KVSDK_E_INVALID_ARG
// for dim 0, KVSDK_E_BACKEND for launch failures.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// entries f16 [n_entries][dim], index [n], magnitude [n] -> out f32 [n][dim].
void codebook_reconstruct(const uint16_t* entries, const uint32_t* index, const float* magnitude,
                          size_t n, size_t dim, float* out, cudaStream_t stream);

}  // namespace kvsdk::cuda
