// Per-row top-k vs cpu::smallkv_topk (exact: same indices, same order, ties to the lower index).
#include "cuda_topk.h"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "smallkv.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

void check(const std::vector<float>& scores, size_t rows, size_t n, size_t k) {
  test::DeviceBuffer<float> ds(scores);
  test::DeviceBuffer<uint32_t> didx(std::max<size_t>(rows * k, 1));
  topk_rows(ds.get(), rows, n, k, didx.get(), nullptr);
  const auto idx = didx.download();
  for (size_t r = 0; r < rows; ++r) {
    const std::vector<uint32_t> want = cpu::smallkv_topk(&scores[r * n], n, k);
    const std::vector<uint32_t> got(idx.begin() + r * k, idx.begin() + (r + 1) * k);
    EXPECT_EQ(got, want) << "row " << r << " n " << n << " k " << k;
  }
}

TEST(CudaTopk, MatchesCpuIncludingTies) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t rows = 3, n = 5000;
  auto x = test::random_floats(rows * n, 9);
  check(x, rows, n, 1);
  check(x, rows, n, 100);
  check(x, rows, n, n);
  for (float& v : x) v = std::round(v * 2.0f) / 2.0f;  // heavy ties
  x[0] = -0.0f;
  x[1] = 0.0f;
  check(x, rows, n, 37);
  check(x, rows, n, 2500);
  std::vector<float> same(2 * 300, 1.5f);  // all equal: the first k indices
  check(same, 2, 300, 17);
  std::vector<float> neg = test::random_floats(700, 3);
  for (float& v : neg) v = -std::fabs(v) - 1.0f;
  check(neg, 1, 700, 50);
}

TEST(CudaTopkArgs, KAboveNIsInvalid) {
  try {
    topk_rows(nullptr, 1, 10, 11, nullptr, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG);
  }
}

}  // namespace
}  // namespace kvsdk::cuda
