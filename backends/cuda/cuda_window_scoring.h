// Observation-window scoring on the device (the importance signal of SnapKV-style eviction and
// SmallKV's accumulated attention, SmallKV (docs/papers.md) Eq. 1): the last `window` queries of
// every query head against all keys of its KV head, as causal f32 softmax probabilities. Q·Kᵀ runs
// on cuBLAS (cublasGemmStridedBatchedEx, f16 inputs, f32 accumulation, one batch entry per KV head:
// the group's query heads are stacked as rows, so GQA needs no repeated keys); masking, scaling and
// the softmax run in one f32 kernel.
//
// Device pointers; work is enqueued on `stream` (the handle is bound to it), nothing synchronises.
// Throws kvsdk::Error: KVSDK_E_INVALID_ARG for zero sizes, KVSDK_E_BACKEND for CUDA/cuBLAS errors.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

struct WindowShape {
  size_t kv_heads = 0;
  size_t group = 1;        // query heads per KV head
  size_t window = 0;       // w: observation-window queries per query head
  size_t tokens = 0;       // n: keys per KV head
  size_t dim = 0;          // head_dim
  size_t key_stride = 0;   // tokens between consecutive KV heads in k/k_positions (>= tokens)
};

// q: f16 [kv_heads][group][window][dim] (query head h = kv * group + g); k: f16
// [kv_heads][key_stride][dim]; q_positions [window]; k_positions [kv_heads][key_stride].
// Writes probs [kv_heads][group * window][tokens]: softmax over keys of scale * q·k with keys at
// positions after the query's masked to 0 (a row that sees nothing is all zeros).
void window_attention_probs(cublasHandle_t handle, const uint16_t* q, const uint16_t* k,
                            const int32_t* q_positions, const int32_t* k_positions,
                            const WindowShape& shape, float scale, float* probs,
                            cudaStream_t stream);

// Column sums of probs over its group * window rows: scores [kv_heads][tokens] (one importance
// vector per KV head, summed over the group's heads and the window's queries).
void window_scores_sum(const float* probs, const WindowShape& shape, float* scores,
                       cudaStream_t stream);

}  // namespace kvsdk::cuda
