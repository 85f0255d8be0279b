// RoPE helpers against a direct complex-rotation reference; inverse round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

#include "reference_attention.h"
#include "rope.h"

using namespace kvsdk_test;
using kvsdk::cpu::Rope;

namespace {

TEST(Rope, MatchesComplexRotationReference) {
  const size_t dim = 16;
  const float theta = 10000.0f;
  for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF}) {
    std::vector<float> x = normal_rows(dim, 3);
    std::vector<float> y = x;
    const int32_t pos = 1234;
    Rope(dim, theta, style).apply(y.data(), pos);
    for (size_t i = 0; i < dim / 2; ++i) {
      const size_t a = style == KVSDK_ROPE_INTERLEAVED ? 2 * i : i;
      const size_t b = style == KVSDK_ROPE_INTERLEAVED ? 2 * i + 1 : i + dim / 2;
      const double angle = pos * std::pow(double(theta), -2.0 * double(i) / double(dim));
      const std::complex<double> z = std::complex<double>(x[a], x[b]) * std::polar(1.0, angle);
      EXPECT_NEAR(y[a], z.real(), 1e-5) << "style " << style << " pair " << i;
      EXPECT_NEAR(y[b], z.imag(), 1e-5) << "style " << style << " pair " << i;
    }
  }
}

TEST(Rope, InverseRoundTrip) {
  const size_t dim = 128;
  for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF}) {
    const Rope rope(dim, 500000.0f, style);
    for (int32_t pos : {0, 1, 77, 4095, 131071}) {
      const std::vector<float> x = normal_rows(dim, uint32_t(pos) + 1);
      std::vector<float> y = x;
      rope.apply(y.data(), pos);
      if (pos != 0) EXPECT_NE(y, x);
      rope.inverse(y.data(), pos);
      for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(y[d], x[d], 2e-6f) << pos << " " << d;
    }
  }
}

TEST(Rope, NoneLeavesRowsUnchangedAndPreservesNorm) {
  const size_t dim = 32;
  std::vector<float> x = normal_rows(dim, 9), y = x;
  Rope(dim, 10000.0f, KVSDK_ROPE_NONE).apply(y.data(), 999);
  EXPECT_EQ(y, x);
  Rope(dim, 10000.0f, KVSDK_ROPE_HALF).apply(y.data(), 999);
  double nx = 0, ny = 0;
  for (size_t d = 0; d < dim; ++d) {
    nx += double(x[d]) * x[d];
    ny += double(y[d]) * y[d];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
}

}  // namespace

namespace {

TEST(Rope, ApplyRowsMatchesPerRowApply) {
  const size_t dim = 128, n = 300;
  for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF}) {
    const kvsdk::cpu::Rope rope(dim, 500000.0f, style);
    std::vector<int32_t> pos(n);
    for (size_t t = 0; t < n; ++t) pos[t] = int32_t(t < 150 ? 40000 + t : 90000 + 3 * t);  // runs and gaps
    std::vector<float> x = normal_rows(n * dim, 12), y = x, yf = x;
    rope.apply_rows(y.data(), pos.data(), n);
    rope.apply_rows_f32(yf.data(), pos.data(), n);  // the optimized attention's (f32 rotation)
    for (size_t t = 0; t < n; ++t) {
      std::vector<float> want(&x[t * dim], &x[(t + 1) * dim]);
      rope.apply(want.data(), pos[t]);
      for (size_t d = 0; d < dim; ++d) {
        EXPECT_NEAR(y[t * dim + d], want[d], 2e-6f) << t << "," << d;
        EXPECT_NEAR(yf[t * dim + d], want[d], 2e-6f) << "f32 " << t << "," << d;
      }
    }
  }
}

}  // namespace

namespace {

// Positions at the ends of int32 (beyond the API's 0..KVSDK_MAX_POSITION, which the kernels do
// not rely on): finding runs of consecutive positions must not overflow (UBSan under the asan
// preset), and the rows match per-row apply.
TEST(Rope, ApplyRowsAtTheEndsOfInt32) {
  const size_t dim = 64;
  const std::vector<int32_t> pos = {INT32_MAX - 2, INT32_MAX - 1, INT32_MAX, INT32_MAX,
                                    INT32_MIN,     INT32_MIN + 1, -1,        0};
  const size_t n = pos.size();
  for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF}) {
    const kvsdk::cpu::Rope rope(dim, 10000.0f, style);
    std::vector<float> x = normal_rows(n * dim, 21), y = x, yf = x;
    rope.apply_rows(y.data(), pos.data(), n);
    rope.apply_rows_f32(yf.data(), pos.data(), n);
    for (size_t t = 0; t < n; ++t) {
      std::vector<float> want(&x[t * dim], &x[(t + 1) * dim]);
      rope.apply(want.data(), pos[t]);
      for (size_t d = 0; d < dim; ++d) {
        EXPECT_NEAR(y[t * dim + d], want[d], 1e-5f) << t << "," << d;
        EXPECT_NEAR(yf[t * dim + d], want[d], 1e-5f) << "f32 " << t << "," << d;
      }
    }
  }
}

}  // namespace
