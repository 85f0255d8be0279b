// CUDA backend benchmarks (issue 7), every figure a ratio to a baseline measured in the same run:
//  - KIVI quantize throughput (keys + values of 8 KV heads x head_dim 128) as a fraction of the
//    device-to-device copy bandwidth measured first (both as bytes read + written per second);
//  - decode attention over a KIVI-2 cache (+ 128-token exact residual) vs dense FP16 decode
//    attention (the same flash-decoding kernel over f16 rows), Llama-3-8B-like geometry (32 query
//    heads, 8 KV heads, head_dim 128), 4k / 32k / 128k tokens, batch 1 and 16;
//  - the eviction presets' scoring kernel (cuda_column_sums.h) over one KV head's f16 keys at 4k /
//    32k tokens, for an h2o observe (4 query rows: one token's GQA group) and a SnapKV window
//    (128 rows: 32 queries x 4), against one KV head's share of the dense f16 decode above;
//  - one decode step of a 'full' cache on a CUDA context through the C API (append one token,
//    attend one query: the host staging and copies included), one layer of the same geometry at
//    4k / 32k tokens, against the kernel-only dense decode of the same size (batch 1) and
//    against the same step on the CPU backend (KVSDK_BACKEND_CPU, 1 thread).
// Timing: CUDA events around 10-20 back-to-back launches (manual time, per launch), a fixed number
// of iterations (each runs the launches once more). Contents of the caches are constant
// fills: the kernels' work does not depend on the values.
// Without a CUDA device it prints why and exits with status 1.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include <algorithm>
#include <chrono>
#include <vector>

#include "cuda_column_sums.h"
#include "cuda_decode_attention.h"
#include "cuda_kivi_quant.h"
#include "kvsdk.h"

namespace {

using namespace kvsdk::cuda;

constexpr size_t kQHeads = 32, kKvHeads = 8, kDim = 128, kGroup = 32, kResidual = 128;

double g_copy_bytes_per_s = 0;                            // read + write bytes per second
std::map<std::pair<size_t, size_t>, double> g_dense_s;    // (tokens, batch) -> seconds per step

#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    const cudaError_t e_ = (expr);                                                    \
    if (e_ != cudaSuccess) {                                                          \
      state.SkipWithError((std::string(#expr) + ": " + cudaGetErrorString(e_)).c_str()); \
      return;                                                                         \
    }                                                                                 \
  } while (0)

// Device buffer that reports failure instead of throwing (a benchmark skips on it).
struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) {
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~Buf() {
    if (p) cudaFree(p);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Times `launch` with events, `iters` back-to-back launches per sample.
template <class F>
double time_s(F&& launch, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  launch();  // warm-up
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) launch();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / 1e3 / iters;
}

void BM_DeviceCopy(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0)) << 20;
  Buf src(bytes), dst(bytes);
  if (!src.p || !dst.p) return state.SkipWithError("cudaMalloc failed");
  CHECK_CUDA(cudaMemset(src.p, 1, bytes));
  for (auto _ : state) {
    const double s = time_s(
        [&] { cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice); }, 10);
    state.SetIterationTime(s);
    g_copy_bytes_per_s = 2.0 * double(bytes) / s;
  }
  state.counters["GBps_rw"] = g_copy_bytes_per_s / 1e9;
}

void BM_KiviQuantize(benchmark::State& state) {
  const uint32_t bits = uint32_t(state.range(0));
  const size_t tokens = size_t(state.range(1)), rows = kKvHeads * tokens;
  const size_t row_bytes = (kDim * bits + 7) / 8, groups = kDim / kGroup;
  Buf k(rows * kDim * 4), v(rows * kDim * 4), kc(rows * row_bytes), vc(rows * row_bytes);
  Buf ks(rows / kGroup * kDim * 2), kz(rows / kGroup * kDim * 2), vs(rows * groups * 2),
      vz(rows * groups * 2);
  if (!k.p || !v.p || !kc.p || !vc.p || !ks.p || !kz.p || !vs.p || !vz.p) {
    return state.SkipWithError("cudaMalloc failed");
  }
  CHECK_CUDA(cudaMemset(k.p, 0x3e, rows * kDim * 4));
  CHECK_CUDA(cudaMemset(v.p, 0x3d, rows * kDim * 4));
  const double bytes = 2.0 * rows * kDim * 4 + 2.0 * rows * row_bytes +
                       2.0 * (rows / kGroup * kDim + rows * groups) * 2;
  for (auto _ : state) {
    const double s = time_s(
        [&] {
          kivi_quantize_keys(k.as<float>(), rows / kGroup, kGroup, kDim, bits, kc.as<uint8_t>(),
                             ks.as<uint16_t>(), kz.as<uint16_t>(), nullptr);
          kivi_quantize_values(v.as<float>(), rows, kDim, kGroup, bits, vc.as<uint8_t>(),
                               vs.as<uint16_t>(), vz.as<uint16_t>(), nullptr);
        },
        10);
    state.SetIterationTime(s);
    state.counters["GBps_rw"] = bytes / s / 1e9;
    if (g_copy_bytes_per_s > 0) state.counters["frac_of_d2d"] = bytes / s / g_copy_bytes_per_s;
  }
}

// Decode step over `tokens` cached tokens per sequence: dense f16, or KIVI-2 + exact residual.
void BM_Decode(benchmark::State& state, bool kivi) {
  const size_t tokens = size_t(state.range(0)), batch = size_t(state.range(1));
  const size_t heads = batch * kKvHeads;
  DecodeShape sh;
  sh.batch = batch, sh.kv_heads = kKvHeads, sh.group = kQHeads / kKvHeads, sh.dim = kDim;
  sh.scale = 0.08838834764f;  // 1/sqrt(128)
  const size_t nq = kivi ? (tokens - kResidual) / kGroup * kGroup : 0;
  const size_t ne = tokens - nq;
  const uint32_t bits = 2;
  const size_t row_bytes = kDim * bits / 8;
  Buf ek(heads * ne * kDim * 2), ev(heads * ne * kDim * 2);
  Buf kc(heads * nq * row_bytes + 1), vc(heads * nq * row_bytes + 1);
  Buf ks(heads * nq / kGroup * kDim * 2 + 2), kz(heads * nq / kGroup * kDim * 2 + 2);
  Buf vs(heads * nq * (kDim / kGroup) * 2 + 2), vz(heads * nq * (kDim / kGroup) * 2 + 2);
  Buf q(batch * kQHeads * kDim * 4), out(batch * kQHeads * kDim * 4);
  if (!ek.p || !ev.p || !kc.p || !vc.p || !ks.p || !kz.p || !vs.p || !vz.p || !q.p || !out.p) {
    return state.SkipWithError("cudaMalloc failed (not enough device memory for this size)");
  }
  CHECK_CUDA(cudaMemset(ek.p, 0x3c, heads * ne * kDim * 2));
  CHECK_CUDA(cudaMemset(ev.p, 0x3b, heads * ne * kDim * 2));
  CHECK_CUDA(cudaMemset(kc.p, 0x5a, heads * nq * row_bytes + 1));
  CHECK_CUDA(cudaMemset(vc.p, 0xa5, heads * nq * row_bytes + 1));
  CHECK_CUDA(cudaMemset(ks.p, 0x20, heads * nq / kGroup * kDim * 2 + 2));
  CHECK_CUDA(cudaMemset(kz.p, 0xa0, heads * nq / kGroup * kDim * 2 + 2));
  CHECK_CUDA(cudaMemset(vs.p, 0x20, heads * nq * (kDim / kGroup) * 2 + 2));
  CHECK_CUDA(cudaMemset(vz.p, 0xa0, heads * nq * (kDim / kGroup) * 2 + 2));
  CHECK_CUDA(cudaMemset(q.p, 0x3c, batch * kQHeads * kDim * 4));
  ExactTierView exact{ek.as<uint16_t>(), ev.as<uint16_t>(), ne, ne};
  KiviTierView kv;
  kv.k_codes = kc.as<uint8_t>(), kv.v_codes = vc.as<uint8_t>();
  kv.k_scale = ks.as<uint16_t>(), kv.k_zero = kz.as<uint16_t>();
  kv.v_scale = vs.as<uint16_t>(), kv.v_zero = vz.as<uint16_t>();
  kv.bits = bits, kv.group = kGroup, kv.tokens = nq, kv.capacity = nq;
  const DecodePlan plan = plan_decode(sh, nq, ne);
  Buf ws(plan.workspace_bytes);
  if (!ws.p) return state.SkipWithError("cudaMalloc of the workspace failed");
  const double kv_bytes = double(heads) * (ne * kDim * 4.0 + nq * (2.0 * row_bytes) +
                                           nq / kGroup * kDim * 4.0 + nq * (kDim / kGroup) * 4.0);
  for (auto _ : state) {
    const double s = time_s(
        [&] {
          decode_attention(q.as<float>(), sh, kivi ? &kv : nullptr, &exact, plan, ws.p,
                           out.as<float>(), nullptr);
        },
        20);
    state.SetIterationTime(s);
    state.counters["cache_GBps"] = kv_bytes / s / 1e9;
    state.counters["splits"] = double(plan.kivi_splits + plan.exact_splits);
    if (!kivi) {
      g_dense_s[{tokens, batch}] = s;
    } else if (g_dense_s.count({tokens, batch})) {
      state.counters["speedup_vs_fp16"] = g_dense_s[{tokens, batch}] / s;
    }
  }
}

// The scoring kernel over one KV head of `tokens` f16 keys for `rows` query rows (every key
// visible), with the CPU's bits (so plain CUDA-core loops: its cost is what keeping the device's
// selection identical to the CPU's costs).
void BM_ColumnSums(benchmark::State& state) {
  const size_t tokens = size_t(state.range(0)), rows = size_t(state.range(1));
  ColumnSumsShape shape;
  shape.rows = rows, shape.dim = kDim, shape.scale = 0.08838834764f, shape.held = tokens;
  constexpr size_t kMaxLogits = size_t(4) << 20;  // as the CUDA backend's table
  Buf k(tokens * kDim * 2), pos(tokens * 4), q(rows * kDim * 4), qpos(rows * 4),
      work(column_sums_workspace(shape, kMaxLogits) * 4), cols(tokens * 4);
  if (!k.p || !pos.p || !q.p || !qpos.p || !work.p || !cols.p) {
    return state.SkipWithError("cudaMalloc failed");
  }
  CHECK_CUDA(cudaMemset(k.p, 0x3c, tokens * kDim * 2));
  CHECK_CUDA(cudaMemset(q.p, 0x3c, rows * kDim * 4));
  CHECK_CUDA(cudaMemset(pos.p, 0, tokens * 4));
  CHECK_CUDA(cudaMemset(qpos.p, 0x7f, rows * 4));  // a large position: every key visible
  for (auto _ : state) {
    const double s = time_s(
        [&] {
          column_sums(q.as<float>(), qpos.as<int32_t>(), QuantKeys{}, k.as<uint16_t>(),
                      pos.as<int32_t>(), nullptr, nullptr, shape, kMaxLogits, work.as<float>(),
                      cols.as<float>(), nullptr);
        },
        10);
    state.SetIterationTime(s);
    state.counters["keys_GBps"] = double(tokens * kDim * 2) / s / 1e9;
    if (g_dense_s.count({tokens, 1})) {
      state.counters["x_decode_head"] = s / (g_dense_s[{tokens, 1}] / double(kKvHeads));
    }
  }
}

// One decode step of a cache of policy `spec` ("full", "kivi", "specache", "smallkv") through the
// C API, on `backend` (wall clock: every call is synchronous). The cache holds `tokens` tokens of
// one layer before the timed steps. 'smallkv' runs with its proxy (a 'full' cache of 4 query
// heads over 1 KV head on the same context, stepped first) under a cache budget of half the
// tokens' full rows, so that its heads hold marginal rows (Eq. 6) and evict as the steps go.
std::map<std::pair<std::string, size_t>, double> g_cpu_step_s;   // (spec, tokens) -> s per step
std::map<size_t, double> g_full_cuda_step_s;                      // tokens -> s per step, 'full'
void BM_CacheDecodeStep(benchmark::State& state, kvsdk_backend backend, const char* spec) {
  const size_t tokens = size_t(state.range(0));
  const size_t row = kKvHeads * kDim, steps = 64;
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.backend = backend;
  o.n_threads = 1;
  o.budget_bytes = uint64_t(tokens + steps * 64) * kKvHeads * (kDim * 4 + 4) + (1u << 20);
  kvsdk_context* ctx = nullptr;
  if (kvsdk_context_create(&ctx, &o) != KVSDK_OK) return state.SkipWithError(kvsdk_last_error());
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = 1, g.n_q_heads = kQHeads, g.n_kv_heads = kKvHeads, g.head_dim = kDim;
  kvsdk_policy policy;
  if (kvsdk_policy_parse(&policy, spec) != KVSDK_OK) {
    kvsdk_context_destroy(ctx);
    return state.SkipWithError(kvsdk_last_error());
  }
  kvsdk_cache* cache = nullptr;
  if (kvsdk_cache_create(&cache, ctx, &g, &policy) != KVSDK_OK) {
    kvsdk_context_destroy(ctx);
    return state.SkipWithError(kvsdk_last_error());
  }
  const bool smallkv = std::string(spec) == "smallkv";
  kvsdk_geometry pg = g;
  pg.n_q_heads = 4, pg.n_kv_heads = 1;
  kvsdk_cache* proxy = nullptr;
  if (smallkv) {
    if (kvsdk_cache_create(&proxy, ctx, &pg, nullptr) != KVSDK_OK ||
        kvsdk_cache_set_proxy(cache, proxy) != KVSDK_OK ||
        kvsdk_cache_set_budget(cache, uint64_t(tokens) * kKvHeads * (kDim * 4 + 8) / 2) !=
            KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      kvsdk_cache_destroy(cache);
      kvsdk_cache_destroy(proxy);
      kvsdk_context_destroy(ctx);
      return;
    }
  }
  // Every call's status: the first failure ends the benchmark with its message.
  std::string error;
  const auto check = [&](kvsdk_status st) {
    if (st != KVSDK_OK && error.empty()) error = kvsdk_last_error();
  };
  // (Varied rows, so that the proxy's attention and the large cache's selection see differences.)
  std::vector<float> kv(4096 * row), q(kQHeads * kDim, 0.5f), out(q.size());
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = 0.25f + 0.001f * float(i % 977);
  std::vector<float> pq(pg.n_q_heads * kDim, 0.5f), pout(pq.size());
  std::vector<int32_t> pos(4096);
  int32_t next = 0;
  for (size_t done = 0; done < tokens;) {
    // (SmallKV evicts as it prefills, and one append must fit its budget: 64-token chunks.)
    const size_t n = std::min<size_t>(smallkv ? 64 : 4096, tokens - done);
    for (size_t i = 0; i < n; ++i) pos[i] = next++;
    if (proxy) {
      check(kvsdk_cache_append(proxy, 0, n, kv.data(), kv.data(), pos.data(),
                               n * kDim * sizeof(float)));
    }
    check(kvsdk_cache_append(cache, 0, n, kv.data(), kv.data(), pos.data(),
                             n * row * sizeof(float)));
    done += n;
  }
  // SpeCache's step (§3.3): the output token and the speculative one attended in one call, then
  // the speculative token's prefetch for the next step.
  const bool specache = std::string(spec) == "specache";
  std::vector<float> q2(2 * q.size(), 0.5f), out2(q2.size());
  const auto step = [&] {
    const int32_t p = next++;
    if (proxy) {  // SmallKV's proxy model runs the token first (its attention weights Eq. 6)
      check(kvsdk_cache_append(proxy, 0, 1, kv.data(), kv.data(), &p, kDim * sizeof(float)));
      check(kvsdk_cache_attend(proxy, 0, 1, pq.data(), &p, pq.size() * sizeof(float),
                               pout.data(), pout.size() * sizeof(float)));
    }
    check(kvsdk_cache_append(cache, 0, 1, kv.data(), kv.data(), &p, row * sizeof(float)));
    if (!specache) {
      check(kvsdk_cache_attend(cache, 0, 1, q.data(), &p, q.size() * sizeof(float), out.data(),
                               out.size() * sizeof(float)));
      return;
    }
    const int32_t both[2] = {p, p + 1};
    check(kvsdk_cache_attend(cache, 0, 2, q2.data(), both, q2.size() * sizeof(float),
                             out2.data(), out2.size() * sizeof(float)));
    check(kvsdk_cache_prefetch(cache, 0, 1, q.data(), &both[1], q.size() * sizeof(float)));
  };
  step();  // warm-up: scratch grows once
  for (auto _ : state) {
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < steps; ++i) step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    state.SetIterationTime(s);
    const std::pair<std::string, size_t> key{spec, tokens};
    if (backend == KVSDK_BACKEND_CPU) {
      g_cpu_step_s[key] = s;
    } else {
      const bool full = std::string(spec) == "full";
      if (full) g_full_cuda_step_s[tokens] = s;
      if (full && g_dense_s.count({tokens, 1})) {
        state.counters["x_kernel_only"] = s / g_dense_s[{tokens, 1}];
      }
      if (g_cpu_step_s.count(key)) state.counters["speedup_vs_cpu"] = g_cpu_step_s[key] / s;
      if (!full && g_full_cuda_step_s.count(tokens)) {
        state.counters["x_full_cuda"] = s / g_full_cuda_step_s[tokens];
      }
    }
  }
  if (!error.empty() && !state.error_occurred()) state.SkipWithError(error.c_str());
  kvsdk_cache_destroy(cache);
  kvsdk_cache_destroy(proxy);
  kvsdk_context_destroy(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::fprintf(stderr, "cuda_bench: no CUDA device: %s\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));

  benchmark::RegisterBenchmark("DeviceCopy/MiB", BM_DeviceCopy)->Arg(1024)->UseManualTime()
      ->Unit(benchmark::kMicrosecond)->Iterations(3);
  benchmark::RegisterBenchmark("KiviQuantize/bits/tokens", BM_KiviQuantize)
      ->ArgsProduct({{1, 2, 4, 8}, {32768}})->UseManualTime()->Unit(benchmark::kMicrosecond)
      ->Iterations(20);
  for (int64_t tokens : {4096, 32768, 131072}) {
    for (int64_t batch : {1, 16}) {
      // Dense first: the KIVI-2 run reports its speed-up over it.
      benchmark::RegisterBenchmark("DecodeFp16/tokens/batch",
                                   [](benchmark::State& s) { BM_Decode(s, false); })
          ->Args({tokens, batch})->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(30);
      benchmark::RegisterBenchmark("DecodeKivi2/tokens/batch",
                                   [](benchmark::State& s) { BM_Decode(s, true); })
          ->Args({tokens, batch})->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(30);
    }
  }
  // After the dense decode rows: the scoring reports its time per KV head against theirs.
  benchmark::RegisterBenchmark("ColumnSums/tokens/rows", BM_ColumnSums)
      ->ArgsProduct({{4096, 32768}, {4, 128}})->UseManualTime()->Unit(benchmark::kMicrosecond)
      ->Iterations(5);
  for (int64_t tokens : {4096, 32768}) {
    // The CPU first: the CUDA run reports its speed-up over it; 'full' before 'kivi' (KIVI-2),
    // 'specache' (its decode step: two queries attended, a prefetch) and 'smallkv' (its proxy's
    // step and its own), which report their time against full's on the device.
    for (const char* spec : {"full", "kivi", "specache", "smallkv"}) {
      const std::string name = std::string("CacheDecodeStep/") + spec;
      benchmark::RegisterBenchmark((name + "/cpu/tokens").c_str(), [spec](benchmark::State& s) {
        BM_CacheDecodeStep(s, KVSDK_BACKEND_CPU, spec);
      })->Arg(tokens)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(3);
      benchmark::RegisterBenchmark((name + "/cuda/tokens").c_str(), [spec](benchmark::State& s) {
        BM_CacheDecodeStep(s, KVSDK_BACKEND_CUDA, spec);
      })->Arg(tokens)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(3);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
