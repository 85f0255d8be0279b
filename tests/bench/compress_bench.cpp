// Benchmark: time of kvsdk_cache_compress (via a per-cache budget of 20% of the cache) for a
// 32k-token Llama-3-8B-like cache (32 query heads, 8 KV heads, head_dim 128), as a ratio to one
// dense attention pass of the observation window (32 queries) over the same cache, measured in
// the same run. KVSDK_BENCH_LAYERS (default 4) sets the layer count: both sides scale linearly
// with layers, so the ratio does not depend on it, while 32 layers would need ~4.3 GB and minutes
// per iteration on a small machine. KVSDK_BENCH_TOKENS overrides 32768.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"

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
    kvsdk_context_create(&ctx, nullptr);
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

void BM_DenseWindowAttention(benchmark::State& state) {
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

// Prints each compress time as a ratio to the dense window attention measured in this run.
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
    std::pair<double, double> base{0, 0};
    for (const auto& [name, t] : times_) {
      if (name.rfind("BM_DenseWindowAttention", 0) == 0) base = t;
    }
    std::printf("\nlayers=%u tokens=%u q_heads=%u kv_heads=%u head_dim=%u window=%u\n", kLayers,
                kTokens, kQHeads, kKvHeads, kDim, kWindow);
    // Single-threaded work: CPU time is the robust figure on a shared machine.
    for (const auto& [name, t] : times_) {
      if (base.first > 0 && base.second > 0) {
        std::printf("%-48s real %10.1f ms (ratio %.3f)  cpu %10.1f ms (ratio %.3f)\n",
                    name.c_str(), t.first, t.first / base.first, t.second, t.second / base.second);
      }
    }
  }

 private:
  std::map<std::string, std::pair<double, double>> times_;  // real, cpu
};

}  // namespace

BENCHMARK(BM_DenseWindowAttention)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
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
