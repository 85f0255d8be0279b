// SpindleKV codebook gather vs cpu::SpindleCodebook::reconstruct (bit-identical).
#include "cuda_codebook.h"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "spindlekv_codebook.h"

namespace kvsdk::cuda {
namespace {

TEST(CudaCodebook, ReconstructionMatchesCpuBitForBit) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t dim = 64, n = 300;
  // Rows clustered around a few directions so the codebook has shared entries.
  const auto base = test::random_floats(5 * dim, 1);
  const auto noise = test::random_floats(n * dim, 2, 0.05f);
  std::vector<float> rows(n * dim);
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = 0; c < dim; ++c) {
      rows[r * dim + c] = base[(r % 5) * dim + c] * float(1 + r % 3) + noise[r * dim + c];
    }
  }
  cpu::SpindleCodebook book(dim, cpu::kSpindleThetaV);
  book.append(rows.data(), n);
  ASSERT_LT(book.entries(), n);
  std::vector<float> want(n * dim);
  book.reconstruct(0, n, want.data());
  test::DeviceBuffer<uint16_t> de(book.entry_data());
  test::DeviceBuffer<uint32_t> di(book.index());
  test::DeviceBuffer<float> dm(book.magnitude()), dout(n * dim);
  codebook_reconstruct(de.get(), di.get(), dm.get(), n, dim, dout.get(), nullptr);
  EXPECT_EQ(dout.download(), want);
}

}  // namespace
}  // namespace kvsdk::cuda
