// f16 -> f32 on the device vs the CPU reference backend's f16_to_f32, bit for bit, over every
// one of the 65,536 f16 bit patterns (zeros, subnormals, infinities and NaN payloads included),
// at lengths that leave a partial thread block; and the CUDA table's entries that a device KIVI
// store flushes with (f16_to_f32, kivi_quantize_keys/values) against the reference's.
#include "cuda_convert.h"

#include <gtest/gtest.h>

#include <cstring>

#include "backend_ops.h"
#include "cuda_ops.h"
#include "cuda_test_util.h"
#include "kivi_quant.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

std::vector<float> reference_f32(const std::vector<uint16_t>& h) {
  std::vector<float> out(h.size());
  backend::cpu_reference().f16_to_f32(h.data(), h.size(), out.data());
  return out;
}

TEST(CudaConvert, EveryF16BitPatternWidensAsOnTheCpu) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  std::vector<uint16_t> all(65536 + 77);
  // An odd multiplier visits every pattern in the first 65,536 (then some again).
  for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i * 40503u);
  test::DeviceBuffer<uint16_t> src(all);
  test::DeviceBuffer<float> dst(all.size());
  f16_to_f32(src.get(), all.size(), dst.get(), nullptr);
  const std::vector<float> got = dst.download(), want = reference_f32(all);
  for (size_t i = 0; i < all.size(); ++i) {
    uint32_t g = 0, w = 0;
    std::memcpy(&g, &got[i], 4);
    std::memcpy(&w, &want[i], 4);
    ASSERT_EQ(g, w) << "f16 bits 0x" << std::hex << all[i];  // the first difference only
  }
}

TEST(CudaConvert, TheTableFlushesAKiviBlockAsTheCpuDoes) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const backend::Ops& ops = *device_backend().ops;
  const backend::Ops& ref = backend::cpu_reference();
  const size_t G = 32, dim = 128;
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    // A residual block as a store holds it: f16 rows.
    const std::vector<float> rows = test::random_floats(G * dim, 50 + bits);
    std::vector<uint16_t> h(rows.size());
    ref.f32_to_f16(rows.data(), rows.size(), h.data());
    const std::vector<float> wide = reference_f32(h);
    const size_t row_bytes = cpu::kivi_packed_bytes(dim, bits), groups = dim / G;
    std::vector<uint8_t> kc(G * row_bytes), vc(G * row_bytes);
    std::vector<uint16_t> ks(dim), kz(dim), vs(G * groups), vz(G * groups);
    ref.kivi_quantize_keys(wide.data(), G, dim, bits, kc.data(), ks.data(), kz.data());
    ref.kivi_quantize_values(wide.data(), G, dim, G, bits, vc.data(), vs.data(), vz.data());
    test::DeviceBuffer<uint16_t> dh(h);
    test::DeviceBuffer<float> dwide(h.size());
    test::DeviceBuffer<uint8_t> dkc(kc.size()), dvc(vc.size());
    test::DeviceBuffer<uint16_t> dks(dim), dkz(dim), dvs(vs.size()), dvz(vz.size());
    ops.f16_to_f32(dh.get(), h.size(), dwide.get());
    ops.kivi_quantize_keys(dwide.get(), G, dim, bits, dkc.get(), dks.get(), dkz.get());
    ops.kivi_quantize_values(dwide.get(), G, dim, G, bits, dvc.get(), dvs.get(), dvz.get());
    EXPECT_EQ(dkc.download(), kc);
    EXPECT_EQ(dks.download(), ks);
    EXPECT_EQ(dkz.download(), kz);
    EXPECT_EQ(dvc.download(), vc);
    EXPECT_EQ(dvs.download(), vs);
    EXPECT_EQ(dvz.download(), vz);
  }
}

}  // namespace
}  // namespace kvsdk::cuda
