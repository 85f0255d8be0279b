// Gather / compaction after eviction vs the CPU reference backend's gather_rows (exact), for
// 16-byte, 4-byte and odd rows.
#include "cuda_gather.h"

#include <gtest/gtest.h>

#include <cstring>

#include "backend_ops.h"
#include "cuda_test_util.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

TEST(CudaGather, KeptRowsMoveToTheFrontInIndexOrder) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t heads = 3, src_rows = 50, k = 20, dst_rows = 24;
  for (size_t row_bytes : {256u, 12u, 6u, 1u}) {
    std::vector<uint8_t> src(heads * src_rows * row_bytes);
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
    std::vector<uint32_t> idx(heads * k);
    for (size_t h = 0; h < heads; ++h) {
      for (size_t i = 0; i < k; ++i) idx[h * k + i] = uint32_t(i * 2 + h);  // ascending, < 50
    }
    test::DeviceBuffer<uint8_t> dsrc(src), ddst(heads * dst_rows * row_bytes);
    test::DeviceBuffer<uint32_t> didx(idx);
    gather_rows(dsrc.get(), src_rows, didx.get(), heads, k, row_bytes, ddst.get(), dst_rows,
                nullptr);
    const auto dst = ddst.download();
    std::vector<uint8_t> want(k * row_bytes);
    for (size_t h = 0; h < heads; ++h) {
      backend::cpu_reference().gather_rows(&src[h * src_rows * row_bytes], row_bytes, &idx[h * k],
                                           k, want.data());
      ASSERT_EQ(0, std::memcmp(&dst[h * dst_rows * row_bytes], want.data(), k * row_bytes))
          << "row_bytes " << row_bytes << " head " << h;
    }
  }
}

TEST(CudaGatherArgs, DestinationTooSmallIsInvalid) {
  try {
    gather_rows(nullptr, 10, nullptr, 1, 5, 4, nullptr, 4, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG);
  }
}

}  // namespace
}  // namespace kvsdk::cuda
