// Observation-window scoring (cuBLAS batched GEMM + masked softmax) vs the CPU reference backend's
// column_sums (what SnapKV's planner runs) on the same f16 inputs: one call per query row gives
// that row's probabilities, one call over the group's rows their column sums. Tolerance: 1e-5
// absolute on probabilities (f32 accumulation of f16 products in a different order, expf), 1e-4
// on their column sums.
#include "cuda_window_scoring.h"

#include <gtest/gtest.h>

#include <cmath>

#include "backend_ops.h"
#include "cuda_test_util.h"
#include "util/half_array.h"
#include "util/error.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

using test::DeviceBuffer;

TEST(CudaWindowScoring, CausalSoftmaxMatchesTheCpuReference) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  WindowShape s;
  s.kv_heads = 2, s.group = 4, s.window = 8, s.tokens = 200, s.dim = 64, s.key_stride = 208;
  const float scale = 1.0f / 8.0f;
  const size_t rows = s.group * s.window;
  std::vector<uint16_t> q(s.kv_heads * rows * s.dim), k(s.kv_heads * s.key_stride * s.dim);
  const auto qf = test::random_floats(q.size(), 1), kf = test::random_floats(k.size(), 2);
  for (size_t i = 0; i < q.size(); ++i) q[i] = f32_to_f16(qf[i]);
  for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_f16(kf[i]);
  std::vector<int32_t> qpos(s.window), kpos(s.kv_heads * s.key_stride);
  for (size_t i = 0; i < s.window; ++i) qpos[i] = int32_t(190 + i);  // the last keys are masked
  for (size_t h = 0; h < s.kv_heads; ++h) {
    for (size_t t = 0; t < s.key_stride; ++t) kpos[h * s.key_stride + t] = int32_t(t);
  }
  DeviceBuffer<uint16_t> dq(q), dk(k);
  DeviceBuffer<int32_t> dqp(qpos), dkp(kpos);
  DeviceBuffer<float> probs(s.kv_heads * rows * s.tokens), scores(s.kv_heads * s.tokens);
  cublasHandle_t handle;
  ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&handle));
  window_attention_probs(handle, dq.get(), dk.get(), dqp.get(), dkp.get(), s, scale, probs.get(),
                         nullptr);
  window_scores_sum(probs.get(), s, scores.get(), nullptr);
  const auto p = probs.download(), sc = scores.download();
  cublasDestroy(handle);

  const backend::Ops& ref = backend::cpu_reference();
  backend::WorkspaceHandle ws(ref);
  for (size_t h = 0; h < s.kv_heads; ++h) {
    std::vector<float> qf32(rows * s.dim);
    std::vector<int32_t> rpos(rows);
    for (size_t r = 0; r < rows; ++r) {
      f16_to_f32_array(q.data() + (h * rows + r) * s.dim, qf32.data() + r * s.dim, s.dim);
      rpos[r] = qpos[r % s.window];
    }
    const cpu::KeyChunkLoader keys = [&](size_t first, size_t n, float* out) {
      f16_to_f32_array(k.data() + (h * s.key_stride + first) * s.dim, out, n * s.dim);
    };
    const int32_t* key_pos = kpos.data() + h * s.key_stride;
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float> want(s.tokens, 0.0f);
      ref.column_sums({qf32.data() + r * s.dim, &rpos[r], 1, s.dim, scale}, keys, key_pos, s.tokens,
                      ws.get(), want.data());
      for (size_t t = 0; t < s.tokens; ++t) {
        ASSERT_NEAR(p[(h * rows + r) * s.tokens + t], want[t], 1e-5) << h << "," << r << "," << t;
      }
    }
    std::vector<float> colsum(s.tokens, 0.0f);
    ref.column_sums({qf32.data(), rpos.data(), rows, s.dim, scale}, keys, key_pos, s.tokens,
                    ws.get(), colsum.data());
    for (size_t t = 0; t < s.tokens; ++t) EXPECT_NEAR(sc[h * s.tokens + t], colsum[t], 1e-4);
  }
}

TEST(CudaWindowScoringArgs, ZeroShapesAreInvalidArguments) {
  WindowShape s;  // all zero
  try {
    window_scores_sum(nullptr, s, nullptr, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG);
  }
}

}  // namespace
}  // namespace kvsdk::cuda
