#include <cuda_fp16.h>

#include <cfloat>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "cuda_window_scoring.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

__device__ float block_reduce(float v, bool is_max, float* smem) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const unsigned n_warps = blockDim.x / 32;
  float r = smem[0];
  for (unsigned w = 1; w < n_warps; ++w) r = is_max ? fmaxf(r, smem[w]) : r + smem[w];
  __syncthreads();
  return r;
}

// One block per row of one KV head: scale, causal mask, softmax in place.
__global__ void masked_softmax_kernel(float* probs, const int32_t* q_positions,
                                      const int32_t* k_positions, size_t window, size_t rows,
                                      size_t tokens, size_t key_stride, float scale) {
  __shared__ float smem[32];
  const size_t head = blockIdx.x / rows, row = blockIdx.x % rows;
  float* p = probs + (head * rows + row) * tokens;
  const int32_t limit = q_positions[row % window];
  const int32_t* kpos = k_positions + head * key_stride;
  float mx = -FLT_MAX;
  bool any = false;
  for (size_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    if (kpos[t] <= limit) {
      mx = fmaxf(mx, p[t] * scale);
      any = true;
    }
  }
  mx = block_reduce(mx, true, smem);
  const bool row_any = __syncthreads_or(any);
  float sum = 0.0f;
  for (size_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    const float e = (row_any && kpos[t] <= limit) ? expf(p[t] * scale - mx) : 0.0f;
    p[t] = e;
    sum += e;
  }
  sum = block_reduce(sum, false, smem);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (size_t t = threadIdx.x; t < tokens; t += blockDim.x) p[t] *= inv;
}

__global__ void column_sum_kernel(const float* probs, size_t kv_heads, size_t rows, size_t tokens,
                                  float* scores) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kv_heads * tokens) return;
  const size_t head = i / tokens, t = i % tokens;
  const float* p = probs + head * rows * tokens + t;
  float s = 0.0f;
  for (size_t r = 0; r < rows; ++r) s += p[r * tokens];
  scores[i] = s;
}

void check_shape(const WindowShape& s, const char* what) {
  KVSDK_REQUIRE(s.kv_heads > 0 && s.group > 0 && s.window > 0 && s.tokens > 0 && s.dim > 0, what,
                ": every dimension of the window shape must be > 0");
  KVSDK_REQUIRE(s.key_stride >= s.tokens, what, ": key_stride ", s.key_stride, " < tokens ",
                s.tokens);
}

}  // namespace

void window_attention_probs(cublasHandle_t handle, const uint16_t* q, const uint16_t* k,
                            const int32_t* q_positions, const int32_t* k_positions,
                            const WindowShape& s, float scale, float* probs,
                            cudaStream_t stream) {
  check_shape(s, "window_attention_probs");
  const size_t rows = s.group * s.window;
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  // Column-major view: C (tokens x rows) = Kᵀ(tokens x dim) · Q(dim x rows), which is the
  // row-major [rows][tokens] score matrix the softmax kernel expects.
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasGemmStridedBatchedEx(
                   handle, CUBLAS_OP_T, CUBLAS_OP_N, int(s.tokens), int(rows), int(s.dim), &one,
                   k, CUDA_R_16F, int(s.dim), (long long)(s.key_stride * s.dim), q, CUDA_R_16F,
                   int(s.dim), (long long)(rows * s.dim), &zero, probs, CUDA_R_32F,
                   int(s.tokens), (long long)(rows * s.tokens), int(s.kv_heads),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx (window scores)");
  KVSDK_LAUNCH(masked_softmax_kernel, unsigned(s.kv_heads * rows), kThreads, 0, stream, probs,
               q_positions, k_positions, s.window, rows, s.tokens, s.key_stride, scale);
  check_launch("masked_softmax_kernel");
}

void window_scores_sum(const float* probs, const WindowShape& s, float* scores,
                       cudaStream_t stream) {
  check_shape(s, "window_scores_sum");
  KVSDK_LAUNCH(column_sum_kernel, blocks_for(s.kv_heads * s.tokens, kThreads), kThreads, 0, stream,
               probs, s.kv_heads, s.group * s.window, s.tokens, scores);
  check_launch("column_sum_kernel");
}

}  // namespace kvsdk::cuda
