// Decode attention kernels (issue 15): one Llama-3-8B-like layer (32 query heads, 8 KV heads,
// head_dim 128; one query token, so 4 query rows per KV head), 4k and 32k tokens, one thread.
// Reference kernels (the scalar oracle: dense f32 OnlineAttention, the f16 tier path, KIVI-2/4
// read_rows + OnlineAttention) against the optimized ones (backends/cpu/fast_attention.h: f16 and
// KIVI 1/2/4/8, G 32, R 128, with the value-weight width a cache gets by default: 7 bits for 1-
// and 2-bit codes, 14 above; and KIVI-2 with 14, BM_fast_kivi2_w14), and a read-bandwidth
// baseline measured by this binary, so every
// figure is a ratio within one run:
//   speedup_vs_fast_f16 / speedup_vs_ref_f32   time of that baseline / this time
//   bytes                                       bytes the kernel reads (the layer's stored rows)
//   floor_fraction                              (bytes / read bandwidth) / this time
// and the layer's 8 KV heads, split into token ranges as the cache does, on a ThreadPool of 1 and
// 2 threads (f16 and KIVI-2, wall time):
//   speedup_vs_1_thread                         time on 1 thread / this time
// Run the benchmarks in registration order (the baselines are measured first); results are in
// docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention.h"
#include "fast_attention.h"
#include "kivi_attention.h"
#include "kivi_store.h"
#include "util/half.h"
#include "util/thread_pool.h"

using namespace kvsdk::cpu;

namespace {

constexpr size_t kQHeads = 32, kKvHeads = 8, kDim = 128, kGroup = kQHeads / kKvHeads;
constexpr float kScale = 0.08838834764831845f;  // 1/sqrt(128)

struct Layer {
  size_t n = 0;
  std::vector<std::vector<float>> k32, v32;      // [head][n * dim]
  std::vector<std::vector<uint16_t>> k16, v16;   // [head][n * dim]
  std::vector<int32_t> pos;
  // KIVI stores with the value-weight width a cache gets by default (kvsdk_policy
  // kivi_weight_bits 0: 7 bits for 1- and 2-bit codes, 14 above), and KIVI-2 with 14.
  std::vector<std::unique_ptr<KiviHeadStore>> kivi1, kivi2, kivi4, kivi8, kivi2w14;
  std::vector<float> q;                          // [32][dim]
  std::vector<int32_t> qpos;                     // [group] = INT32_MAX (decode sees everything)
};

const Layer& layer(size_t n) {
  static std::map<size_t, std::unique_ptr<Layer>> cache;
  auto& slot = cache[n];
  if (slot) return *slot;
  slot = std::make_unique<Layer>();
  Layer& L = *slot;
  L.n = n;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  L.pos.resize(n);
  std::iota(L.pos.begin(), L.pos.end(), 0);
  for (size_t h = 0; h < kKvHeads; ++h) {
    std::vector<float> k(n * kDim), v(n * kDim);
    for (float& f : k) f = g(rng);
    for (float& f : v) f = g(rng);
    for (size_t t = 0; t < n; ++t) k[t * kDim + 3] *= 8.0f;  // an outlier channel, as in LLMs
    std::vector<uint16_t> k16(n * kDim), v16(n * kDim);
    for (size_t i = 0; i < n * kDim; ++i) {
      k16[i] = kvsdk::f32_to_f16(k[i]);
      v16[i] = kvsdk::f32_to_f16(v[i]);
    }
    for (auto* set : {&L.kivi1, &L.kivi2, &L.kivi4, &L.kivi8, &L.kivi2w14}) {
      const uint32_t bits = set == &L.kivi1 ? 1
                            : set == &L.kivi2 || set == &L.kivi2w14 ? 2
                            : set == &L.kivi4 ? 4
                                              : 8;
      const uint32_t weight_bits = bits <= 2 && set != &L.kivi2w14 ? 7 : 14;
      auto store =
          std::make_unique<KiviHeadStore>(kDim, KiviConfig{bits, 32, 128, weight_bits});
      store->reserve(n);  // one allocation, not a growth series (setup time only)
      store->append(k.data(), v.data(), L.pos.data(), n);
      set->push_back(std::move(store));
    }
    L.k32.push_back(std::move(k));
    L.v32.push_back(std::move(v));
    L.k16.push_back(std::move(k16));
    L.v16.push_back(std::move(v16));
  }
  L.q.resize(kQHeads * kDim);
  for (float& f : L.q) f = g(rng);
  L.qpos.assign(kGroup, INT32_MAX);
  return L;
}

// Seconds per iteration of the baselines, by name and length (filled as they run).
std::map<std::string, double>& seconds() {
  static std::map<std::string, double> s;
  return s;
}
double g_read_bytes_per_s = 0;

// Times `body` per iteration and sets the counters.
template <class F>
void run(benchmark::State& state, const char* name, double bytes, F&& body) {
  const size_t n = size_t(state.range(0));
  const Layer& L = layer(n);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    body(L);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_iter = total / double(state.iterations());
  const std::string key = std::to_string(n);
  seconds()[std::string(name) + key] = per_iter;
  const auto ratio = [&](const char* base) {
    const auto it = seconds().find(std::string(base) + key);
    return it == seconds().end() ? 0.0 : it->second / per_iter;
  };
  state.counters["bytes"] = bytes;
  state.counters["speedup_vs_fast_f16"] = ratio("fast_f16");
  state.counters["speedup_vs_ref_f32"] = ratio("ref_f32");
  if (g_read_bytes_per_s > 0) {
    state.counters["floor_fraction"] = bytes / g_read_bytes_per_s / per_iter;
  }
}

// Sums n floats (a multiple of 16) with 16 independent accumulators held in registers, so the
// loop is bound by memory, not by add latency. (Accumulators whose address escapes to
// DoNotOptimize live on the stack: that loop measured about half this machine's bandwidth.)
__attribute__((noinline)) float sum_floats(const float* p, size_t n) {
  float acc[16] = {};
  for (size_t i = 0; i < n; i += 16) {
    for (size_t j = 0; j < 16; ++j) acc[j] += p[i + j];
  }
  float total = 0;
  for (float a : acc) total += a;
  return total;
}

// Read bandwidth: sum a 1 GiB buffer (far beyond the last-level cache) split over a pool of
// state.range(0) threads, each a contiguous share. One thread gives the bandwidth floor of the
// kernels below; two show what the memory system gives a second core, the bound of BM_threads'
// speedup for the bandwidth-bound f16 kernel.
void BM_read_bandwidth(benchmark::State& state) {
  static std::vector<float> buf(size_t(1) << 28, 1.0f);
  static double one_thread_s = 0;
  const size_t nt = size_t(state.range(0));
  kvsdk::ThreadPool pool(nt);
  std::vector<float> sums(nt);
  const size_t share = buf.size() / nt / 16 * 16;
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run(nt, [&](size_t t) { sums[t] = sum_floats(buf.data() + t * share, share); });
    benchmark::DoNotOptimize(sums.data());
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_iter = total / double(state.iterations());
  const double bytes_per_s = double(share * nt * sizeof(float)) / per_iter;
  if (nt == 1) {
    one_thread_s = per_iter;
    g_read_bytes_per_s = bytes_per_s;
  }
  state.counters["GB_per_s"] = bytes_per_s / 1e9;
  if (one_thread_s > 0) state.counters["speedup_vs_1_thread"] = one_thread_s / per_iter;
}
BENCHMARK(BM_read_bandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(5)
    ->UseRealTime();

double dense_bytes(size_t n, size_t elem) { return double(kKvHeads * n * (2 * kDim * elem + 4)); }

double kivi_bytes(const std::vector<std::unique_ptr<KiviHeadStore>>& heads) {
  double b = 0;
  for (const auto& h : heads) b += double(h->bytes().total());
  return b;
}

// Reference dense f32: OnlineAttention over the f32 rows of each KV head (one chunk).
void BM_ref_f32(benchmark::State& state) {
  std::vector<float> out(kQHeads * kDim);
  run(state, "ref_f32", dense_bytes(size_t(state.range(0)), 4), [&](const Layer& L) {
    for (size_t h = 0; h < kKvHeads; ++h) {
      OnlineAttention att(L.q.data() + h * kGroup * kDim, L.qpos.data(), kGroup, kDim, kScale);
      att.add_chunk(L.k32[h].data(), L.v32[h].data(), L.pos.data(), L.n);
      att.finish(out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  });
}

// Optimized f16 (the exact tier's rows).
void BM_fast_f16(benchmark::State& state) {
  std::vector<float> out(kQHeads * kDim);
  fast::Scratch scratch;
  scratch.reserve(kGroup, kDim);
  run(state, "fast_f16", dense_bytes(size_t(state.range(0)), 2), [&](const Layer& L) {
    for (size_t h = 0; h < kKvHeads; ++h) {
      const fast::Queries q{L.q.data() + h * kGroup * kDim, L.qpos.data(), kGroup, kDim, kScale};
      fast::attend_f16(q, L.k16[h].data(), L.v16[h].data(), L.pos.data(), L.n, scratch,
                       out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  });
}

// Reference f16 tier path (src/repr/exact_rows.cpp ExactRows::attend): f16 rows widened to f32
// chunks of 256 tokens, then OnlineAttention.
void BM_ref_f16(benchmark::State& state) {
  std::vector<float> out(kQHeads * kDim), kb(256 * kDim), vb(256 * kDim);
  run(state, "ref_f16", dense_bytes(size_t(state.range(0)), 2), [&](const Layer& L) {
    for (size_t h = 0; h < kKvHeads; ++h) {
      OnlineAttention att(L.q.data() + h * kGroup * kDim, L.qpos.data(), kGroup, kDim, kScale);
      for (size_t t0 = 0; t0 < L.n; t0 += 256) {
        const size_t m = std::min<size_t>(256, L.n - t0);
        for (size_t i = 0; i < m * kDim; ++i) {
          kb[i] = kvsdk::f16_to_f32(L.k16[h][t0 * kDim + i]);
          vb[i] = kvsdk::f16_to_f32(L.v16[h][t0 * kDim + i]);
        }
        att.add_chunk(kb.data(), vb.data(), L.pos.data() + t0, m);
      }
      att.finish(out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  });
}

// Bits 2 with Wide: the KIVI-2 store with 14-bit value weights.
template <int Bits, bool Wide = false>
const std::vector<std::unique_ptr<KiviHeadStore>>& kivi_heads(const Layer& L) {
  if (Wide) return L.kivi2w14;
  return Bits == 1 ? L.kivi1 : Bits == 2 ? L.kivi2 : Bits == 4 ? L.kivi4 : L.kivi8;
}

template <int Bits, bool Wide = false>
const char* kivi_name(bool fast) {
  static const std::string ref = "ref_kivi" + std::to_string(Bits);
  static const std::string opt = "fast_kivi" + std::to_string(Bits) + (Wide ? "_w14" : "");
  return fast ? opt.c_str() : ref.c_str();
}

// Reference KIVI: read_rows (dequantize) in chunks + OnlineAttention.
template <int Bits>
void BM_ref_kivi(benchmark::State& state) {
  std::vector<float> out(kQHeads * kDim);
  const auto& heads = kivi_heads<Bits>(layer(size_t(state.range(0))));
  run(state, kivi_name<Bits>(false), kivi_bytes(heads), [&](const Layer& L) {
    for (size_t h = 0; h < kKvHeads; ++h) {
      OnlineAttention att(L.q.data() + h * kGroup * kDim, L.qpos.data(), kGroup, kDim, kScale);
      kivi_attend(*heads[h], att);
      att.finish(out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  });
}

// The optimized kernel; Wide: KIVI-2 with 14-bit value weights instead of a cache's default 7.
template <int Bits, bool Wide = false>
void BM_fast_kivi(benchmark::State& state) {
  std::vector<float> out(kQHeads * kDim);
  fast::Scratch scratch;
  scratch.reserve(kGroup, kDim, kDim / 32);
  const auto& heads = kivi_heads<Bits, Wide>(layer(size_t(state.range(0))));
  run(state, kivi_name<Bits, Wide>(true), kivi_bytes(heads), [&](const Layer& L) {
    for (size_t h = 0; h < kKvHeads; ++h) {
      const fast::Queries q{L.q.data() + h * kGroup * kDim, L.qpos.data(), kGroup, kDim, kScale};
      fast::attend_kivi(q, *heads[h], scratch, out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  });
}

void BM_fast_kivi2_w14(benchmark::State& state) { BM_fast_kivi<2, true>(state); }

// The layer's KV heads on a pool of state.range(1) threads, as kvsdk_cache_attend runs them at
// decode (src/core/cache_split_attend.cpp, split-K): each head's tokens in min(16, n / 2048)
// ranges, one task per head and range with a Scratch per thread slot, then each head's partial
// softmax states merged in order. Wall time, so the ratio to 1 thread is the parallel speedup on
// this machine (the cores share one memory system).
template <bool Kivi>
void BM_threads(benchmark::State& state) {
  const size_t n = size_t(state.range(0)), nt = size_t(state.range(1));
  kvsdk::ThreadPool pool(nt);
  std::vector<fast::Scratch> scratch(pool.size());
  for (auto& s : scratch) s.reserve(kGroup, kDim, kDim / 32);
  std::vector<float> out(kQHeads * kDim);
  const size_t parts = std::min<size_t>(16, std::max<size_t>(1, n / 2048));
  const size_t step = ((n + parts - 1) / parts + 63) / 64 * 64;
  std::vector<float> mem(kKvHeads * parts * kGroup * (kDim + 2));
  std::vector<fast::PartialState> st(kKvHeads * parts);
  for (size_t i = 0; i < st.size(); ++i) {
    float* m = mem.data() + i * kGroup * (kDim + 2);
    st[i] = {m, m + kGroup, m + 2 * kGroup};
  }
  const Layer& L0 = layer(n);
  const std::string name = std::string(Kivi ? "threads_kivi2_" : "threads_f16_") +
                           std::to_string(nt) + "_";
  run(state, name.c_str(), Kivi ? kivi_bytes(L0.kivi2) : dense_bytes(n, 2), [&](const Layer& L) {
    pool.run(kKvHeads * parts, [&](size_t i) {
      const size_t h = i / parts, first = std::min(n, (i % parts) * step);
      const size_t count = std::min(step, n - first);
      fast::Scratch& s = scratch[kvsdk::ThreadPool::current_slot()];
      const fast::Queries q{L.q.data() + h * kGroup * kDim, L.qpos.data(), kGroup, kDim, kScale};
      if (Kivi) {
        fast::attend_kivi_partial(q, *L.kivi2[h], first, count, s, st[i]);
      } else {
        fast::attend_f16_partial(q, L.k16[h].data(), L.v16[h].data(), L.pos.data(), first, count,
                                 s, st[i]);
      }
    });
    for (size_t h = 0; h < kKvHeads; ++h) {
      fast::merge_partials(st.data() + h * parts, parts, kGroup, kDim,
                           out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  });
  const auto base = seconds().find(std::string(Kivi ? "threads_kivi2_1_" : "threads_f16_1_") +
                                   std::to_string(n));
  const auto self = seconds().find(name + std::to_string(n));
  state.counters["speedup_vs_1_thread"] = base->second / self->second;
}

#define KVSDK_ATTN_BENCH(fn) \
  BENCHMARK(fn)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond)->MinTime(0.5)
KVSDK_ATTN_BENCH(BM_ref_f32);
KVSDK_ATTN_BENCH(BM_fast_f16);
KVSDK_ATTN_BENCH(BM_ref_f16);
KVSDK_ATTN_BENCH(BM_ref_kivi<2>);
KVSDK_ATTN_BENCH(BM_ref_kivi<4>);
KVSDK_ATTN_BENCH(BM_fast_kivi<1>);
KVSDK_ATTN_BENCH(BM_fast_kivi<2>);
KVSDK_ATTN_BENCH(BM_fast_kivi2_w14);
KVSDK_ATTN_BENCH(BM_fast_kivi<4>);
KVSDK_ATTN_BENCH(BM_fast_kivi<8>);
BENCHMARK(BM_threads<false>)->Args({32768, 1})->Args({32768, 2})->Unit(benchmark::kMillisecond)
    ->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_threads<true>)->Args({32768, 1})->Args({32768, 2})->Unit(benchmark::kMillisecond)
    ->MinTime(0.5)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
