// MiniCache merge/restore on the device vs the CPU's formulas (backends/cpu/minicache_merge).
// Tolerances: distance 1e-6 absolute (f64 acos/sin of the device vs the host libm); direction
// within one f16 step (1e-3 relative) since the f64 weights may differ in the last bit before
// rounding; magnitudes 1e-5 relative; restore bit-identical to f16(e) * m.
#include "cuda_minicache.h"

#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "minicache_merge.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

TEST(CudaMiniCache, MergeAndRestoreMatchCpu) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t n = 257, dim = 128;
  const float t = 0.6f;
  auto prev = test::random_floats(n * dim, 1);
  auto cur = test::random_floats(n * dim, 2);
  for (size_t i = 0; i < n * dim; ++i) cur[i] = 0.7f * prev[i] + 0.3f * cur[i];  // correlated
  for (size_t c = 0; c < dim; ++c) prev[3 * dim + c] = 0.0f;                     // a zero row
  for (size_t c = 0; c < dim; ++c) cur[4 * dim + c] = 2.0f * prev[4 * dim + c];  // parallel rows
  test::DeviceBuffer<float> dp(prev), dc(cur), dmp(n), dmc(n), ddist(n);
  test::DeviceBuffer<uint16_t> de(n * dim);
  minicache_merge(dp.get(), dc.get(), n, dim, t, de.get(), dmp.get(), dmc.get(), ddist.get(),
                  nullptr);
  const auto e = de.download();
  const auto mp = dmp.download(), mc = dmc.download(), dist = ddist.download();
  for (size_t i = 0; i < n; ++i) {
    const float* a = &prev[i * dim];
    const float* b = &cur[i * dim];
    EXPECT_NEAR(dist[i], cpu::minicache_angular_distance(a, b, dim), 1e-6) << i;
    if (i == 3) continue;  // zero row: nothing to merge
    std::vector<float> want(dim);
    cpu::minicache_slerp(a, b, dim, t, want.data());
    double en = 0, na = 0, nb = 0;
    for (size_t c = 0; c < dim; ++c) {
      const float got = f16_to_f32(e[i * dim + c]);
      ASSERT_NEAR(got, f16_to_f32(f32_to_f16(want[c])), 1e-3 * std::fabs(want[c]) + 1e-7) << i;
      en += double(got) * got;
      na += double(a[c]) * a[c];
      nb += double(b[c]) * b[c];
    }
    EXPECT_NEAR(mp[i], std::sqrt(na / en), 1e-5 * mp[i]) << i;
    EXPECT_NEAR(mc[i], std::sqrt(nb / en), 1e-5 * mc[i]) << i;
  }

  // Restore: every third token retained (its rows as f16), the rest merged.
  std::vector<uint32_t> slot(n);
  std::vector<uint16_t> dirs, kept;
  std::vector<float> mags;
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) {
      slot[i] = kMiniCacheRetained | uint32_t(kept.size() / dim);
      for (size_t c = 0; c < dim; ++c) kept.push_back(f32_to_f16(cur[i * dim + c]));
    } else {
      slot[i] = uint32_t(mags.size());
      dirs.insert(dirs.end(), e.begin() + i * dim, e.begin() + (i + 1) * dim);
      mags.push_back(mc[i]);
    }
  }
  test::DeviceBuffer<uint32_t> ds(slot);
  test::DeviceBuffer<uint16_t> dd(dirs), dk(kept);
  test::DeviceBuffer<float> dm(mags), dout(n * dim);
  minicache_restore(ds.get(), dd.get(), dm.get(), dk.get(), n, dim, dout.get(), nullptr);
  const auto out = dout.download();
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < dim; ++c) {
      const uint32_t s = slot[i];
      const float want = (s & kMiniCacheRetained)
                             ? f16_to_f32(kept[(s & ~kMiniCacheRetained) * dim + c])
                             : f16_to_f32(dirs[s * dim + c]) * mags[s];
      ASSERT_EQ(out[i * dim + c], want) << i << "," << c;
    }
  }
}

}  // namespace
}  // namespace kvsdk::cuda
