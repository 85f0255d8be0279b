// 1-D max/avg pooling vs a host loop (same summation order: tolerance exact).
#include "cuda_pooling.h"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

std::vector<float> host_pool(const std::vector<float>& x, size_t rows, size_t n, size_t width,
                             bool is_max) {
  std::vector<float> out(x.size());
  const size_t half = width / 2;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t = 0; t < n; ++t) {
      const size_t lo = t >= half ? t - half : 0, hi = std::min(n - 1, t + half);
      float acc = x[r * n + lo];
      for (size_t j = lo + 1; j <= hi; ++j) {
        acc = is_max ? std::max(acc, x[r * n + j]) : acc + x[r * n + j];
      }
      out[r * n + t] = is_max ? acc : acc / float(hi - lo + 1);
    }
  }
  return out;
}

TEST(CudaPooling, MaxAndAvgMatchHost) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t rows = 3, n = 1000;
  const auto x = test::random_floats(rows * n, 5);
  test::DeviceBuffer<float> din(x), dout(x.size());
  for (size_t width : {1u, 3u, 7u, 2001u}) {
    pool1d(din.get(), rows, n, width, PoolKind::kMax, dout.get(), nullptr);
    EXPECT_EQ(dout.download(), host_pool(x, rows, n, width, true)) << "max " << width;
    pool1d(din.get(), rows, n, width, PoolKind::kAvg, dout.get(), nullptr);
    EXPECT_EQ(dout.download(), host_pool(x, rows, n, width, false)) << "avg " << width;
  }
}

TEST(CudaPoolingArgs, EvenWidthIsInvalid) {
  try {
    pool1d(nullptr, 1, 1, 4, PoolKind::kMax, nullptr, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG);
  }
}

}  // namespace
}  // namespace kvsdk::cuda
