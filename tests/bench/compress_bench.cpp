// Benchmark: time of kvsdk_cache_compress (via a per-cache budget of 20% of the cache) for a
// 32k-token Llama-3-8B-like cache (32 query heads, 8 KV heads, head_dim 128), as a ratio to one
// dense attention pass of the observation window (32 queries) over the same cache, measured in
// the same run. Two baselines:
//   BM_FastWindowAttention       the optimized kernel (cpu::fast::attend_f16, Highway SIMD) over
//                                each layer's f16 rows, per KV head with the 32 window queries of
//                                its 4 query heads (128 rows) -- the ratio issue 15 bounds;
//   BM_ReferenceWindowAttention  the scalar reference kvsdk_cache_attend of the 32 queries.
// KVSDK_BENCH_LAYERS (default 4) sets the layer count: both sides scale linearly
// with layers, so the ratio does not depend on it, while 32 layers would need ~4.3 GB and minutes
// per iteration on a small machine. KVSDK_BENCH_TOKENS overrides 32768. Everything runs on one
// thread.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fast_attention.h"
#include "kvsdk.h"
#include "util/half.h"

namespace {

uint32_t env_or(const char* name, uint32_t def) {
  const char* v = std::getenv(name);
  return v ? uint32_t(std::strtoul(v, nullptr, 10)) : def;
}

const uint32_t kLayers = env_or("KVSDK_BENCH_LAYERS", 4);
const uint32_t kTokens = env_or("KVSDK_BENCH_TOKENS", 32768);
constexpr uint32_t kQHeads = 32, kKvHeads = 8, kDim = 128, kWindow = 32;

kvsdk_geometry geometry() {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = kLayers;
  g.n_q_heads = kQHeads;
  g.n_kv_heads = kKvHeads;
  g.head_dim = kDim;
  g.dtype = KVSDK_DTYPE_F16;
  return g;
}

struct Inputs {
  std::vector<uint16_t> kv;  // shared random f16 keys/values for every layer
  std::vector<uint16_t> q;   // the observation window
  std::vector<int32_t> pos, qpos;
  Inputs() {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    auto f16 = [&](float x) {  // small exact conversion: sign, exponent, 10-bit mantissa
      _Float16 h = static_cast<_Float16>(x);
      uint16_t u;
      __builtin_memcpy(&u, &h, 2);
      return u;
    };
    kv.resize(size_t(kTokens) * kKvHeads * kDim);
    for (auto& x : kv) x = f16(d(rng));
    q.resize(size_t(kWindow) * kQHeads * kDim);
    for (auto& x : q) x = f16(d(rng));
    pos.resize(kTokens);
    for (uint32_t i = 0; i < kTokens; ++i) pos[i] = int32_t(i);
    qpos.resize(kWindow);
    for (uint32_t i = 0; i < kWindow; ++i) qpos[i] = int32_t(kTokens - kWindow + i);
  }
};

const Inputs& inputs() {
  static const Inputs in;
  return in;
}

struct Cache {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  explicit Cache(const char* preset) {
    const Inputs& in = inputs();
    const kvsdk_geometry g = geometry();
    kvsdk_policy p;
    kvsdk_policy_parse(&p, preset);
    kvsdk_context_options o;
    kvsdk_context_options_init(&o);
    o.n_threads = 1;  // one thread, like the optimized baseline
    kvsdk_context_create(&ctx, &o);
    if (kvsdk_cache_create(&cache, ctx, &g, &p) != KVSDK_OK) std::abort();
    for (uint32_t l = 0; l < kLayers; ++l) {
      if (kvsdk_cache_append(cache, l, kTokens, in.kv.data(), in.kv.data(), in.pos.data(),
                             in.kv.size() * 2) != KVSDK_OK ||
          kvsdk_cache_observe(cache, l, kWindow, in.q.data(), in.qpos.data(), in.q.size() * 2) !=
              KVSDK_OK) {
        std::abort();
      }
    }
  }
  ~Cache() {
    kvsdk_cache_destroy(cache);
    kvsdk_context_destroy(ctx);
  }
};

// The optimized dense pass: per layer and KV head, attend_f16 of the group's 128 window rows
// (query i of query head kv_head * 4 + j is row i * 4 + j, as the window scoring orders them)
// over the head's f16 rows. The per-head row arrays are split out of the interleaved host
// tensors before timing (every layer holds the same rows, as in the cache).
void BM_FastWindowAttention(benchmark::State& state) {
  const Inputs& in = inputs();
  constexpr uint32_t kGroup = kQHeads / kKvHeads, kRows = kWindow * kGroup;
  std::vector<std::vector<uint16_t>> k(kKvHeads), v(kKvHeads);
  std::vector<std::vector<float>> q(kKvHeads);
  for (uint32_t h = 0; h < kKvHeads; ++h) {
    k[h].resize(size_t(kTokens) * kDim);
    for (uint32_t t = 0; t < kTokens; ++t) {
      std::copy_n(in.kv.data() + (size_t(t) * kKvHeads + h) * kDim, kDim,
                  k[h].data() + size_t(t) * kDim);
    }
    v[h] = k[h];  // the bench appends the same tensor as keys and values
    q[h].resize(size_t(kRows) * kDim);
    for (uint32_t i = 0; i < kWindow; ++i) {
      for (uint32_t j = 0; j < kGroup; ++j) {
        const uint16_t* src = in.q.data() + (size_t(i) * kQHeads + h * kGroup + j) * kDim;
        float* dst = q[h].data() + (size_t(i) * kGroup + j) * kDim;
        for (uint32_t c = 0; c < kDim; ++c) dst[c] = kvsdk::f16_to_f32(src[c]);
      }
    }
  }
  std::vector<int32_t> row_pos(kRows);
  for (uint32_t r = 0; r < kRows; ++r) row_pos[r] = in.qpos[r / kGroup];
  kvsdk::cpu::fast::Scratch scratch;
  scratch.reserve(kRows, kDim);
  std::vector<float> out(size_t(kRows) * kDim);
  const float scale = 1.0f / std::sqrt(float(kDim));
  for (auto _ : state) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kKvHeads; ++h) {
        const kvsdk::cpu::fast::Queries qs{q[h].data(), row_pos.data(), kRows, kDim, scale};
        kvsdk::cpu::fast::attend_f16(qs, k[h].data(), v[h].data(), in.pos.data(), kTokens,
                                     scratch, out.data());
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
}

// The scalar reference: kvsdk_cache_attend of the 32 window queries on every layer.
void BM_ReferenceWindowAttention(benchmark::State& state) {
  Cache c("full");
  const Inputs& in = inputs();
  std::vector<uint16_t> out(in.q.size());
  for (auto _ : state) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      kvsdk_cache_attend(c.cache, l, kWindow, in.q.data(), in.qpos.data(), in.q.size() * 2,
                         out.data(), out.size() * 2);
    }
    benchmark::DoNotOptimize(out.data());
  }
}

void BM_Compress(benchmark::State& state, const char* preset) {
  for (auto _ : state) {
    state.PauseTiming();
    auto c = std::make_unique<Cache>(preset);
    kvsdk_cache_stats s;
    s.struct_size = sizeof(s);
    kvsdk_cache_stats_get(c->cache, &s);
    state.ResumeTiming();
    // A budget of 20% of what the cache holds: the policy scores, allocates and evicts.
    if (kvsdk_cache_set_budget(c->cache, s.bytes / 5) != KVSDK_OK) std::abort();
    state.PauseTiming();
    c.reset();
    state.ResumeTiming();
  }
}

// Prints each time as a ratio to both dense window-attention baselines measured in this run.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      times_[r.benchmark_name()] = {r.GetAdjustedRealTime(), r.GetAdjustedCPUTime()};
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::pair<double, double> fast{0, 0}, ref{0, 0};
    for (const auto& [name, t] : times_) {
      if (name.rfind("BM_FastWindowAttention", 0) == 0) fast = t;
      if (name.rfind("BM_ReferenceWindowAttention", 0) == 0) ref = t;
    }
    std::printf("\nlayers=%u tokens=%u q_heads=%u kv_heads=%u head_dim=%u window=%u\n", kLayers,
                kTokens, kQHeads, kKvHeads, kDim, kWindow);
    // Single-threaded work: CPU time is the robust figure on a shared machine. A ratio is
    // printed only when its baseline ran (nan otherwise).
    const auto ratio = [](double t, double base) { return base > 0 ? t / base : std::nan(""); };
    std::printf("%-48s %10s %10s %9s %9s\n", "", "cpu ms", "real ms", "cpu/fast", "cpu/ref");
    for (const auto& [name, t] : times_) {
      std::printf("%-48s %10.1f %10.1f %9.3f %9.3f\n", name.c_str(), t.second, t.first,
                  ratio(t.second, fast.second), ratio(t.second, ref.second));
    }
  }

 private:
  std::map<std::string, std::pair<double, double>> times_;  // real, cpu
};

}  // namespace

BENCHMARK(BM_FastWindowAttention)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK(BM_ReferenceWindowAttention)
    ->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compress, streaming_llm, "streaming_llm")
    ->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compress, h2o, "h2o")->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compress, snapkv, "snapkv")
    ->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compress, pyramidkv, "pyramidkv")
    ->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compress, xkv, "xkv")->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
