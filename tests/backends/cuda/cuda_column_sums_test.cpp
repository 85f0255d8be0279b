// The device scoring kernel against the CPU reference backend's column_sums (the oracle): the
// same bits (cuda_column_sums.h says why: the selection, and so the kept rows, must be the CPU's),
// over f16 rows held on the device and f32 incoming rows, causal masks, a row that sees nothing,
// logits whose exponentials underflow, and rows taken in blocks.
#include "cuda_column_sums.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend_ops.h"
#include "cuda_test_util.h"

namespace kvsdk::cuda {
namespace {

struct Case {
  size_t rows, dim, held, tail;
  float scale;
};

struct Inputs {
  std::vector<float> q, tail_k;
  std::vector<uint16_t> held_k;
  std::vector<int32_t> q_pos, key_pos;  // key_pos: held's, then tail's
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  Inputs in;
  in.q = test::random_floats(c.rows * c.dim, seed);
  const auto held = test::random_floats(c.held * c.dim, seed + 1);
  in.held_k.resize(held.size());
  backend::cpu_reference().f32_to_f16(held.data(), held.size(), in.held_k.data());
  in.tail_k = test::random_floats(c.tail * c.dim, seed + 2);
  // Positions with gaps (evicted rows), so that rows see different prefixes.
  for (size_t t = 0; t < c.held + c.tail; ++t) in.key_pos.push_back(int32_t(2 * t + t % 3));
  const int32_t last = in.key_pos.empty() ? 0 : in.key_pos.back();
  for (size_t r = 0; r < c.rows; ++r) {
    // Row 0 sees no key; the rest see growing prefixes, the last row every key.
    in.q_pos.push_back(r == 0 ? -1 : r + 1 == c.rows ? last : int32_t(r * last / c.rows));
  }
  return in;
}

// The reference backend's column sums over the same keys (held widened from f16, then the tail).
std::vector<float> reference(const Case& c, const Inputs& in) {
  const backend::Ops& ref = backend::cpu_reference();
  const auto load = [&](size_t first, size_t n, float* out) {
    for (size_t t = first; t < first + n; ++t, out += c.dim) {
      if (t < c.held) {
        ref.f16_to_f32(in.held_k.data() + t * c.dim, c.dim, out);
      } else {
        std::memcpy(out, in.tail_k.data() + (t - c.held) * c.dim, c.dim * sizeof(float));
      }
    }
  };
  std::vector<float> cols(c.held + c.tail, 0.0f);
  backend::WorkspaceHandle ws(ref);
  const backend::QueryRows q{in.q.data(), in.q_pos.data(), c.rows, c.dim, c.scale};
  ref.column_sums(q, load, in.key_pos.data(), cols.size(), ws.get(), cols.data());
  return cols;
}

std::vector<float> on_device(const Case& c, const Inputs& in, size_t max_logits) {
  ColumnSumsShape shape;
  shape.rows = c.rows;
  shape.dim = c.dim;
  shape.scale = c.scale;
  shape.held = c.held;
  shape.tail = c.tail;
  std::vector<int32_t> held_pos(in.key_pos.begin(), in.key_pos.begin() + c.held);
  std::vector<int32_t> tail_pos(in.key_pos.begin() + c.held, in.key_pos.end());
  test::DeviceBuffer<float> q(in.q), tail(in.tail_k.empty() ? std::vector<float>(1) : in.tail_k);
  test::DeviceBuffer<uint16_t> held(in.held_k);
  test::DeviceBuffer<int32_t> q_pos(in.q_pos), hp(held_pos.empty() ? std::vector<int32_t>(1) : held_pos),
      tp(tail_pos.empty() ? std::vector<int32_t>(1) : tail_pos);
  test::DeviceBuffer<float> work(column_sums_workspace(shape, max_logits));
  // Poisoned output: the kernel overwrites every column.
  test::DeviceBuffer<float> cols(std::vector<float>(c.held + c.tail, 12345.0f));
  column_sums(q.get(), q_pos.get(), held.get(), hp.get(), tail.get(), tp.get(), shape, max_logits,
              work.get(), cols.get(), nullptr);
  return cols.download();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaColumnSums, TheReferenceBackendsBits) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case cases[] = {
      {12, 64, 300, 37, 0.125f},   // held rows and an append's incoming ones
      {8, 128, 513, 0, 0.088f},    // an observe: the held rows alone
      {5, 128, 0, 70, 0.088f},     // nothing held yet
      {6, 256, 200, 3, 4.0f},      // large logits: most exponentials underflow to 0
      {4, 66, 50, 9, 0.25f},       // a head_dim that is not a multiple of 4 (sum 0 takes the rest)
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " dim " + std::to_string(c.dim) + " held " +
                 std::to_string(c.held) + " tail " + std::to_string(c.tail));
    const Inputs in = make_inputs(c, seed += 10);
    const std::vector<float> want = reference(c, in);
    float total = 0.0f;
    for (float x : want) total += x;
    EXPECT_GT(total, 0.0f) << "rows saw keys";
    // One block of every row, then blocks of 3 rows and of 1 (the columns add in row order
    // across blocks, as the reference does).
    const size_t n_keys = c.held + c.tail;
    for (size_t max_logits : {size_t(1) << 22, 3 * n_keys, size_t(1)}) {
      EXPECT_TRUE(same_bits(on_device(c, in, max_logits), want)) << "max_logits " << max_logits;
    }
  }
}

TEST(CudaColumnSums, NoRowsGiveZeroColumns) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c{0, 64, 40, 2, 0.125f};
  const Inputs in = make_inputs(c, 3);
  EXPECT_EQ(on_device(c, in, 1024), std::vector<float>(42, 0.0f));
}

}  // namespace
}  // namespace kvsdk::cuda
