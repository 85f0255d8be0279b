// KIVI quantization on the device vs backends/cpu/kivi_quant: codes, scales and zero points must
// be bit-identical (tolerance: none), dequantized values identical.
#include "cuda_kivi_quant.h"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "kivi_quant.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

using test::DeviceBuffer;

class CudaKiviQuant : public ::testing::TestWithParam<uint32_t> {};

TEST_P(CudaKiviQuant, KeysMatchCpuBitForBit) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const uint32_t bits = GetParam();
  const size_t blocks = 3, tokens = 32, dim = 100;  // dim not a multiple of 8: padded rows
  std::vector<float> k = test::random_floats(blocks * tokens * dim, 11 + bits, 2.0f);
  k[5] = 0.0f;  // a few special values
  for (size_t t = 0; t < tokens; ++t) k[t * dim + 7] = 1.25f;  // a constant channel
  const size_t row_bytes = cpu::kivi_packed_bytes(dim, bits);
  DeviceBuffer<float> dk(k);
  DeviceBuffer<uint8_t> dcodes(blocks * tokens * row_bytes);
  DeviceBuffer<uint16_t> ds(blocks * dim), dz(blocks * dim);
  DeviceBuffer<float> dout(k.size());
  kivi_quantize_keys(dk.get(), blocks, tokens, dim, bits, dcodes.get(), ds.get(), dz.get(),
                     nullptr);
  kivi_dequantize_keys(dcodes.get(), ds.get(), dz.get(), blocks, tokens, dim, bits, dout.get(),
                       nullptr);
  const auto codes = dcodes.download();
  const auto s = ds.download(), z = dz.download();
  const auto out = dout.download();
  for (size_t b = 0; b < blocks; ++b) {
    std::vector<uint8_t> cc(tokens * row_bytes);
    std::vector<uint16_t> cs(dim), cz(dim);
    std::vector<float> cout(tokens * dim);
    cpu::kivi_quantize_keys(&k[b * tokens * dim], tokens, dim, bits, cc.data(), cs.data(),
                            cz.data());
    cpu::kivi_dequantize_keys(cc.data(), cs.data(), cz.data(), 0, tokens, dim, bits, cout.data());
    EXPECT_TRUE(std::equal(cc.begin(), cc.end(), codes.begin() + b * tokens * row_bytes));
    EXPECT_TRUE(std::equal(cs.begin(), cs.end(), s.begin() + b * dim));
    EXPECT_TRUE(std::equal(cz.begin(), cz.end(), z.begin() + b * dim));
    EXPECT_TRUE(std::equal(cout.begin(), cout.end(), out.begin() + b * tokens * dim));
  }
}

TEST_P(CudaKiviQuant, ValuesMatchCpuBitForBit) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const uint32_t bits = GetParam();
  const size_t tokens = 77, dim = 100, group = 32;  // the last group has 4 channels
  const std::vector<float> v = test::random_floats(tokens * dim, 23 + bits);
  const size_t row_bytes = cpu::kivi_packed_bytes(dim, bits);
  const size_t groups = cpu::kivi_value_groups(dim, group);
  DeviceBuffer<float> dv(v);
  DeviceBuffer<uint8_t> dcodes(tokens * row_bytes);
  DeviceBuffer<uint16_t> ds(tokens * groups), dz(tokens * groups);
  DeviceBuffer<float> dout(v.size());
  kivi_quantize_values(dv.get(), tokens, dim, group, bits, dcodes.get(), ds.get(), dz.get(),
                       nullptr);
  kivi_dequantize_values(dcodes.get(), ds.get(), dz.get(), tokens, dim, group, bits, dout.get(),
                         nullptr);
  std::vector<uint8_t> cc(tokens * row_bytes);
  std::vector<uint16_t> cs(tokens * groups), cz(tokens * groups);
  std::vector<float> cout(v.size());
  cpu::kivi_quantize_values(v.data(), tokens, dim, group, bits, cc.data(), cs.data(), cz.data());
  cpu::kivi_dequantize_values(cc.data(), cs.data(), cz.data(), tokens, dim, group, bits,
                              cout.data());
  EXPECT_EQ(dcodes.download(), cc);
  EXPECT_EQ(ds.download(), cs);
  EXPECT_EQ(dz.download(), cz);
  EXPECT_EQ(dout.download(), cout);
}

TEST_P(CudaKiviQuant, PackAndUnpackMatchCpu) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const uint32_t bits = GetParam();
  const size_t rows = 5, n = 131;
  std::vector<uint8_t> codes(rows * n);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t((i * 2654435761u) >> 7);
  const size_t row_bytes = cpu::kivi_packed_bytes(n, bits);
  DeviceBuffer<uint8_t> dcodes(codes), dpacked(rows * row_bytes), dback(rows * n);
  kivi_pack(dcodes.get(), rows, n, bits, dpacked.get(), nullptr);
  kivi_unpack(dpacked.get(), rows, n, bits, dback.get(), nullptr);
  const auto packed = dpacked.download(), back = dback.download();
  for (size_t r = 0; r < rows; ++r) {
    std::vector<uint8_t> cp(row_bytes), cb(n);
    cpu::kivi_pack(&codes[r * n], n, bits, cp.data());
    cpu::kivi_unpack(cp.data(), n, bits, cb.data());
    EXPECT_TRUE(std::equal(cp.begin(), cp.end(), packed.begin() + r * row_bytes)) << "row " << r;
    EXPECT_TRUE(std::equal(cb.begin(), cb.end(), back.begin() + r * n)) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Bits, CudaKiviQuant, ::testing::Values(1u, 2u, 4u, 8u));

// Argument checks happen on the host before anything touches the device: they run everywhere.
TEST(CudaKiviQuantArgs, UnsupportedBitsAndZeroSizesAreInvalidArguments) {
  const auto status = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return e.status();
    }
    return KVSDK_OK;
  };
  EXPECT_EQ(status([] {
              kivi_quantize_keys(nullptr, 1, 1, 8, 3, nullptr, nullptr, nullptr, nullptr);
            }),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status([] {
              kivi_quantize_values(nullptr, 1, 8, 0, 2, nullptr, nullptr, nullptr, nullptr);
            }),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status([] { kivi_pack(nullptr, 1, 0, 2, nullptr, nullptr); }), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status([] {
              kivi_dequantize_keys(nullptr, nullptr, nullptr, 1, 1, 8, 16, nullptr, nullptr);
            }),
            KVSDK_E_INVALID_ARG);
}

}  // namespace
}  // namespace kvsdk::cuda
