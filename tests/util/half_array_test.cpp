// The bulk f16 -> f32 conversion (NEON on AArch64, run under qemu-aarch64 by the aarch64 preset)
// equals the scalar reference bit for bit on every half, at every alignment and tail length.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "util/half.h"
#include "util/half_array.h"

namespace {

using kvsdk::f16_to_f32;

TEST(HalfArray, EveryHalfMatchesTheReferenceBitForBit) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> out(all.size());
  kvsdk::f16_to_f32_array(all.data(), out.data(), all.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = f16_to_f32(all[i]);
    if (std::memcmp(&want, &out[i], sizeof want) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << "half 0x" << std::hex << i << ": got bits 0x" << kvsdk::float_bits(out[i])
                    << ", want 0x" << kvsdk::float_bits(want);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(HalfArray, OffsetsAndTailsMatchAndNothingOutsideIsWritten) {
  // Subnormals, a signalling NaN, infinities and ordinary values, repeated.
  const uint16_t pattern[] = {0x0001, 0x83ff, 0x7c01, 0x3c00, 0xfc00, 0x7bff, 0x0000, 0x8000,
                              0x7e00, 0x3555, 0xc000, 0x0400, 0x7c00, 0x1234, 0xfd00, 0x5140};
  std::vector<uint16_t> src(64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern[(i * 7) % 16];
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= 40; ++n) {
      std::vector<float> out(n + 2, -123.0f);
      kvsdk::f16_to_f32_array(src.data() + offset, out.data() + 1, n);
      EXPECT_EQ(out[0], -123.0f);
      EXPECT_EQ(out[n + 1], -123.0f) << "wrote past the end, n=" << n;
      for (size_t i = 0; i < n; ++i) {
        const float want = f16_to_f32(src[offset + i]);
        ASSERT_EQ(kvsdk::float_bits(out[1 + i]), kvsdk::float_bits(want))
            << "offset " << offset << " n " << n << " i " << i;
      }
    }
  }
}

TEST(HalfArray, AArch64BuildsUseTheNeonPath) {
#if defined(__aarch64__)
  EXPECT_EQ(KVSDK_HALF_ARRAY_NEON, 1) << "an AArch64 build fell back to the scalar path";
#else
  GTEST_SKIP() << "not an AArch64 build: the scalar path is the only one";
#endif
}

}  // namespace
