#include "cuda_check.h"
#include "cuda_convert.h"
#include "cuda_launch.h"
#include "kivi_device.cuh"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

__global__ void f16_to_f32_kernel(const uint16_t* src, size_t n, float* dst) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = detail::f16_bits_to_f32(src[i]);
}

}  // namespace

void f16_to_f32(const uint16_t* src, size_t n, float* dst, cudaStream_t stream) {
  if (n == 0) return;
  KVSDK_LAUNCH(f16_to_f32_kernel, blocks_for(n, kThreads), kThreads, 0, stream, src, n, dst);
  check_launch("f16_to_f32_kernel");
}

}  // namespace kvsdk::cuda
