// SmallKV's proxy softmax and marginal term on the device (cuda_smallkv.h): "SmallKV: Small
// Model Assisted Compensation of KV Cache Compression for Efficient LLM Inference", Eq. 6. Each
// step is the CPU reference's (backends/cpu/smallkv.cpp), in the same order of operations, so
// that the results are its bits; the file compiles with --fmad=false
// (backends/cuda/CMakeLists.txt).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "cuda_smallkv.h"
#include "kivi_device.cuh"
#include "portable_exp.h"
#include "util/error.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;  // a power of two: the max reduction halves it
constexpr size_t kMaxGridY = 65535;  // rows per scores launch (grid.y)

// One thread per (row, key): dot_f32's four partial sums over the key widened as the reference's
// f16_to_f32 widens it, left in out as f32 (the reference scales it in double afterwards). One
// thread per dot product because the partial sums are sequential chains; a masked key's slot is
// left for the normalisation to overwrite.
__global__ void scores_kernel(const float* q, const int32_t* q_pos, size_t r0, const uint16_t* k,
                              const int32_t* k_pos, size_t n, size_t dim, float* out) {
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t r = r0 + blockIdx.y;
  if (t >= n || k_pos[t] > q_pos[r]) return;
  const float* qr = q + r * dim;
  const uint16_t* kt = k + t * dim;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  size_t c = 0;
  for (; c + 4 <= dim; c += 4) {
    s0 = s0 + qr[c] * detail::f16_bits_to_f32(kt[c]);
    s1 = s1 + qr[c + 1] * detail::f16_bits_to_f32(kt[c + 1]);
    s2 = s2 + qr[c + 2] * detail::f16_bits_to_f32(kt[c + 2]);
    s3 = s3 + qr[c + 3] * detail::f16_bits_to_f32(kt[c + 3]);
  }
  for (; c < dim; ++c) s0 = s0 + qr[c] * detail::f16_bits_to_f32(kt[c]);
  out[r * n + t] = (s0 + s1) + (s2 + s3);
}

// One block per row: the reference's softmax_row over the dot products the scores kernel left
// in out, overwritten by the probabilities.
__global__ void normalize_kernel(const int32_t* q_pos, const int32_t* k_pos, size_t n,
                                 float scale, float* out) {
  __shared__ double s_red[kThreads];
  __shared__ double s_mx, s_z;
  const size_t r = blockIdx.x;
  const unsigned tid = threadIdx.x;
  const int32_t qp = q_pos[r];
  float* o = out + r * n;
  const double sc = scale;

  // The maximum score. The reference's std::max chain from -inf never takes a NaN (NaN compares
  // false), so it is the largest non-NaN score whatever the order; only the sign of a zero
  // maximum could depend on it, and s - (+0) and s - (-0) have the same exp (1 for s = +-0,
  // exactly s otherwise). So a tree of the same comparison gives the reference's exponentials.
  double m = -INFINITY;
  for (size_t t = tid; t < n; t += blockDim.x) {
    if (k_pos[t] > qp) continue;
    const double s = double(o[t]) * sc;
    m = m < s ? s : m;
  }
  s_red[tid] = m;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (tid < half) s_red[tid] = s_red[tid] < s_red[tid + half] ? s_red[tid + half] : s_red[tid];
    __syncthreads();
  }
  if (tid == 0) s_mx = s_red[0];
  __syncthreads();
  const double mx = s_mx;
  if (mx == -INFINITY) {  // no key seen (or only -inf / NaN scores): all 0, as the reference
    for (size_t t = tid; t < n; t += blockDim.x) o[t] = 0.0f;
    return;
  }

  // The normaliser: the exponentials of a block of keys at once, added in token order by one
  // thread (the reference's sum is one chain in double; masked keys add their 0.0 as there).
  double z = 0.0;
  for (size_t base = 0; base < n; base += blockDim.x) {
    const size_t t = base + tid;
    s_red[tid] = t < n && k_pos[t] <= qp
                     ? cpu::pmath::detail::exp_body(double(o[t]) * sc - mx)
                     : 0.0;
    __syncthreads();
    if (tid == 0) {
      const size_t count = n - base < blockDim.x ? n - base : size_t(blockDim.x);
      for (size_t i = 0; i < count; ++i) z += s_red[i];
    }
    __syncthreads();
  }
  if (tid == 0) s_z = z;
  __syncthreads();
  z = s_z;

  // Each probability: its exponential (computed again, the same bits) over the sum, in double,
  // rounded to f32; a masked key's 0.0 / z as the reference divides every slot.
  for (size_t t = tid; t < n; t += blockDim.x) {
    const double e =
        k_pos[t] <= qp ? cpu::pmath::detail::exp_body(double(o[t]) * sc - mx) : 0.0;
    o[t] = float(e / z);
  }
}

// One block per query row: the proxy's mass on the marginal rows the row sees (one thread, in
// token order, in double), then each element of the row by a thread: scaled by the kept mass and
// the weighted values added token after token in f32, as cpu::smallkv_add_marginal's loops do.
__global__ void add_marginal_kernel(const int32_t* q_pos, size_t dim, const uint16_t* v,
                                    const int32_t* v_pos, size_t n_marginal, const float* weights,
                                    size_t weights_stride, float* out) {
  __shared__ float s_keep;
  const size_t r = blockIdx.x;
  const int32_t qp = q_pos[r];
  const float* w = weights + r * weights_stride;
  if (threadIdx.x == 0) {
    double mass = 0.0;
    for (size_t j = 0; j < n_marginal; ++j) {
      if (v_pos[j] <= qp) mass += w[j];
    }
    const double left = 1.0 - mass;
    s_keep = float(0.0 < left ? left : 0.0);  // std::max(0.0, 1 - M): a NaN mass keeps 0
  }
  __syncthreads();
  const float keep = s_keep;
  float* o = out + r * dim;
  for (size_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = o[d] * keep;
    for (size_t j = 0; j < n_marginal; ++j) {
      if (v_pos[j] > qp) continue;
      acc = acc + w[j] * detail::f16_bits_to_f32(v[j * dim + d]);
    }
    o[d] = acc;
  }
}

}  // namespace

void smallkv_softmax(const float* q, const int32_t* q_pos, size_t rows, const uint16_t* k,
                     const int32_t* k_pos, size_t n, size_t dim, float scale, float* out,
                     cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  KVSDK_REQUIRE(dim > 0, "smallkv softmax: head_dim 0");
  KVSDK_REQUIRE(q && q_pos && k && k_pos && out,
                "smallkv softmax: a null query, position, key or output buffer");
  KVSDK_REQUIRE(rows <= size_t(INT32_MAX), "smallkv softmax: ", rows,
                " query rows exceed the grid");
  const unsigned key_blocks = blocks_for(n, kThreads);
  for (size_t r0 = 0; r0 < rows; r0 += kMaxGridY) {
    const dim3 grid(key_blocks, unsigned(std::min(kMaxGridY, rows - r0)));
    KVSDK_LAUNCH(scores_kernel, grid, kThreads, 0, stream, q, q_pos, r0, k, k_pos, n, dim, out);
    check_launch("smallkv scores_kernel");
  }
  KVSDK_LAUNCH(normalize_kernel, unsigned(rows), kThreads, 0, stream, q_pos, k_pos, n, scale,
               out);
  check_launch("smallkv normalize_kernel");
}

void smallkv_add_marginal(const int32_t* q_pos, size_t rows, size_t dim, const uint16_t* v,
                          const int32_t* v_pos, size_t n_marginal, const float* weights,
                          size_t weights_stride, float* out, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  KVSDK_REQUIRE(q_pos && out, "smallkv marginal: a null query position or output buffer");
  KVSDK_REQUIRE(n_marginal == 0 || (v && v_pos && weights),
                "smallkv marginal: ", n_marginal, " marginal rows without values, positions or "
                "weights");
  KVSDK_REQUIRE(rows == 1 || n_marginal == 0 || weights_stride >= n_marginal,
                "smallkv marginal: weights stride ", weights_stride, " < ", n_marginal,
                " marginal rows");
  KVSDK_REQUIRE(rows <= size_t(INT32_MAX), "smallkv marginal: ", rows,
                " query rows exceed the grid");
  // A block of at most kThreads threads over the row's elements (64-256 for the head_dims kvsdk
  // attends: one element each).
  const unsigned threads = unsigned(std::min<size_t>(kThreads, (dim + 31) / 32 * 32));
  KVSDK_LAUNCH(add_marginal_kernel, unsigned(rows), threads, 0, stream, q_pos, dim, v, v_pos,
               n_marginal, weights, weights_stride, out);
  check_launch("smallkv add_marginal_kernel");
}

}  // namespace kvsdk::cuda
