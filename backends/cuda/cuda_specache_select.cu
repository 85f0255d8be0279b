// SpeCache's selection on the device (cuda_specache_select.h): the reference's order of
// operations, step for step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "cuda_specache_select.h"
#include "cuda_topk.h"
#include "portable_exp.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

// The largest score of a row as std::max_element finds it (the first of the largest: `<`).
__device__ float row_max(const float* s, size_t n) {
  if (n == 0) return -INFINITY;
  float best = s[0];
  for (size_t t = 1; t < n; ++t) {
    if (best < s[t]) best = s[t];
  }
  return best;
}

// One thread per row: its maximum.
__global__ void max_kernel(const float* scores, size_t group, size_t n, float* mx) {
  const size_t h = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h < group) mx[h] = row_max(scores + h * n, n);
}

// One thread per score: exp(s - max) in place (a row that sees nothing stays as it is: unused).
__global__ void exp_kernel(float* scores, size_t group, size_t n, const float* mx) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= group * n) return;
  const float m = mx[i / n];
  if (m != -INFINITY) scores[i] = cpu::pmath::detail::exp_f32_body(scores[i] - m);
}

// One thread per row: the sum of its exponentials in token order, in double.
__global__ void sum_kernel(const float* e, size_t group, size_t n, const float* mx, double* z) {
  const size_t h = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= group) return;
  double sum = 0;
  if (mx[h] != -INFINITY) {
    for (size_t t = 0; t < n; ++t) sum += e[h * n + t];
  }
  z[h] = sum;
}

// One thread per token: the rows' probabilities averaged, added row after row.
__global__ void average_kernel(const float* e, size_t group, size_t n, const float* mx,
                               const double* z, float* avg) {
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float a = 0.0f;
  for (size_t h = 0; h < group; ++h) {
    if (mx[h] != -INFINITY) a += float(double(e[h * n + t]) / z[h] / double(group));
  }
  avg[t] = a;
}

// One thread per row: its softmax's share on the tokens.
__global__ void shares_kernel(const float* scores, size_t rows, size_t n, const uint32_t* tokens,
                              size_t n_tokens, float* shares) {
  const size_t r = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* s = scores + r * n;
  const float m = row_max(s, n);
  if (m == -INFINITY) {
    shares[r] = 0.0f;
    return;
  }
  double z = 0, f = 0;
  for (size_t t = 0; t < n; ++t) z += cpu::pmath::detail::exp_f32_body(s[t] - m);
  for (size_t i = 0; i < n_tokens; ++i) f += cpu::pmath::detail::exp_f32_body(s[tokens[i]] - m);
  shares[r] = float(f / z);
}

unsigned blocks_for(size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

size_t specache_select_work_bytes(size_t group) {
  const size_t z = group * sizeof(double), mx = group * sizeof(float);
  return (z + mx + 15) / 16 * 16;
}

void specache_select_tokens(float* scores, size_t group, size_t n, size_t k, void* work,
                            float* avg, uint32_t* tokens, cudaStream_t stream) {
  if (n == 0 || group == 0) return;
  double* z = static_cast<double*>(work);
  float* mx = reinterpret_cast<float*>(z + group);
  KVSDK_LAUNCH(max_kernel, blocks_for(group), kThreads, 0, stream, scores, group, n, mx);
  check_launch("specache max_kernel");
  KVSDK_LAUNCH(exp_kernel, blocks_for(group * n), kThreads, 0, stream, scores, group, n, mx);
  check_launch("specache exp_kernel");
  KVSDK_LAUNCH(sum_kernel, blocks_for(group), kThreads, 0, stream, scores, group, n, mx, z);
  check_launch("specache sum_kernel");
  KVSDK_LAUNCH(average_kernel, blocks_for(n), kThreads, 0, stream, scores, group, n, mx, z, avg);
  check_launch("specache average_kernel");
  const size_t kept = std::min(k, n);
  if (kept > 0) topk_rows(avg, 1, n, kept, tokens, stream);
}

void specache_fetched_shares(const float* scores, size_t rows, size_t n, const uint32_t* tokens,
                             size_t n_tokens, float* shares, cudaStream_t stream) {
  if (rows == 0) return;
  KVSDK_LAUNCH(shares_kernel, blocks_for(rows), kThreads, 0, stream, scores, rows, n, tokens,
               n_tokens, shares);
  check_launch("specache shares_kernel");
}

}  // namespace kvsdk::cuda
