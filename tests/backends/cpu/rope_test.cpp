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

// R(j) x from a table row of Rope::offset_table: x[c] * cos[c] + x[partner(c)] * sin[c].
std::vector<float> rotate_by_row(const float* x, const float* row, size_t dim,
                                 kvsdk_rope_style style) {
  std::vector<float> y(dim);
  for (size_t c = 0; c < dim; ++c) {
    const size_t partner = style == KVSDK_ROPE_INTERLEAVED ? c ^ 1
                           : style == KVSDK_ROPE_HALF      ? (c < dim / 2 ? c + dim / 2 : c - dim / 2)
                                                           : c;
    y[c] = x[c] * row[c] + x[partner] * row[dim + c];
  }
  return y;
}

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
    std::vector<float> x = normal_rows(n * dim, 12), y = x;
    rope.apply_rows(y.data(), pos.data(), n);
    for (size_t t = 0; t < n; ++t) {
      std::vector<float> want(&x[t * dim], &x[(t + 1) * dim]);
      rope.apply(want.data(), pos[t]);
      for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(y[t * dim + d], want[d], 2e-6f) << t << "," << d;
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
    std::vector<float> x = normal_rows(n * dim, 21), y = x;
    rope.apply_rows(y.data(), pos.data(), n);
    for (size_t t = 0; t < n; ++t) {
      std::vector<float> want(&x[t * dim], &x[(t + 1) * dim]);
      rope.apply(want.data(), pos[t]);
      for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(y[t * dim + d], want[d], 1e-5f) << t << "," << d;
    }
    // The block rotation's angles and table rows at the same positions (int64 offsets).
    std::vector<float> row(2 * dim);
    std::vector<double> c(dim / 2), s(dim / 2);
    for (size_t t = 0; t < n; ++t) {
      rope.offset_row(pos[t], row.data(), c.data(), s.data());
      std::vector<float> want(&x[t * dim], &x[(t + 1) * dim]);
      rope.apply(want.data(), pos[t]);
      const std::vector<float> got = rotate_by_row(&x[t * dim], row.data(), dim, style);
      for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(got[d], want[d], 1e-5f) << t << "," << d;
    }
  }
}

}  // namespace

namespace {

// The block rotation of SpindleKV's attention kernel: q . R(p0 + j) x = R(-p0) q . R(j) x, with
// R(-p0) q from rotate_back and R(j) x from a row of offset_table (rows by angle addition) or
// offset_row (any offset), each within f32 rounding of apply().
TEST(Rope, BlockRotationMatchesApply) {
  const size_t dim = 128, n = 48;
  for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF, KVSDK_ROPE_NONE}) {
    const Rope rope(dim, 500000.0f, style);
    std::vector<float> table(n * 2 * dim), row(2 * dim);
    std::vector<double> c(dim / 2), s(dim / 2);
    rope.offset_table(n, table.data(), c.data(), s.data());
    // c, s end as the angles of offset n.
    std::vector<double> cn(dim / 2), sn(dim / 2);
    rope.angles(int64_t(n), cn.data(), sn.data());
    for (size_t i = 0; i < dim / 2; ++i) {
      EXPECT_NEAR(c[i], cn[i], 1e-14) << "style " << style << " pair " << i;
      EXPECT_NEAR(s[i], sn[i], 1e-14) << "style " << style << " pair " << i;
    }
    const std::vector<float> x = normal_rows(dim, 5), q = normal_rows(dim, 6);
    for (size_t j = 0; j < n; ++j) {
      // Row j (by angle addition) against offset_row (direct angles) and apply().
      rope.offset_row(int64_t(j), row.data(), c.data(), s.data());
      for (size_t d = 0; d < 2 * dim; ++d) {
        EXPECT_NEAR(table[j * 2 * dim + d], row[d], 1e-6f) << "offset " << j << "," << d;
      }
      std::vector<float> want = x;
      rope.apply(want.data(), int32_t(j));
      const std::vector<float> got = rotate_by_row(x.data(), &table[j * 2 * dim], dim, style);
      for (size_t d = 0; d < dim; ++d) EXPECT_NEAR(got[d], want[d], 2e-6f) << j << "," << d;
    }
    for (int32_t p0 : {0, 977, 131071}) {
      std::vector<double> ac(dim / 2), as(dim / 2);
      rope.angles(p0, ac.data(), as.data());
      std::vector<float> q_back(dim);
      rope.rotate_back(q.data(), ac.data(), as.data(), q_back.data());
      std::vector<float> want_q = q;
      rope.inverse(want_q.data(), p0);  // the same angles and arithmetic: the same bits
      for (size_t d = 0; d < dim; ++d) EXPECT_EQ(q_back[d], want_q[d]) << p0 << "," << d;
      for (size_t j = 0; j < n; ++j) {
        std::vector<float> k = x;
        rope.apply(k.data(), p0 + int32_t(j));
        const std::vector<float> kj = rotate_by_row(x.data(), &table[j * 2 * dim], dim, style);
        double want = 0, got = 0, mag = 0;
        for (size_t d = 0; d < dim; ++d) {
          want += double(q[d]) * k[d];
          got += double(q_back[d]) * kj[d];
          mag += std::fabs(double(q[d]) * k[d]);
        }
        EXPECT_NEAR(got, want, 1e-6 * mag) << "style " << style << " p0 " << p0 << " j " << j;
      }
    }
  }
}

}  // namespace
