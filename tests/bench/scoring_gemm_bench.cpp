// Micro-benchmark (issue 15): the GEMM part of window scoring, Q K^T of one KV head's window rows
// (32 queries x 4 query heads = 128 rows, head_dim 128) against 32k keys, computed by
//   BM_HighwayLogits    the Highway kernel's pass 1 (cpu::attention_logits: lanes across keys,
//                       the reference's partial sums, no FMA; keys through the chunk loader
//                       and transposed, as in production);
//   BM_OpenBlasSgemm    OpenBLAS cblas_sgemm on one thread (the whole f32 key matrix at once);
// and the whole scoring kernel (BM_HighwayColumnSums: logits + softmax + column sums) for scale.
// The "mismatch" counter of the sgemm run is the fraction of logits whose bits differ from the
// Highway kernel's, i.e. from the scalar reference's (BLAS uses FMA and its own blocking, chosen
// per CPU at run time): scores from it would not be portable. Built only where OpenBLAS is found.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention_scores.h"

namespace {

constexpr size_t kRows = 128, kDim = 128, kKeys = 32768;
const float kScale = 1.0f / std::sqrt(float(kDim));

struct Data {
  std::vector<float> q, k;
  std::vector<int32_t> qpos, kpos;
  Data() : q(kRows * kDim), k(kKeys * kDim), qpos(kRows, INT32_MAX), kpos(kKeys) {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (float& f : q) f = g(rng);
    for (float& f : k) f = g(rng);
    for (size_t t = 0; t < kKeys; ++t) kpos[t] = int32_t(t);
  }
  kvsdk::cpu::KeyChunkLoader loader() const {
    return [this](size_t first, size_t n, float* dst) {
      std::memcpy(dst, k.data() + first * kDim, n * kDim * sizeof(float));
    };
  }
};

const Data& data() {
  static const Data d;
  return d;
}

void BM_HighwayLogits(benchmark::State& state) {
  const Data& d = data();
  kvsdk::cpu::ColumnSumsScratch s;
  size_t stride = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kvsdk::cpu::attention_logits(d.q.data(), kRows, kDim, kScale,
                                                          d.loader(), kKeys, s, &stride));
  }
  state.counters["GMAC/s"] = benchmark::Counter(double(kRows) * kKeys * kDim * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_OpenBlasSgemm(benchmark::State& state) {
  const Data& d = data();
  openblas_set_num_threads(1);
  std::vector<float> logits(kRows * kKeys);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(kRows), int(kKeys), int(kDim), kScale,
                d.q.data(), int(kDim), d.k.data(), int(kDim), 0.0f, logits.data(), int(kKeys));
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(double(kRows) * kKeys * kDim * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  // Bits against the Highway kernel (= the scalar reference: dot * scale, not alpha-scaled).
  kvsdk::cpu::ColumnSumsScratch s;
  size_t stride = 0;
  const float* ref = kvsdk::cpu::attention_logits(d.q.data(), kRows, kDim, kScale, d.loader(),
                                                  kKeys, s, &stride);
  size_t differ = 0;
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t t = 0; t < kKeys; ++t) differ += ref[r * stride + t] != logits[r * kKeys + t];
  }
  state.counters["mismatch"] = double(differ) / double(kRows * kKeys);
}

void BM_HighwayColumnSums(benchmark::State& state) {
  const Data& d = data();
  kvsdk::cpu::ColumnSumsScratch s;
  std::vector<float> cols(kKeys);
  for (auto _ : state) {
    std::fill(cols.begin(), cols.end(), 0.0f);
    kvsdk::cpu::attention_column_sums(d.q.data(), d.qpos.data(), kRows, kDim, kScale, d.loader(),
                                      d.kpos.data(), kKeys, cols.data(), s);
    benchmark::DoNotOptimize(cols.data());
  }
}

}  // namespace

BENCHMARK(BM_HighwayLogits)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_OpenBlasSgemm)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_HighwayColumnSums)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_MAIN();
