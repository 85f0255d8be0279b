// Gather / compaction after eviction on the device: the kept tokens (top-k indices per KV head,
// ascending) of any per-token array (f16 key or value rows, packed KIVI code rows, int32
// positions, per-token scales) are copied, in index order, to the front of a destination array.
// Out of place: an in-place compaction would race between threads (row i's destination can be
// another row's source); the caller swaps buffers (or arena slices) afterwards.
//
// Device pointers; enqueued on `stream`. Rows are copied in 16-byte words when row_bytes and
// both pointers allow it, else byte by byte. Throws kvsdk::Error: KVSDK_E_INVALID_ARG for
// row_bytes 0, KVSDK_E_BACKEND for launch failures. Indices must be < src_rows (not checked on
// the device: they come from topk_rows).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// For each of `heads`: dst[h][i] = src[h][indices[h][i]] for i < k, rows of `row_bytes` bytes.
// src holds `src_rows` rows per head, dst `dst_rows` (>= k) rows per head.
void gather_rows(const void* src, size_t src_rows, const uint32_t* indices, size_t heads, size_t k,
                 size_t row_bytes, void* dst, size_t dst_rows, cudaStream_t stream);

}  // namespace kvsdk::cuda
