// The device scoring kernel against the CPU reference backend's column_sums (the oracle): the
// same bits (cuda_column_sums.h says why: the selection, and so the kept rows, must be the CPU's),
// over KIVI-quantized keys (every bit width, regular and ragged key blocks, widened by the
// reference backend's kivi_dequantize_keys), f16 rows held on the device and f32 incoming rows,
// causal masks, a row that sees nothing, logits whose exponentials underflow, and rows taken in
// blocks.
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
  size_t quant = 0;  // KIVI-quantized keys first
  uint32_t bits = 2;
  std::vector<uint32_t> blocks = {};  // tokens of each key block; empty: blocks of kGroup
};

constexpr uint32_t kGroup = 32;

struct Inputs {
  std::vector<float> q, tail_k;
  std::vector<uint16_t> held_k;
  std::vector<int32_t> q_pos, key_pos;  // key_pos: quant's, held's, then tail's
  // The quantized keys (KIVI's per-channel key blocks) and each block's first token.
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scale, zero;
  std::vector<uint32_t> block_starts;
  size_t row_bytes = 0;
};

size_t n_keys(const Case& c) { return c.quant + c.held + c.tail; }

Inputs make_inputs(const Case& c, uint32_t seed) {
  const backend::Ops& ref = backend::cpu_reference();
  Inputs in;
  in.q = test::random_floats(c.rows * c.dim, seed);
  if (c.quant) {
    std::vector<uint32_t> sizes = c.blocks;
    if (sizes.empty()) sizes.assign(c.quant / kGroup, kGroup);
    in.row_bytes = (c.dim * c.bits + 7) / 8;
    in.codes.resize(c.quant * in.row_bytes);
    in.scale.resize(sizes.size() * c.dim);
    in.zero.resize(sizes.size() * c.dim);
    const auto k = test::random_floats(c.quant * c.dim, seed + 3);
    size_t first = 0;
    for (size_t b = 0; b < sizes.size(); ++b) {
      in.block_starts.push_back(uint32_t(first));
      ref.kivi_quantize_keys(k.data() + first * c.dim, sizes[b], c.dim, c.bits,
                             in.codes.data() + first * in.row_bytes, in.scale.data() + b * c.dim,
                             in.zero.data() + b * c.dim);
      first += sizes[b];
    }
    EXPECT_EQ(first, c.quant) << "the blocks cover the quantized keys";
  }
  const auto held = test::random_floats(c.held * c.dim, seed + 1);
  in.held_k.resize(held.size());
  backend::cpu_reference().f32_to_f16(held.data(), held.size(), in.held_k.data());
  in.tail_k = test::random_floats(c.tail * c.dim, seed + 2);
  // Positions with gaps (evicted rows), so that rows see different prefixes.
  for (size_t t = 0; t < n_keys(c); ++t) in.key_pos.push_back(int32_t(2 * t + t % 3));
  const int32_t last = in.key_pos.empty() ? 0 : in.key_pos.back();
  for (size_t r = 0; r < c.rows; ++r) {
    // Row 0 sees no key; the rest see growing prefixes, the last row every key.
    in.q_pos.push_back(r == 0 ? -1 : r + 1 == c.rows ? last : int32_t(r * last / c.rows));
  }
  return in;
}

// The reference backend's column sums over the same keys: the quantized ones dequantized by its
// kivi_dequantize_keys (block by block), the held ones widened from f16, then the tail.
std::vector<float> reference(const Case& c, const Inputs& in) {
  const backend::Ops& ref = backend::cpu_reference();
  const auto load = [&](size_t first, size_t n, float* out) {
    for (size_t t = first; t < first + n; ++t, out += c.dim) {
      if (t < c.quant) {
        size_t b = 0;
        while (b + 1 < in.block_starts.size() && in.block_starts[b + 1] <= t) ++b;
        const size_t b0 = in.block_starts[b];
        ref.kivi_dequantize_keys(in.codes.data() + b0 * in.row_bytes, in.scale.data() + b * c.dim,
                                 in.zero.data() + b * c.dim, t - b0, 1, c.dim, c.bits, out);
      } else if (t < c.quant + c.held) {
        ref.f16_to_f32(in.held_k.data() + (t - c.quant) * c.dim, c.dim, out);
      } else {
        std::memcpy(out, in.tail_k.data() + (t - c.quant - c.held) * c.dim,
                    c.dim * sizeof(float));
      }
    }
  };
  std::vector<float> cols(n_keys(c), 0.0f);
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
  shape.quant = c.quant;
  shape.held = c.held;
  shape.tail = c.tail;
  const auto pos = in.key_pos.begin();
  const auto at_least_one = [](auto v) { return v.empty() ? decltype(v)(1) : v; };
  std::vector<int32_t> quant_pos(pos, pos + c.quant);
  std::vector<int32_t> held_pos(pos + c.quant, pos + c.quant + c.held);
  std::vector<int32_t> tail_pos(pos + c.quant + c.held, in.key_pos.end());
  test::DeviceBuffer<uint8_t> codes(at_least_one(in.codes));
  test::DeviceBuffer<uint16_t> scale(at_least_one(in.scale)), zero(at_least_one(in.zero));
  test::DeviceBuffer<int32_t> qpos_d(at_least_one(quant_pos));
  // Ragged cases pass their block starts; regular ones leave the kernel to divide by kGroup.
  test::DeviceBuffer<uint32_t> starts(at_least_one(in.block_starts));
  QuantKeys quant;
  quant.codes = codes.get();
  quant.scale = scale.get();
  quant.zero = zero.get();
  quant.positions = qpos_d.get();
  quant.block_starts = c.blocks.empty() ? nullptr : starts.get();
  quant.blocks = in.block_starts.size();
  quant.bits = c.bits;
  quant.group = kGroup;
  test::DeviceBuffer<float> q(in.q), tail(at_least_one(in.tail_k));
  test::DeviceBuffer<uint16_t> held(at_least_one(in.held_k));
  test::DeviceBuffer<int32_t> q_pos(in.q_pos), hp(at_least_one(held_pos)), tp(at_least_one(tail_pos));
  test::DeviceBuffer<float> work(column_sums_workspace(shape, max_logits));
  // Poisoned output: the kernel overwrites every column.
  test::DeviceBuffer<float> cols(std::vector<float>(n_keys(c), 12345.0f));
  column_sums(q.get(), q_pos.get(), quant, held.get(), hp.get(), tail.get(), tp.get(), shape, max_logits,
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
      // KIVI-quantized keys, then the residual rows and an append's: every bit width, regular
      // key blocks and ragged ones (an eviction's retain leaves blocks of any size).
      {8, 128, 40, 2, 0.088f, 96, 1},
      {8, 128, 40, 2, 0.088f, 96, 2},
      {8, 64, 17, 0, 0.125f, 128, 4},
      {4, 64, 3, 5, 0.125f, 64, 8},
      {8, 128, 40, 2, 0.088f, 83, 2, {32, 5, 17, 1, 28}},
      {6, 64, 0, 3, 0.125f, 45, 4, {9, 32, 4}},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " dim " + std::to_string(c.dim) + " held " +
                 std::to_string(c.held) + " tail " + std::to_string(c.tail) + " quant " +
                 std::to_string(c.quant) + " bits " + std::to_string(c.bits) +
                 (c.blocks.empty() ? "" : " ragged"));
    const Inputs in = make_inputs(c, seed += 10);
    const std::vector<float> want = reference(c, in);
    float total = 0.0f;
    for (float x : want) total += x;
    EXPECT_GT(total, 0.0f) << "rows saw keys";
    // One block of every row, then blocks of 3 rows and of 1 (the columns add in row order
    // across blocks, as the reference does).
    for (size_t max_logits : {size_t(1) << 22, 3 * n_keys(c), size_t(1)}) {
      EXPECT_TRUE(same_bits(on_device(c, in, max_logits), want)) << "max_logits " << max_logits;
    }
  }
}

TEST(CudaColumnSums, NoRowsGiveZeroColumns) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c{0, 64, 40, 2, 0.125f, 32, 2};
  const Inputs in = make_inputs(c, 3);
  EXPECT_EQ(on_device(c, in, 1024), std::vector<float>(74, 0.0f));
}

}  // namespace
}  // namespace kvsdk::cuda
