#include <cuda_fp16.h>

#include "cuda_check.h"
#include "cuda_codebook.h"
#include "cuda_launch.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

__global__ void codebook_kernel(const uint16_t* entries, const uint32_t* index,
                                const float* magnitude, size_t n, size_t dim, float* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  const size_t r = i / dim, c = i % dim;
  const float e = __half2float(__ushort_as_half(entries[size_t(index[r]) * dim + c]));
  out[i] = __fmul_rn(e, magnitude[r]);
}

}  // namespace

void codebook_reconstruct(const uint16_t* entries, const uint32_t* index, const float* magnitude,
                          size_t n, size_t dim, float* out, cudaStream_t stream) {
  KVSDK_REQUIRE(dim > 0, "codebook_reconstruct: dim must be > 0");
  if (n == 0) return;
  KVSDK_LAUNCH(codebook_kernel, blocks_for(n * dim, kThreads), kThreads, 0, stream, entries, index,
               magnitude, n, dim, out);
  check_launch("codebook_kernel");
}

}  // namespace kvsdk::cuda
