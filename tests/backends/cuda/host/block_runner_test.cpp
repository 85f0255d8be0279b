// The host execution shim itself (backends/cuda/host): threads see their own indices, a barrier
// makes every thread's shared-memory writes visible to all, warp shuffles exchange lanes' values,
// __syncthreads_or reduces, and misuse a GPU would not survive (threads waiting at different
// barriers, invalid launch configurations) is reported through cudaGetLastError.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cuda_launch.h"
#include "../cuda_test_util.h"

namespace {

using kvsdk::cuda::test::DeviceBuffer;

__global__ void write_ids(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * blockDim.x * blockDim.y * blockDim.z + t] = block * 1000 + t;
}

// Each thread writes its slot, then (after the barrier) reads its mirror image's slot: correct
// only if the barrier waited for every thread.
__global__ void reverse_through_shared(const int* in, int* out) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * 256 + t];
  __syncthreads();
  out[blockIdx.x * 256 + t] = s[255 - t];
}

__global__ void warp_sums(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

__global__ void any_negative(const int* in, int* out) {
  out[threadIdx.x] = __syncthreads_or(in[threadIdx.x] < 0);
}

// Thread 0 waits at a block barrier that the others never reach: a hang on a GPU.
__global__ void divergent_barrier(int* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
    out[0] = 1;
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
  }
}

TEST(CudaHostShim, EveryThreadOfEveryBlockRunsWithItsIndices) {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  DeviceBuffer<unsigned> d(12 * 24);
  KVSDK_LAUNCH(write_ids, grid, block, 0, nullptr, d.get());
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  const std::vector<unsigned> h = d.download();
  for (unsigned b = 0; b < 12; ++b) {
    for (unsigned t = 0; t < 24; ++t) EXPECT_EQ(h[b * 24 + t], b * 1000 + t);
  }
}

TEST(CudaHostShim, SyncthreadsMakesSharedWritesVisible) {
  std::vector<int> in(2 * 256);
  std::iota(in.begin(), in.end(), 0);
  DeviceBuffer<int> din(in), dout(in.size());
  KVSDK_LAUNCH(reverse_through_shared, 2, 256, 0, nullptr, din.get(), dout.get());
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  const std::vector<int> out = dout.download();
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 256; ++t) EXPECT_EQ(out[b * 256 + t], b * 256 + 255 - t);
  }
}

TEST(CudaHostShim, ShuffleXorReducesEachWarp) {
  std::vector<float> in(64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i);
  DeviceBuffer<float> din(in), dout(64);
  KVSDK_LAUNCH(warp_sums, 1, 64, 0, nullptr, din.get(), dout.get());
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  const std::vector<float> out = dout.download();
  for (int t = 0; t < 32; ++t) EXPECT_EQ(out[t], 496.0f);    // 0 + ... + 31
  for (int t = 32; t < 64; ++t) EXPECT_EQ(out[t], 1520.0f);  // 32 + ... + 63
}

TEST(CudaHostShim, SyncthreadsOrSeesEveryThread) {
  for (int negative_at : {-1, 0, 77}) {
    std::vector<int> in(96, 1);
    if (negative_at >= 0) in[size_t(negative_at)] = -1;
    DeviceBuffer<int> din(in), dout(96);
    KVSDK_LAUNCH(any_negative, 1, 96, 0, nullptr, din.get(), dout.get());
    for (int x : dout.download()) EXPECT_EQ(x, negative_at >= 0 ? 1 : 0);
  }
}

TEST(CudaHostShim, BarrierDivergenceIsALaunchFailure) {
  DeviceBuffer<int> d(32);
  KVSDK_LAUNCH(divergent_barrier, 1, 32, 0, nullptr, d.get());
  EXPECT_EQ(cudaErrorLaunchFailure, cudaGetLastError());
  EXPECT_EQ(cudaSuccess, cudaGetLastError());  // read once, as on a GPU
  // The shim stays usable after a failed launch.
  DeviceBuffer<float> din(std::vector<float>(32, 1.0f)), dout(32);
  KVSDK_LAUNCH(warp_sums, 1, 32, 0, nullptr, din.get(), dout.get());
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  EXPECT_EQ(dout.download()[0], 32.0f);
}

TEST(CudaHostShim, InvalidConfigurationsAreRefusedWithoutRunning) {
  DeviceBuffer<unsigned> d(4096);
  KVSDK_LAUNCH(write_ids, 1, 1025, 0, nullptr, d.get());
  EXPECT_EQ(cudaErrorInvalidConfiguration, cudaGetLastError());
  KVSDK_LAUNCH(write_ids, 0, 32, 0, nullptr, d.get());
  EXPECT_EQ(cudaErrorInvalidConfiguration, cudaGetLastError());
}

// Under AddressSanitizer a kernel's access past its buffer is reported (what the shim adds over a
// GPU, where it may silently read a neighbour). Without ASan there is nothing to observe.
__global__ void write_one_past(int* out, unsigned n) { out[n + threadIdx.x] = 1; }

TEST(CudaHostShim, OutOfBoundsKernelAccessIsCaughtUnderAsan) {
#if defined(__SANITIZE_ADDRESS__)
  DeviceBuffer<int> d(100);
  EXPECT_DEATH(KVSDK_LAUNCH(write_one_past, 1, 32, 0, nullptr, d.get(), 100u),
               "heap-buffer-overflow");
#else
  GTEST_SKIP() << "needs AddressSanitizer (the asan preset runs it)";
#endif
}

TEST(CudaHostShim, MemGetInfoCountsEveryAllocation) {
  size_t free0 = 0, total = 0, free1 = 0;
  ASSERT_EQ(cudaSuccess, cudaMemGetInfo(&free0, &total));
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&p, 1000));
  ASSERT_EQ(cudaSuccess, cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0 - free1, 1024u);  // 256-byte granules, as cudaMalloc aligns
  EXPECT_EQ(cudaSuccess, cudaFree(p));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(p));  // double free is an error, not a crash
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&p, total + 1));
}

}  // namespace
