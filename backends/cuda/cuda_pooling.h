// 1-D pooling of importance scores along the token axis (SnapKV-style smoothing before top-k, so
// that neighbours of an important token survive with it). Each output element is the max or the
// mean of the `width` (odd) inputs centred on it in its row; windows are clipped at the row ends
// and the mean divides by the number of inputs actually inside the row.
//
// Device pointers; enqueued on `stream`; in and out must not overlap. Throws kvsdk::Error:
// KVSDK_E_INVALID_ARG for an even or zero width, KVSDK_E_BACKEND for launch failures.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kvsdk::cuda {

enum class PoolKind { kMax, kAvg };

// in/out [rows][n].
void pool1d(const float* in, size_t rows, size_t n, size_t width, PoolKind kind, float* out,
            cudaStream_t stream);

}  // namespace kvsdk::cuda
