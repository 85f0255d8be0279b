#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "cuda_topk.h"

namespace kvsdk::cuda {

namespace {

constexpr int kThreads = 256;

// Monotone map float -> uint32 (larger float, larger key); -0 is folded onto +0 first so that the
// keys compare like the floats do.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void topk_kernel(const float* scores, size_t n, uint32_t k, uint32_t* indices) {
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ uint32_t s_count, s_base, s_eq_base;
  const float* x = scores + size_t(blockIdx.x) * n;
  uint32_t* out = indices + size_t(blockIdx.x) * k;

  // Largest T with count(key >= T) >= k, built bit by bit from the top: the k-th largest key.
  uint32_t threshold = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = threshold | (1u << bit);
    uint32_t c = 0;
    for (size_t t = threadIdx.x; t < n; t += kThreads) c += order_key(x[t]) >= cand;
    const uint32_t total = Reduce(tmp.reduce).Sum(c);
    if (threadIdx.x == 0) s_count = total;
    __syncthreads();
    if (s_count >= k) threshold = cand;
    __syncthreads();
  }
  uint32_t above = 0;
  for (size_t t = threadIdx.x; t < n; t += kThreads) above += order_key(x[t]) > threshold;
  const uint32_t total_above = Reduce(tmp.reduce).Sum(above);
  if (threadIdx.x == 0) {
    s_count = k - total_above;  // keys equal to the threshold to keep, lowest indices first
    s_base = 0;
    s_eq_base = 0;
  }
  __syncthreads();
  const uint32_t need_eq = s_count;

  // Ordered compaction, one tile of kThreads tokens at a time.
  for (size_t tile = 0; tile < n; tile += kThreads) {
    const size_t t = tile + threadIdx.x;
    const uint32_t key = t < n ? order_key(x[t]) : 0;
    const uint32_t is_eq = (t < n && key == threshold) ? 1u : 0u;
    uint32_t eq_rank, eq_total;
    Scan(tmp.scan).ExclusiveSum(is_eq, eq_rank, eq_total);
    __syncthreads();
    const uint32_t keep =
        (t < n && (key > threshold || (is_eq && s_eq_base + eq_rank < need_eq))) ? 1u : 0u;
    uint32_t pos, kept;
    Scan(tmp.scan).ExclusiveSum(keep, pos, kept);
    if (keep) out[s_base + pos] = uint32_t(t);
    __syncthreads();
    if (threadIdx.x == 0) {
      s_base += kept;
      s_eq_base += eq_total;
    }
    __syncthreads();
  }
}

}  // namespace

void topk_rows(const float* scores, size_t rows, size_t n, size_t k, uint32_t* indices,
               cudaStream_t stream) {
  KVSDK_REQUIRE(k <= n, "topk_rows: k ", k, " exceeds the row length ", n);
  KVSDK_REQUIRE(n < (size_t(1) << 32), "topk_rows: rows of 2^32 or more scores are not supported");
  if (rows == 0 || k == 0) return;
  KVSDK_LAUNCH(topk_kernel, unsigned(rows), kThreads, 0, stream, scores, n, uint32_t(k), indices);
  check_launch("topk_kernel");
}

}  // namespace kvsdk::cuda
