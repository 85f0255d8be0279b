// SpeCache on CUDA: rows selected on the device are fetched from pinned host memory on the copy
// stream and equal cpu::specache_fetch's rows (exact); the consumer stream sees them after
// join() without any host synchronisation in between.
#include "cuda_specache.h"

#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"
#include "cuda_topk.h"
#include "smallkv.h"
#include "specache.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

TEST(CudaSpeCache, FetchedRowsEqualTheCpuFetch) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t heads = 2, n = 500, dim = 64, k = 40;
  SpeCacheHostStore store(heads, n, dim);
  std::vector<cpu::SpeCacheBackingStore> cpu_store;
  for (size_t h = 0; h < heads; ++h) {
    const auto kf = test::random_floats(n * dim, uint32_t(h + 1));
    const auto vf = test::random_floats(n * dim, uint32_t(h + 11));
    cpu_store.emplace_back(dim);
    cpu_store[h].append(kf.data(), vf.data(), n);
    for (size_t t = 0; t < n; ++t) {  // the CPU store keeps rows in blocks, not contiguously
      std::memcpy(store.key_row(h, t), cpu_store[h].key_row(t), dim * 2);
      std::memcpy(store.value_row(h, t), cpu_store[h].value_row(t), dim * 2);
    }
  }
  // The speculative selection, computed on the device as in a decode step.
  const auto scores = test::random_floats(heads * n, 99);
  test::DeviceBuffer<float> dscores(scores);
  test::DeviceBuffer<uint32_t> dtok(heads * k);
  test::DeviceBuffer<uint16_t> out_k(heads * k * dim), out_v(heads * k * dim);
  cudaStream_t compute;
  KVSDK_CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  SpeCacheFetcher fetcher;
  topk_rows(dscores.get(), heads, n, k, dtok.get(), compute);
  fetcher.fetch_async(store, dtok.get(), k, out_k.get(), out_v.get(), compute);
  fetcher.join(compute);
  // A copy on the compute stream after join() must see the fetched rows.
  std::vector<uint16_t> got_k(heads * k * dim), got_v(heads * k * dim);
  KVSDK_CUDA_OK(cudaMemcpyAsync(got_k.data(), out_k.get(), got_k.size() * 2,
                                cudaMemcpyDeviceToHost, compute));
  KVSDK_CUDA_OK(cudaMemcpyAsync(got_v.data(), out_v.get(), got_v.size() * 2,
                                cudaMemcpyDeviceToHost, compute));
  KVSDK_CUDA_OK(cudaStreamSynchronize(compute));
  KVSDK_CUDA_OK(cudaStreamDestroy(compute));
  for (size_t h = 0; h < heads; ++h) {
    const auto sel = cpu::smallkv_topk(&scores[h * n], n, k);
    const cpu::SpeCacheFetched want = cpu::specache_fetch(cpu_store[h], sel);
    EXPECT_TRUE(std::equal(want.k.begin(), want.k.end(), got_k.begin() + h * k * dim)) << h;
    EXPECT_TRUE(std::equal(want.v.begin(), want.v.end(), got_v.begin() + h * k * dim)) << h;
  }
  EXPECT_EQ(store.bytes(), 2u * 2u * heads * n * dim);
}

}  // namespace
}  // namespace kvsdk::cuda
