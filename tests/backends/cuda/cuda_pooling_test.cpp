// 1-D max/avg pooling vs the CPU reference backend's pool (same summation order: exact). The average
// divides by the kernel width at the clipped ends too (zero padding), as the CPU does.
#include "cuda_pooling.h"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "backend_ops.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

// The CPU reference backend's pooling (what SnapKV's planner runs), row by row.
std::vector<float> cpu_pool(const std::vector<float>& x, size_t rows, size_t n, size_t width,
                            bool is_max) {
  std::vector<float> out(x.size());
  for (size_t r = 0; r < rows; ++r) {
    backend::cpu_reference().pool(x.data() + r * n, n, int(width),
                                  is_max ? KVSDK_POOL_MAX : KVSDK_POOL_AVG, out.data() + r * n);
  }
  return out;
}

TEST(CudaPooling, MaxAndAvgMatchTheCpuPooling) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t rows = 3, n = 1000;
  const auto x = test::random_floats(rows * n, 5);
  test::DeviceBuffer<float> din(x), dout(x.size());
  for (size_t width : {1u, 3u, 7u, 2001u}) {
    pool1d(din.get(), rows, n, width, PoolKind::kMax, dout.get(), nullptr);
    EXPECT_EQ(dout.download(), cpu_pool(x, rows, n, width, true)) << "max " << width;
    pool1d(din.get(), rows, n, width, PoolKind::kAvg, dout.get(), nullptr);
    EXPECT_EQ(dout.download(), cpu_pool(x, rows, n, width, false)) << "avg " << width;
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
