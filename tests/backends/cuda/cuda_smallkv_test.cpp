// The CUDA table's SmallKV entries ("SmallKV: Small Model Assisted Compensation of KV Cache
// Compression for Efficient LLM Inference", Eq. 6; backends/cuda/cuda_smallkv.h) over device
// buffers against the CPU reference backend's own entries over the same bytes on the host (the
// oracle), on head dims 64/128/256, GQA groups 1/2/4 (query rows in runs of `group` at one
// position), ragged token counts (0, 1, 17, 300, 1030), keys out of position order, and query
// rows that see everything (INT32_MAX), a part, exactly one token, or nothing:
//  - smallkv_softmax: the reference's bits (memcmp): cpu::smallkv_softmax_rows' double softmax
//    with the portable exp, each row the bits of a call for that row alone;
//  - smallkv_add_marginal: the reference's bits (memcmp), weights strides above the marginal
//    count, rows whose proxy mass exceeds 1 (kept mass clamped at 0);
//  - attend_smallkv: within 2e-4 absolute of the reference (the decode kernel's tolerance in
//    cuda_decode_attention_test.cpp: its split-K sums in another order). The marginal term moves
//    the output by far more than that, so losing it (or its (1 - M) rescale) fails. And within
//    the CUDA table, bit for bit: with marginal rows it is the call without them followed by
//    smallkv_add_marginal, and without them it is attend_f16 over the full rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "cuda_ops.h"
#include "cuda_test_util.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

using test::DeviceBuffer;
using test::some;

// The same bits (memcmp; nothing to compare is equal: an empty vector's data() may be null).
bool same_bits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

std::vector<uint16_t> to_f16(const std::vector<float>& f) {
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_f16(f[i]);
  return h;
}

struct Case {
  size_t dim, group;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "dim " << c.dim << " group " << c.group; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "dim" + std::to_string(info.param.dim) + "_group" + std::to_string(info.param.group);
}

const std::vector<size_t> kCounts = {0, 1, 17, 300, 1030};

// Query rows in runs of `group`, one run per position.
struct Queries {
  std::vector<float> q;
  std::vector<int32_t> pos;
  backend::QueryRows rows(const Case& c) const {
    backend::QueryRows r{q.data(), pos.data(), pos.size(), c.dim, 1.0f / std::sqrt(float(c.dim))};
    r.group = c.group;
    return r;
  }
};
Queries make_queries(const Case& c, const std::vector<int32_t>& run_positions, uint32_t seed,
                     float stddev) {
  Queries qs;
  for (int32_t p : run_positions) qs.pos.insert(qs.pos.end(), c.group, p);
  qs.q = kvsdk_test::random_floats(qs.pos.size() * c.dim, seed, stddev);
  return qs;
}

// The query rows uploaded, as the table's argument.
struct DeviceQueries {
  DeviceBuffer<float> q;
  DeviceBuffer<int32_t> pos;
  backend::QueryRows rows;
  DeviceQueries(const Queries& qs, const Case& c) : q(some(qs.q)), pos(some(qs.pos)) {
    rows = qs.rows(c);
    rows.q = q.get(), rows.positions = pos.get();
  }
};

class CudaSmallKv : public ::testing::TestWithParam<Case> {};

// The proxy's keys: positions 3t, with neighbours swapped every fifth token (a proxy's rows
// need not be in position order).
std::vector<int32_t> key_positions(size_t n) {
  std::vector<int32_t> pos(n);
  for (size_t t = 0; t < n; ++t) pos[t] = int32_t(3 * t);
  for (size_t t = 1; t + 1 < n; t += 5) std::swap(pos[t], pos[t + 1]);
  return pos;
}

TEST_P(CudaSmallKv, SoftmaxIsTheReferenceBackendsBits) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  uint32_t seed = 100;
  for (size_t n : kCounts) {
    SCOPED_TRACE("n " + std::to_string(n));
    const std::vector<int32_t> kpos = key_positions(n);
    const std::vector<uint16_t> k = to_f16(kvsdk_test::random_floats(n * c.dim, seed++));
    // Everything; up to the middle key; between two keys; exactly the first key; nothing.
    const int32_t mid = n ? int32_t(3 * (n / 2)) : 0;
    const Queries qs = make_queries(c, {INT32_MAX, mid, mid + 1, 0, -1}, seed++, 2.0f);
    const size_t rows = qs.pos.size();
    std::vector<float> want(rows * n, NAN);
    backend::WorkspaceHandle ref_ws(ref);
    ref.smallkv_softmax(qs.rows(c), k.data(), kpos.data(), n, ref_ws.get(), want.data());

    const DeviceQueries dq(qs, c);
    DeviceBuffer<uint16_t> dk(some(k));
    DeviceBuffer<int32_t> dkpos(some(kpos));
    DeviceBuffer<float> dout(some(std::vector<float>(rows * n, NAN)));
    backend::WorkspaceHandle ws(ops);
    ops.smallkv_softmax(dq.rows, dk.get(), dkpos.get(), n, ws.get(), dout.get());
    std::vector<float> got = dout.download();
    got.resize(rows * n);
    ASSERT_TRUE(same_bits(got.data(), want.data(), got.size()));
    if (n == 0) continue;
    // The oracle's shape: rows sum to 1, the row that sees only the first key gives it 1, and
    // the row that sees nothing is all 0.
    for (size_t r = 0; r < 4 * c.group; ++r) {
      double sum = 0;
      for (size_t t = 0; t < n; ++t) sum += got[r * n + t];
      EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
    }
    EXPECT_EQ(got[3 * c.group * n], 1.0f);
    for (size_t i = 4 * c.group * n; i < rows * n; ++i) ASSERT_EQ(got[i], 0.0f);

    // Rows are independent: one row alone (the middle run's last) gives that row's bits.
    const size_t r = 2 * c.group - 1;
    backend::QueryRows one = dq.rows;
    one.q += r * c.dim, one.positions += r, one.n_rows = 1, one.group = 1;
    DeviceBuffer<float> done(n);
    ops.smallkv_softmax(one, dk.get(), dkpos.get(), n, ws.get(), done.get());
    const std::vector<float> alone = done.download();
    ASSERT_TRUE(same_bits(alone.data(), got.data() + r * n, n));
  }
}

// A SmallKV head's value-only rows and the proxy's weights for them, positions 2j + 1
// (between the full rows' even positions).
struct Marginal {
  std::vector<uint16_t> v;
  std::vector<int32_t> pos;
  std::vector<float> w;
  size_t n = 0, stride = 0;
  backend::SmallKvMarginal host() const {
    return {v.data(), pos.data(), n, w.data(), stride};
  }
};
// Weights of `rows` query rows over n marginal rows, stride n + 5 (the padding holds NaN, which
// no row may read). Row r's weights sum to about 0.6, and to about 1.6 for every third row (a
// proxy mass above 1: the kept mass clamps at 0).
Marginal make_marginal(size_t n, size_t rows, size_t dim, uint32_t seed) {
  Marginal m;
  m.n = n, m.stride = n + 5;
  m.v = to_f16(kvsdk_test::random_floats(n * dim, seed));
  m.pos.resize(n);
  for (size_t j = 0; j < n; ++j) m.pos[j] = int32_t(2 * j + 1);
  m.w.assign(rows * m.stride, NAN);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t r = 0; r < rows; ++r) {
    const float total = r % 3 == 2 ? 1.6f : 0.6f;
    for (size_t j = 0; j < n; ++j) m.w[r * m.stride + j] = u(rng) * 2.0f * total / float(n);
  }
  return m;
}

struct DeviceMarginal {
  DeviceBuffer<uint16_t> v;
  DeviceBuffer<int32_t> pos;
  DeviceBuffer<float> w;
  backend::SmallKvMarginal args;
  explicit DeviceMarginal(const Marginal& m) : v(some(m.v)), pos(some(m.pos)), w(some(m.w)) {
    args = m.host();
    args.v = v.get(), args.positions = pos.get(), args.weights = w.get();
  }
};

TEST_P(CudaSmallKv, AddMarginalIsTheReferenceBackendsBits) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  uint32_t seed = 200;
  for (size_t n : kCounts) {
    SCOPED_TRACE("marginal " + std::to_string(n));
    const int32_t mid = n ? int32_t(2 * (n / 2) + 1) : 0;
    // Everything; up to the middle row; exactly the first; nothing.
    const Queries qs = make_queries(c, {INT32_MAX, mid, 1, 0}, seed++, 1.0f);
    const size_t rows = qs.pos.size();
    const Marginal m = make_marginal(n, rows, c.dim, seed++);
    const std::vector<float> before = kvsdk_test::random_floats(rows * c.dim, seed++);
    std::vector<float> want = before;
    backend::WorkspaceHandle ref_ws(ref);
    ref.smallkv_add_marginal(qs.rows(c), m.host(), ref_ws.get(), want.data());

    const DeviceQueries dq(qs, c);
    const DeviceMarginal dm(m);
    DeviceBuffer<float> dout(before);
    backend::WorkspaceHandle ws(ops);
    ops.smallkv_add_marginal(dq.rows, dm.args, ws.get(), dout.get());
    const std::vector<float> got = dout.download();
    ASSERT_TRUE(same_bits(got.data(), want.data(), got.size()));
    // The rows that see no marginal row are unchanged (rescaled by exactly 1).
    for (size_t i = 3 * c.group * c.dim; i < rows * c.dim; ++i) ASSERT_EQ(got[i], before[i]);
  }
}

// The large model's full rows: positions 2t (t >= 1), between the marginal rows' odd ones.
struct Full {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> pos;
  backend::F16Rows host() const { return {k.data(), v.data(), pos.data(), pos.size()}; }
};
Full make_full(size_t n, size_t dim, uint32_t seed) {
  Full f;
  f.k = to_f16(kvsdk_test::random_floats(n * dim, seed));
  f.v = to_f16(kvsdk_test::random_floats(n * dim, seed + 1));
  for (size_t t = 0; t < n; ++t) f.pos.push_back(int32_t(2 * t + 2));
  return f;
}
struct DeviceFull {
  DeviceBuffer<uint16_t> k, v;
  DeviceBuffer<int32_t> pos;
  backend::F16Rows args;
  explicit DeviceFull(const Full& f) : k(some(f.k)), v(some(f.v)), pos(some(f.pos)) {
    args = f.host();
    args.k = k.get(), args.v = v.get(), args.positions = pos.get();
  }
};

TEST_P(CudaSmallKv, AttentionMatchesTheReferenceBackend) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  uint32_t seed = 300;
  for (size_t n_full : kCounts)
  for (size_t n_marg : {size_t(0), size_t(17), size_t(300)}) {
    SCOPED_TRACE("full " + std::to_string(n_full) + " marginal " + std::to_string(n_marg));
    const int32_t last = int32_t(2 * std::max(n_full, n_marg) + 2);
    // Everything; half of the rows; only marginal row 0 (position 1); nothing.
    const Queries qs = make_queries(c, {INT32_MAX, last / 2, 1, -1}, seed++, 1.0f);
    const size_t rows = qs.pos.size(), out_size = rows * c.dim;
    const Full f = make_full(n_full, c.dim, seed++);
    const Marginal m = make_marginal(n_marg, rows, c.dim, seed++);
    std::vector<float> want(out_size, NAN), plain(out_size, NAN);
    backend::WorkspaceHandle ref_ws(ref);
    ref.attend_smallkv(qs.rows(c), f.host(), m.host(), ref_ws.get(), want.data());
    ref.attend_smallkv(qs.rows(c), f.host(), Marginal{}.host(), ref_ws.get(), plain.data());
    if (n_marg > 0) {  // the marginal term matters far beyond the tolerance
      float moved = 0.0f;
      for (size_t i = 0; i < out_size; ++i) moved = std::max(moved, std::fabs(want[i] - plain[i]));
      ASSERT_GT(moved, 1e-2f);
    }

    const DeviceQueries dq(qs, c);
    const DeviceFull df(f);
    const DeviceMarginal dm(m);
    backend::WorkspaceHandle ws(ops);
    DeviceBuffer<float> dout(std::vector<float>(out_size, NAN));
    ops.attend_smallkv(dq.rows, df.args, dm.args, ws.get(), dout.get());
    const std::vector<float> got = dout.download();
    for (size_t i = 0; i < out_size; ++i) ASSERT_NEAR(got[i], want[i], 2e-4) << "element " << i;
    for (size_t i = 3 * c.group * c.dim; i < out_size; ++i) ASSERT_EQ(got[i], 0.0f);  // sees none

    // Within the table: no marginal rows is attend_f16 over the full rows, and the marginal
    // term added afterwards is the same bits as in one call.
    DeviceBuffer<float> dplain(std::vector<float>(out_size, NAN));
    ops.attend_smallkv(dq.rows, df.args, backend::SmallKvMarginal{}, ws.get(), dplain.get());
    DeviceBuffer<float> df16(std::vector<float>(out_size, NAN));
    ops.attend_f16(dq.rows, df.args, ws.get(), df16.get());
    const std::vector<float> got_plain = dplain.download(), got_f16 = df16.download();
    ASSERT_TRUE(same_bits(got_plain.data(), got_f16.data(), out_size));
    for (size_t i = 0; i < out_size; ++i) ASSERT_NEAR(got_plain[i], plain[i], 2e-4) << i;
    ops.smallkv_add_marginal(dq.rows, dm.args, ws.get(), dplain.get());
    const std::vector<float> later = dplain.download();
    ASSERT_TRUE(same_bits(later.data(), got.data(), out_size));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSmallKv,
                         ::testing::Values(Case{64, 1}, Case{64, 4}, Case{128, 2}, Case{128, 4},
                                           Case{256, 1}, Case{256, 2}),
                         case_name);

// The launchers check their arguments on the host (a device pointer cannot be inspected there).
TEST(CudaSmallKvArgs, MarginalRowsNeedTheirBuffersAndAStrideThatHoldsThem) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const backend::Ops& ops = *device_backend().ops;
  const size_t dim = 64, rows = 2, n = 8;
  DeviceBuffer<float> q(std::vector<float>(rows * dim, 0.5f)), out(rows * dim);
  DeviceBuffer<int32_t> qpos(std::vector<int32_t>(rows, INT32_MAX));
  DeviceBuffer<int32_t> vpos(std::vector<int32_t>(n, 0));
  DeviceBuffer<uint16_t> v(std::vector<uint16_t>(n * dim, 0x3c00));  // 1.0
  DeviceBuffer<float> w(std::vector<float>(rows * n, 0.01f));
  backend::QueryRows qr{q.get(), qpos.get(), rows, dim, 0.125f};
  backend::WorkspaceHandle ws(ops);
  const auto status = [&](const backend::SmallKvMarginal& m) {
    try {
      ops.smallkv_add_marginal(qr, m, ws.get(), out.get());
    } catch (const Error& e) {
      return e.status();
    }
    return KVSDK_OK;
  };
  EXPECT_EQ(status({v.get(), vpos.get(), n, nullptr, n}), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status({v.get(), vpos.get(), n, w.get(), n - 1}), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status({v.get(), vpos.get(), n, w.get(), n}), KVSDK_OK);
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kvsdk::cuda
