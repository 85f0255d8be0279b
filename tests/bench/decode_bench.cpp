// Benchmark (issue 15): one decode step through the C API — kvsdk_cache_append of one token plus
// kvsdk_cache_attend of its query (SpeCache also prefetches the next step's rows) — on one
// Llama-3-8B-like layer (32 query heads, 8 KV heads, head_dim 128, f16 host tensors) holding 4k or
// 32k tokens, per preset, on contexts of 1 and 2 threads (kvsdk_context_options.n_threads).
// Printed in the same run:
//   x full     the step time of `full` with the same tokens and threads / this step time
//              (above 1: the preset decodes faster than the uncompressed cache)
//   x 1 thread this preset's 1-thread time / its time on this many threads
// The layer count does not matter for either ratio (every layer does the same work), so one layer
// keeps the 32k caches at ~140 MB each. KVSDK_BENCH_TOKENS="4096,32768" overrides the sizes;
// KVSDK_BENCH_KV_HEADS=1 runs the layer with multi-query attention instead (32 query heads on one
// KV head: the cache splits each head's tokens over the threads, split-K).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kvsdk.h"

namespace {

constexpr uint32_t kQHeads = 32, kDim = 128, kWindow = 32;

uint32_t kv_heads() {
  const char* v = std::getenv("KVSDK_BENCH_KV_HEADS");
  return v ? uint32_t(std::stoul(v)) : 8;
}
const uint32_t kKvHeads = kv_heads();

std::vector<uint32_t> token_counts() {
  const char* v = std::getenv("KVSDK_BENCH_TOKENS");
  std::vector<uint32_t> out;
  std::stringstream ss(v ? v : "4096,32768");
  for (std::string s; std::getline(ss, s, ',');) out.push_back(uint32_t(std::stoul(s)));
  return out;
}

uint16_t f16(float x) {
  _Float16 h = static_cast<_Float16>(x);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> x(n);
  for (auto& e : x) e = f16(d(rng));
  return x;
}

void check(kvsdk_status s, const char* what) {
  if (s != KVSDK_OK) {
    std::fprintf(stderr, "%s: %s\n", what, kvsdk_last_error());
    std::abort();
  }
}

// A preset as the benchmark runs it: its policy string and the share of the prefilled cache's
// bytes it is held to (1 = no budget).
struct Preset {
  const char* name;
  const char* spec;
  int quant_bits;  // 0 = the spec's
  double budget_share;
};

const Preset kPresets[] = {
    {"full", "full", 0, 1.0},
    {"kivi2", "kivi", 2, 1.0},
    {"kivi4", "kivi", 4, 1.0},
    {"snapkv25", "snapkv", 0, 0.25},
    {"xkv+kivi2_25", "xkv+kivi2", 0, 0.25},
    {"specache", "specache", 0, 1.0},
};

struct Step {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  std::vector<uint16_t> k1, v1, q, out;
  int32_t next = 0;
  bool prefetch = false;

  Step(const Preset& p, uint32_t tokens, int32_t threads) {
    kvsdk_context_options o;
    kvsdk_context_options_init(&o);
    o.n_threads = threads;
    check(kvsdk_context_create(&ctx, &o), "context");
    kvsdk_geometry g;
    kvsdk_geometry_init(&g);
    g.n_layers = 1, g.n_q_heads = kQHeads, g.n_kv_heads = kKvHeads, g.head_dim = kDim;
    g.dtype = KVSDK_DTYPE_F16;
    kvsdk_policy pol;
    check(kvsdk_policy_parse(&pol, p.spec), "policy");
    if (p.quant_bits) pol.quant_bits = p.quant_bits;
    check(kvsdk_cache_create(&cache, ctx, &g, &pol), "cache");
    prefetch = pol.method == KVSDK_METHOD_SPECACHE;
    const size_t kv = size_t(kKvHeads) * kDim, qe = size_t(kQHeads) * kDim;
    const std::vector<uint16_t> k = random_f16(tokens * kv, 1), v = random_f16(tokens * kv, 2);
    std::vector<int32_t> pos(tokens);
    for (uint32_t i = 0; i < tokens; ++i) pos[i] = int32_t(i);
    check(kvsdk_cache_append(cache, 0, tokens, k.data(), v.data(), pos.data(), k.size() * 2),
          "prefill");
    const std::vector<uint16_t> window = random_f16(kWindow * qe, 3);
    std::vector<int32_t> wpos(kWindow);
    for (uint32_t i = 0; i < kWindow; ++i) wpos[i] = int32_t(tokens - kWindow + i);
    check(kvsdk_cache_observe(cache, 0, kWindow, window.data(), wpos.data(), window.size() * 2),
          "observe");
    if (p.budget_share < 1.0) {
      kvsdk_cache_stats s;
      s.struct_size = sizeof(s);
      check(kvsdk_cache_stats_get(cache, &s), "stats");
      check(kvsdk_cache_set_budget(cache, uint64_t(double(s.bytes) * p.budget_share)), "budget");
    }
    k1 = random_f16(kv, 4), v1 = random_f16(kv, 5), q = random_f16(qe, 6);
    out.resize(qe);
    next = int32_t(tokens);
  }
  ~Step() {
    kvsdk_cache_destroy(cache);
    kvsdk_context_destroy(ctx);
  }
  void run() {
    const int32_t pos = next++;
    check(kvsdk_cache_append(cache, 0, 1, k1.data(), v1.data(), &pos, k1.size() * 2), "append");
    check(kvsdk_cache_observe(cache, 0, 1, q.data(), &pos, q.size() * 2), "observe");
    if (prefetch) check(kvsdk_cache_prefetch(cache, 0, 1, q.data(), &pos, q.size() * 2), "prefetch");
    check(kvsdk_cache_attend(cache, 0, 1, q.data(), &pos, q.size() * 2, out.data(), out.size() * 2),
          "attend");
  }
};

void BM_DecodeStep(benchmark::State& state, Preset p, uint32_t tokens, int32_t threads) {
  Step step(p, tokens, threads);
  for (int i = 0; i < 3; ++i) step.run();  // warm-up: scratch and workspaces reach their size
  for (auto _ : state) step.run();
}

// Prints each step time as ratios to `full` (same tokens and threads) and to 1 thread.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  using Key = std::tuple<std::string, uint32_t, int>;  // preset, tokens, threads
  static std::map<std::string, Key>& keys() {
    static std::map<std::string, Key> k;
    return k;
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      // The run's name carries Google Benchmark's suffixes (/min_time:..., /real_time).
      for (const auto& [name, key] : keys()) {
        if (r.benchmark_name().rfind(name + "/", 0) == 0) ms_[key] = r.GetAdjustedRealTime();
      }
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-14s %7s %7s %10s %8s %10s\n", "preset", "tokens", "threads", "step ms",
                "x full", "x 1 thread");
    for (const auto& [key, ms] : ms_) {
      const auto& [preset, tokens, threads] = key;
      const auto full = ms_.find({"full", tokens, threads});
      const auto one = ms_.find({preset, tokens, 1});
      std::printf("%-14s %7u %7d %10.3f %8.2f %10.2f\n", preset.c_str(), tokens, threads, ms,
                  full != ms_.end() ? full->second / ms : 0.0, one != ms_.end() ? one->second / ms : 0.0);
    }
  }

 private:
  std::map<Key, double> ms_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (uint32_t tokens : token_counts()) {
    for (int32_t threads : {1, 2}) {
      for (const Preset& p : kPresets) {
        const std::string name = std::string("decode/") + p.name + "/" + std::to_string(tokens) +
                                 "/threads:" + std::to_string(threads);
        RatioReporter::keys()[name] = {p.name, tokens, threads};
        benchmark::RegisterBenchmark(name.c_str(), BM_DecodeStep, p, tokens, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(0.5);
      }
    }
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
