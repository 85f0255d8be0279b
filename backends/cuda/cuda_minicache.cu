#include <cuda_fp16.h>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "cuda_minicache.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;  // 8 warps, one token per warp

__device__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void merge_kernel(const float* prev, const float* cur, size_t n, size_t dim, float t,
                             uint16_t* direction, float* mag_prev, float* mag_cur,
                             float* distance) {
  const size_t token = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (token >= n) return;  // whole warps exit together
  const float* a = prev + token * dim;
  const float* b = cur + token * dim;
  double aa = 0, bb = 0, ab = 0;
  for (size_t i = lane; i < dim; i += 32) {
    aa += double(a[i]) * double(a[i]);
    bb += double(b[i]) * double(b[i]);
    ab += double(a[i]) * double(b[i]);
  }
  const double na = sqrt(warp_sum(aa)), nb = sqrt(warp_sum(bb)), dot = warp_sum(ab);
  uint16_t* e = direction + token * dim;
  if (!(na > 0.0) || !(nb > 0.0)) {  // no direction to share: the caller retains this token
    for (size_t i = lane; i < dim; i += 32) e[i] = 0;
    if (lane == 0) {
      mag_prev[token] = 0.0f;
      mag_cur[token] = 0.0f;
      distance[token] = 1.0f;
    }
    return;
  }
  const double c = fmin(1.0, fmax(-1.0, dot / (na * nb)));
  const double omega = acos(c);
  const double s = sin(omega);
  double wa, wb;
  if (s < 1e-6) {  // (anti)parallel: linear interpolation, as on the CPU
    wa = 1.0 - t;
    wb = t;
  } else {
    wa = sin((1.0 - t) * omega) / s;
    wb = sin(t * omega) / s;
  }
  double en = 0;
  for (size_t i = lane; i < dim; i += 32) {
    const float v = float(wa * a[i] / na + wb * b[i] / nb);
    const __half h = __float2half_rn(v);
    e[i] = __half_as_ushort(h);
    const double r = __half2float(h);
    en += r * r;
  }
  en = sqrt(warp_sum(en));
  if (lane == 0) {
    mag_prev[token] = en > 0 ? float(na / en) : 0.0f;
    mag_cur[token] = en > 0 ? float(nb / en) : 0.0f;
    distance[token] = float(omega / 3.14159265358979323846);
  }
}

__global__ void restore_kernel(const uint32_t* slot, const uint16_t* direction, const float* mag,
                               const uint16_t* retained, size_t n, size_t dim, float* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  const size_t token = i / dim, c = i % dim;
  const uint32_t s = slot[token];
  if (s & kMiniCacheRetained) {
    out[i] = __half2float(__ushort_as_half(retained[size_t(s & ~kMiniCacheRetained) * dim + c]));
  } else {
    out[i] = __fmul_rn(__half2float(__ushort_as_half(direction[size_t(s) * dim + c])), mag[s]);
  }
}

}  // namespace

void minicache_merge(const float* prev, const float* cur, size_t n, size_t dim, float t,
                     uint16_t* direction, float* mag_prev, float* mag_cur, float* distance,
                     cudaStream_t stream) {
  KVSDK_REQUIRE(dim > 0, "minicache_merge: dim must be > 0");
  KVSDK_REQUIRE(t >= 0.0f && t <= 1.0f, "minicache_merge: t ", t, " must lie in [0, 1]");
  if (n == 0) return;
  KVSDK_LAUNCH(merge_kernel, blocks_for(n * 32, kThreads), kThreads, 0, stream, prev, cur, n, dim,
               t, direction, mag_prev, mag_cur, distance);
  check_launch("merge_kernel");
}

void minicache_restore(const uint32_t* slot, const uint16_t* direction, const float* mag,
                       const uint16_t* retained, size_t n, size_t dim, float* out,
                       cudaStream_t stream) {
  KVSDK_REQUIRE(dim > 0, "minicache_restore: dim must be > 0");
  if (n == 0) return;
  KVSDK_LAUNCH(restore_kernel, blocks_for(n * dim, kThreads), kThreads, 0, stream, slot, direction,
               mag, retained, n, dim, out);
  check_launch("restore_kernel");
}

}  // namespace kvsdk::cuda
