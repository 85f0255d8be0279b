// Per-row top-k on the device (one row = one KV head's importance scores): the indices of the k
// largest scores, ties broken towards the lower index, written in ascending index order, i.e.
// exactly backends/cpu/smallkv.h's smallkv_topk (for scores without NaN; -0 equals +0).
//
// Method: a radix select on the order-preserving integer image of the floats finds the k-th
// largest key in 32 counting passes, then one ordered block-wide compaction keeps every key above
// it plus the first (k - count_above) keys equal to it. Deterministic, no sorting.
//
// Device pointers; enqueued on `stream`. Throws kvsdk::Error: KVSDK_E_INVALID_ARG when k > n or
// n >= 2^32, KVSDK_E_BACKEND for launch failures.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// scores [rows][n] -> indices [rows][k].
void topk_rows(const float* scores, size_t rows, size_t n, size_t k, uint32_t* indices,
               cudaStream_t stream);

}  // namespace kvsdk::cuda
