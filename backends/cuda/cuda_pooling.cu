#include "cuda_check.h"
#include "cuda_launch.h"
#include "cuda_pooling.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

// One thread per output; neighbouring threads share their inputs through L1.
__global__ void pool_kernel(const float* in, size_t rows, size_t n, size_t half, bool is_max,
                            float* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const size_t row = i / n, t = i % n;
  const size_t lo = t >= half ? t - half : 0, hi = min(n - 1, t + half);
  const float* x = in + row * n;
  float acc = x[lo];
  for (size_t j = lo + 1; j <= hi; ++j) acc = is_max ? fmaxf(acc, x[j]) : acc + x[j];
  // The average counts the zero padding past either end, like the CPU's policy::pool_scores
  // (SnapKV's padded average pool): the divisor is the kernel width, not the clipped window.
  out[i] = is_max ? acc : acc / float(2 * half + 1);
}

}  // namespace

void pool1d(const float* in, size_t rows, size_t n, size_t width, PoolKind kind, float* out,
            cudaStream_t stream) {
  KVSDK_REQUIRE(width % 2 == 1, "pool1d: width ", width, " must be odd (centred windows)");
  if (rows == 0 || n == 0) return;
  KVSDK_LAUNCH(pool_kernel, blocks_for(rows * n, kThreads), kThreads, 0, stream, in, rows, n,
               width / 2, kind == PoolKind::kMax, out);
  check_launch("pool_kernel");
}

}  // namespace kvsdk::cuda
