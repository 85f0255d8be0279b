// backends/cpu/portable_math: accuracy against the C library on many arguments (the C library's
// results are themselves within ~0.5 ulp, so a distance of 1-2 ulp from them is 1-2 ulp from the
// exact value), special values, and fixed bit patterns that pin the implementation: those must be
// the same on every platform, which is the point of the unit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "portable_math.h"

namespace pm = kvsdk::cpu::pmath;

namespace {

// Distance in units in the last place between two finite doubles of the same sign region.
uint64_t ulps(double a, double b) {
  if (a == b) return 0;
  int64_t ia = 0, ib = 0;
  std::memcpy(&ia, &a, 8);
  std::memcpy(&ib, &b, 8);
  if (ia < 0) ia = INT64_MIN - ia;  // monotone ordering of negative doubles
  if (ib < 0) ib = INT64_MIN - ib;
  return ia > ib ? uint64_t(ia) - uint64_t(ib) : uint64_t(ib) - uint64_t(ia);
}

uint64_t ulps_f(float a, float b) {
  if (a == b) return 0;
  int32_t ia = 0, ib = 0;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return ia > ib ? uint64_t(ia) - uint64_t(ib) : uint64_t(ib) - uint64_t(ia);
}

uint64_t bits(double x) {
  uint64_t u = 0;
  std::memcpy(&u, &x, 8);
  return u;
}

constexpr int kSamples = 400000;

TEST(PortableMath, ExpWithinOneUlpOfLibm) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> wide(-745.0, 709.0), narrow(-2.0, 2.0);
  uint64_t worst = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double x = i % 2 ? wide(rng) : narrow(rng);
    worst = std::max(worst, ulps(pm::exp(x), std::exp(x)));
  }
  EXPECT_LE(worst, 1u);
  EXPECT_EQ(pm::exp(0.0), 1.0);
  EXPECT_EQ(pm::exp(1e-300), 1.0);
  EXPECT_EQ(pm::exp(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(pm::exp(710.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(pm::exp(-746.0), 0.0);
  EXPECT_TRUE(std::isnan(pm::exp(std::nan(""))));
  EXPECT_LE(ulps(pm::exp(-740.0), std::exp(-740.0)), 1u);  // subnormal result
}

TEST(PortableMath, ExpF32IsLibmsExpfExceptInRareHalfwayCases) {
  // Every float in [-104, 0] with bit patterns stepped by 97 (~11 million of them): softmax
  // arguments. Both implementations are within ~0.5 ulp, so they may disagree only where the
  // exact result lies next to a halfway point between two floats.
  uint64_t differ = 0, worst = 0, n = 0;
  for (uint32_t u = 0x80000000u; u < 0xC2D00000u; u += 97) {
    float x = 0;
    std::memcpy(&x, &u, 4);
    const uint64_t d = ulps_f(pm::exp_f32(x), std::exp(x));
    differ += d != 0;
    worst = std::max(worst, d);
    ++n;
  }
  EXPECT_LE(worst, 1u);
  EXPECT_LE(differ, n / 10000) << differ << " of " << n;
  EXPECT_EQ(pm::exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(pm::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(pm::exp_f32(89.0f), std::numeric_limits<float>::infinity());
}

TEST(PortableMath, LogAndPowWithinTheirBounds) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> mant(0.5, 2.0), expo(-1000.0, 1000.0);
  uint64_t worst = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double x = std::ldexp(mant(rng), int(expo(rng)));
    worst = std::max(worst, ulps(pm::log(x), std::log(x)));
  }
  EXPECT_LE(worst, 1u);
  EXPECT_EQ(pm::log(1.0), 0.0);
  EXPECT_EQ(pm::log(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(pm::log(-1.0)));
  // RoPE frequencies theta^(-2i/d): relative error below (1 + 2 |y ln x|) * 2^-52 (log's ulp
  // and the product's rounding, scaled by the exponent's magnitude).
  for (double theta : {10000.0, 500000.0, 1e6, 2.5}) {
    for (int d : {8, 64, 128, 256}) {
      for (int i = 0; i < d / 2; ++i) {
        const double y = -2.0 * i / d;
        const double want = std::pow(theta, y), got = pm::pow_positive(theta, y);
        const double bound = (1.0 + 2.0 * std::fabs(y * std::log(theta))) * 0x1p-52;
        EXPECT_LE(std::fabs(got - want) / want, bound) << theta << "^" << y;
      }
    }
  }
  EXPECT_EQ(pm::pow_positive(7.0, 0.0), 1.0);
  EXPECT_TRUE(std::isnan(pm::pow_positive(0.0, 2.0)));
  EXPECT_TRUE(std::isnan(pm::pow_positive(-2.0, 2.0)));
}

TEST(PortableMath, SinCosCloseToLibmOverRoPEAngles) {
  // RoPE angles position * freq: |x| up to 2^31. The result's error is relative for |x| <= pi/4
  // and absolute (~2^-53 plus the reduction's) beyond it, as for any argument reduction in
  // double.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> small(-0.8, 0.8), mid(-300.0, 300.0),
      big(-2147483647.0, 2147483647.0);
  uint64_t worst_small = 0;
  double worst_abs = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double a = small(rng);
    worst_small = std::max({worst_small, ulps(pm::sin(a), std::sin(a)),
                            ulps(pm::cos(a), std::cos(a))});
    for (double x : {mid(rng), big(rng)}) {
      double s = 0, c = 0;
      pm::sincos(x, &s, &c);
      EXPECT_EQ(s, pm::sin(x));
      EXPECT_EQ(c, pm::cos(x));
      worst_abs = std::max({worst_abs, std::fabs(s - std::sin(x)), std::fabs(c - std::cos(x))});
    }
  }
  EXPECT_LE(worst_small, 1u);
  EXPECT_LE(worst_abs, 0x1p-52);
  // Integer positions times a frequency of 1: the hardest RoPE pairs (the largest angles).
  for (int64_t p = 1; p < 2147483647; p = p * 3 + 1) {
    EXPECT_LE(std::fabs(pm::sin(double(p)) - std::sin(double(p))), 0x1p-52) << p;
    EXPECT_LE(std::fabs(pm::cos(double(p)) - std::cos(double(p))), 0x1p-52) << p;
  }
  EXPECT_EQ(pm::sin(0.0), 0.0);
  EXPECT_EQ(pm::cos(0.0), 1.0);
  EXPECT_TRUE(std::isnan(pm::sin(std::numeric_limits<double>::infinity())));
  EXPECT_TRUE(std::isnan(pm::cos(std::nan(""))));
  // Beyond 2^32 * pi/2: reduced through fmod, still a sine (|sin| <= 1, sin^2 + cos^2 = 1).
  double s = 0, c = 0;
  pm::sincos(1e15, &s, &c);
  EXPECT_NEAR(s * s + c * c, 1.0, 1e-15);
}

TEST(PortableMath, AcosWithinOneUlpOfLibm) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> all(-1.0, 1.0), near_one(0.999999, 1.0);
  uint64_t worst = 0;
  for (int i = 0; i < kSamples; ++i) {
    for (double x : {all(rng), near_one(rng), -near_one(rng)}) {
      worst = std::max(worst, ulps(pm::acos(x), std::acos(x)));
    }
  }
  EXPECT_LE(worst, 1u);
  EXPECT_EQ(pm::acos(1.0), 0.0);
  EXPECT_EQ(pm::acos(-1.0), std::acos(-1.0));
  EXPECT_EQ(pm::acos(0.0), std::acos(0.0));
  EXPECT_TRUE(std::isnan(pm::acos(1.0000001)));
  EXPECT_TRUE(std::isnan(pm::acos(std::nan(""))));
}

// Bit patterns of a few results. They do not depend on the platform's libm, so they are the
// same on x86-64, aarch64 and under any C library; a change here changes snapshot continuations
// (and the digests that tests/golden pins).
TEST(PortableMath, FixedBitsOnEveryPlatform) {
  EXPECT_EQ(bits(pm::exp(-3.25)), 0x3fa3da368521902dull);
  EXPECT_EQ(bits(pm::sin(12345.678)), 0xbfe687d5890974a5ull);
  EXPECT_EQ(bits(pm::cos(0.7)), 0x3fe87996529f9d93ull);
  EXPECT_EQ(bits(pm::acos(0.3)), 0x3ff441f5ecbeef59ull);
  EXPECT_EQ(bits(pm::pow_positive(10000.0, -0.34375)), 0x3fa59742aa36710cull);
  const float e = pm::exp_f32(-7.5f);
  uint32_t u = 0;
  std::memcpy(&u, &e, 4);
  EXPECT_EQ(u, 0x3a10fcddu);
}

}  // namespace
