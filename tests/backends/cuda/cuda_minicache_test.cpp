// MiniCache merge/restore on the device vs the CPU's formulas (backends/cpu/minicache_merge).
// Tolerances: distance 1e-6 absolute (f64 acos/sin of the device vs the host libm); direction
// within one f16 step (1e-3 relative) since the f64 weights may differ in the last bit before
// rounding; magnitudes 1e-5 relative; restore bit-identical to f16(e) * m.
// And the backend's attention over a pair's buffers (attend_minicache_tier: the split-K kernel's
// MiniCache loader) vs the reference backend's attend_minicache of the same pair, within the
// decode kernel's tolerance (2e-4 absolute: f32 sums in another order).
#include "cuda_minicache.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "backend_ops.h"
#include "cuda_ops.h"
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

// One layer of a pair of `n` tokens (retained and merged ones: γ = 0.2, partly correlated layers)
// with `n_pending` exact rows after it, attended by query rows at positions that see all, part or
// none of it, on the device and by the reference backend.
struct AttendCase {
  size_t dim, group, n, n_pending;
};

class CudaMiniCacheAttend : public ::testing::TestWithParam<AttendCase> {};

TEST_P(CudaMiniCacheAttend, MatchesTheReferenceBackend) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const AttendCase c = GetParam();
  const size_t dim = c.dim, n = c.n, np = c.n_pending;
  cpu::MiniCacheHeadPair pair(dim, cpu::MiniCacheConfig{0.6f, 0.2f});
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = int32_t(3 * i);
  const auto rows = [&](uint32_t seed) {
    auto a = test::random_floats(n * dim, seed), b = test::random_floats(n * dim, seed + 1);
    for (size_t i = 0; i < a.size(); ++i) b[i] = 0.8f * a[i] + 0.2f * b[i];
    for (size_t i = 0; i < a.size() && n > 5; ++i) {  // some tokens far apart: retained
      if ((i / dim) % 5 == 0) b[i] = -b[i];
    }
    return std::make_pair(a, b);
  };
  // Two appends: the first fixes the threshold, the second retains by it.
  const auto k = rows(10), v = rows(20);
  const size_t first = n / 2;
  pair.append(k.first.data(), v.first.data(), k.second.data(), v.second.data(), pos.data(), first);
  pair.append(k.first.data() + first * dim, v.first.data() + first * dim,
              k.second.data() + first * dim, v.second.data() + first * dim, pos.data() + first,
              n - first);
  if (n > 5) {
    ASSERT_GT(pair.keys.retained(), 0u);
    ASSERT_GT(pair.keys.merged(), 0u);
  }
  std::vector<uint16_t> pk(np * dim), pv(np * dim);
  const auto pkf = test::random_floats(np * dim, 30), pvf = test::random_floats(np * dim, 31);
  for (size_t i = 0; i < np * dim; ++i) pk[i] = f32_to_f16(pkf[i]), pv[i] = f32_to_f16(pvf[i]);
  std::vector<int32_t> ppos(np);
  for (size_t i = 0; i < np; ++i) ppos[i] = int32_t(3 * n + i);
  // Query tokens: all, the pending ones masked, half, the first token only, none (-1).
  const int32_t last = np ? ppos.back() : (n ? pos.back() : 0);
  const std::vector<int32_t> qtok{INT32_MAX, last, int32_t(3 * n) - 1, int32_t(3 * (n / 2)), 0,
                                  -1};
  std::vector<int32_t> qpos;
  for (int32_t p : qtok) qpos.insert(qpos.end(), c.group, p);
  const auto q = test::random_floats(qpos.size() * dim, 40);
  backend::QueryRows qr;
  qr.q = q.data();
  qr.positions = qpos.data();
  qr.n_rows = qpos.size();
  qr.dim = dim;
  qr.scale = 1.0f / std::sqrt(float(dim));
  qr.group = c.group;
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  for (int layer : {0, 1}) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    const backend::F16Rows host_pending{pk.data(), pv.data(), ppos.data(), np};
    std::vector<float> want(q.size()), rebuilt(q.size());
    backend::WorkspaceHandle ref_ws(ref);
    ref.attend_minicache(qr, pair, layer, host_pending, ref_ws.get(), want.data());
    // The tensors' buffers of this layer.
    const auto tensor = [&](const cpu::MergedLayerPair& m) {
      backend::MiniCacheTensor t;
      t.slots = m.slots();
      t.directions = m.directions();
      t.magnitudes = m.magnitudes(layer);
      t.retained = m.retained_rows(layer);
      t.merged = m.merged();
      t.retained_rows = m.retained();
      return t;
    };
    backend::MiniCacheTier host;
    host.k = tensor(pair.keys);
    host.v = tensor(pair.values);
    host.positions = pair.positions.data();
    host.tokens = n;
    // The reference's own entry over raw buffers: its attend_minicache's bits.
    ref.attend_minicache_tier(qr, host, host_pending, ref_ws.get(), rebuilt.data());
    ASSERT_EQ(0, std::memcmp(want.data(), rebuilt.data(), want.size() * sizeof(float)));

    const auto up16 = [](const uint16_t* p, size_t count) {
      return test::some(std::vector<uint16_t>(p, p + count));
    };
    const auto up32 = [](const float* p, size_t count) {
      return test::some(std::vector<float>(p, p + count));
    };
    const auto slots = [&](const uint32_t* p) {
      return test::some(std::vector<uint32_t>(p, p + n));
    };
    test::DeviceBuffer<uint32_t> ks(slots(host.k.slots)), vs(slots(host.v.slots));
    test::DeviceBuffer<uint16_t> kd(up16(host.k.directions, host.k.merged * dim));
    test::DeviceBuffer<uint16_t> vd(up16(host.v.directions, host.v.merged * dim));
    test::DeviceBuffer<float> km(up32(host.k.magnitudes, host.k.merged));
    test::DeviceBuffer<float> vm(up32(host.v.magnitudes, host.v.merged));
    test::DeviceBuffer<uint16_t> kr(up16(host.k.retained, host.k.retained_rows * dim));
    test::DeviceBuffer<uint16_t> vr(up16(host.v.retained, host.v.retained_rows * dim));
    test::DeviceBuffer<int32_t> tp(test::some(pair.positions));
    test::DeviceBuffer<uint16_t> dpk(test::some(pk)), dpv(test::some(pv));
    test::DeviceBuffer<int32_t> dpp(test::some(ppos)), dqp(qpos);
    test::DeviceBuffer<float> dq(q), dout(std::vector<float>(q.size(), NAN));
    backend::MiniCacheTier dev = host;
    dev.k.slots = ks.get(), dev.v.slots = vs.get();
    dev.k.directions = kd.get(), dev.v.directions = vd.get();
    dev.k.magnitudes = km.get(), dev.v.magnitudes = vm.get();
    dev.k.retained = kr.get(), dev.v.retained = vr.get();
    dev.positions = tp.get();
    backend::QueryRows dqr = qr;
    dqr.q = dq.get();
    dqr.positions = dqp.get();
    backend::WorkspaceHandle ws(ops);
    ops.attend_minicache_tier(dqr, dev, {dpk.get(), dpv.get(), dpp.get(), np}, ws.get(),
                              dout.get());
    const std::vector<float> got = dout.download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-4) << "element " << i << " (query position "
                                         << qpos[i / dim] << ")";
    }
    for (size_t i = got.size() - c.group * dim; i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMiniCacheAttend,
                         ::testing::Values(AttendCase{64, 1, 150, 0}, AttendCase{64, 4, 90, 7},
                                           AttendCase{128, 2, 200, 3},
                                           AttendCase{256, 3, 70, 20}, AttendCase{128, 1, 0, 5}),
                         [](const ::testing::TestParamInfo<AttendCase>& info) {
                           const AttendCase& c = info.param;
                           return "dim" + std::to_string(c.dim) + "_g" +
                                  std::to_string(c.group) + "_n" + std::to_string(c.n) + "_p" +
                                  std::to_string(c.n_pending);
                         });

}  // namespace
}  // namespace kvsdk::cuda
