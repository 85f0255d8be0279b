// f16 / bf16 conversions: exhaustive round trips and round-to-nearest-even on ties.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "util/half.h"

using namespace kvsdk;

TEST(Half, EveryF16RoundTripsThroughF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), uint16_t(h)) << "half bits " << h;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // ties to even: overflows to infinity
  EXPECT_EQ(f32_to_f16(1e9f), 0x7c00);
  EXPECT_EQ(f32_to_f16(5.9604644775390625e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.9802322387695312e-8f), 0x0000);  // half of it: ties to even (0)
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.333251953125f);
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: even mantissa (1.0) wins.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 lies halfway between 1+2^-10 (odd) and 1+2^-9 (even).
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Slightly above a tie rounds up.
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
}

TEST(BFloat16, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), uint16_t(h));
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is a tie between 1 (even) and 1 + 2^-7.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}
