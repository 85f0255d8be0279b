// Snapshot size and save/load time per preset (issue 6), against the baseline "raw FP16 dump +
// zstd level 3" of the same tokens in the same run.
//
//   cmake --preset release && cmake --build --preset release --target preset_snapshot_bench
//   ./build/release/tests/bench/preset_snapshot_bench
//
// Geometry: 8 layers of a Llama-3-8B-like model (32 query heads, 8 KV heads, head_dim 128, f16
// host tensors), 4096 tokens appended in chunks of 256 as a prefill would (KVSDK_BENCH_TOKENS
// overrides). Eviction presets and compositions run under a budget of 25% of the full cache;
// representation presets under no budget. Keys carry a few large-magnitude channels, as real
// keys do; values are unit normal. `ratio` = snapshot bytes / raw FP16 bytes of every appended
// token; `vs_baseline` = snapshot bytes / baseline bytes; time is CPU time, single-threaded.
// Presets this build does not implement report an error row (kvsdk_last_error()).
#include <benchmark/benchmark.h>
#include <zstd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvsdk.h"

namespace {

constexpr uint32_t kLayers = 8, kQHeads = 32, kKvHeads = 8, kDim = 128;
const char* const kPresets[] = {"full",     "kivi",      "kivi+kivi4", "snapkv",
                                "xkv",      "xkv+kivi2", "snapkv+kivi2", "spindlekv",
                                "minicache", "minicache+kivi4", "specache"};

int64_t tokens() {
  const char* env = std::getenv("KVSDK_BENCH_TOKENS");
  const long long v = env ? std::strtoll(env, nullptr, 10) : 0;
  return v > 0 ? v : 4096;
}

kvsdk_geometry geometry() {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = kLayers;
  g.n_q_heads = kQHeads;
  g.n_kv_heads = kKvHeads;
  g.head_dim = kDim;
  g.dtype = KVSDK_DTYPE_F32;
  g.rope_theta = 500000.0f;
  return g;
}

// The host tensors every preset receives: [layer][token][kv_head][dim] f32, deterministic.
struct Tensors {
  std::vector<float> k, v;
  std::vector<unsigned char> baseline;  // zstd -3 of the FP16 rows
  uint64_t fp16_bytes = 0;
};

const Tensors& tensors() {
  static Tensors t;
  if (!t.k.empty()) return t;
  const size_t n = size_t(kLayers) * size_t(tokens()) * kKvHeads * kDim;
  t.k.resize(n);
  t.v.resize(n);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto normal = [](uint64_t r) {
    const int s = int(r & 0xff) + int((r >> 8) & 0xff) + int((r >> 16) & 0xff) + int((r >> 24) & 0xff);
    return (float(s) - 510.0f) / 147.8f;
  };
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = next();
    const uint32_t c = uint32_t(i % kDim);
    float kx = normal(r);
    if (c == 7 || c == 19 || c == 70 || c == 101) kx = kx * 2.0f + 20.0f;
    t.k[i] = kx;
    t.v[i] = normal(r >> 32);
  }
  // Baseline: the same rows as FP16 (what a raw dump holds), zstd level 3.
  std::vector<uint16_t> raw(2 * n);
  for (size_t i = 0; i < n; ++i) {
    // f32 -> f16 by truncation: enough for sizes (the baseline's ratio, not its values, matters).
    auto h = [](float f) {
      uint32_t x;
      std::memcpy(&x, &f, 4);
      const uint32_t sign = (x >> 16) & 0x8000;
      const int32_t e = int32_t((x >> 23) & 0xff) - 127 + 15;
      if (e <= 0) return uint16_t(sign);
      if (e >= 31) return uint16_t(sign | 0x7bff);
      return uint16_t(sign | (uint32_t(e) << 10) | ((x & 0x7fffff) >> 13));
    };
    raw[i] = h(t.k[i]);
    raw[n + i] = h(t.v[i]);
  }
  t.fp16_bytes = raw.size() * 2;
  t.baseline.resize(ZSTD_compressBound(t.fp16_bytes));
  t.baseline.resize(ZSTD_compress(t.baseline.data(), t.baseline.size(), raw.data(), t.fp16_bytes, 3));
  return t;
}

// A cache of `spec` holding every token (or what its budget keeps), and its snapshot.
struct Built {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  std::vector<unsigned char> snapshot;
  std::string error;
  ~Built() {
    kvsdk_cache_destroy(cache);
    kvsdk_context_destroy(ctx);
  }
};

bool evicts(const kvsdk_policy& p) {
  return p.method == KVSDK_METHOD_STREAMING_LLM || p.method == KVSDK_METHOD_H2O ||
         p.method == KVSDK_METHOD_SNAPKV || p.method == KVSDK_METHOD_PYRAMIDKV ||
         p.method == KVSDK_METHOD_XKV;
}

Built& build(const std::string& spec) {
  static std::map<std::string, std::unique_ptr<Built>> all;
  auto& b = all[spec];
  if (b) return *b;
  b = std::make_unique<Built>();
  const Tensors& t = tensors();
  const kvsdk_geometry g = geometry();
  kvsdk_policy p;
  kvsdk_policy_parse(&p, spec.c_str());
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.n_threads = 1;  // the rows are CPU time of one thread (snapshots use the context's pool)
  const uint64_t full = uint64_t(kLayers) * uint64_t(tokens()) * kKvHeads * (kDim * 4 + 4);
  if (evicts(p)) o.budget_bytes = full / 4;
  kvsdk_context_create(&b->ctx, &o);
  if (kvsdk_cache_create(&b->cache, b->ctx, &g, &p) != KVSDK_OK) {
    b->error = kvsdk_last_error();
    return *b;
  }
  const size_t chunk = 256, row = size_t(kKvHeads) * kDim;
  std::vector<int32_t> pos(chunk);
  std::vector<float> q(chunk * kQHeads * kDim, 0.5f);
  for (int64_t t0 = 0; t0 < tokens(); t0 += int64_t(chunk)) {
    const size_t n = size_t(std::min<int64_t>(int64_t(chunk), tokens() - t0));
    for (size_t i = 0; i < n; ++i) pos[i] = int32_t(t0 + int64_t(i));
    for (uint32_t l = 0; l < kLayers; ++l) {
      const size_t at = (size_t(l) * size_t(tokens()) + size_t(t0)) * row;
      // Window methods score with observed queries: the chunk's last query rows.
      kvsdk_cache_observe(b->cache, l, 1, q.data(), pos.data() + n - 1, q.size() / chunk * 4);
      if (kvsdk_cache_append(b->cache, l, n, t.k.data() + at, t.v.data() + at, pos.data(),
                             n * row * 4) != KVSDK_OK) {
        b->error = kvsdk_last_error();
        return *b;
      }
    }
  }
  size_t size = 0;
  if (kvsdk_cache_save_to_buffer(b->cache, nullptr, nullptr, 0, &size) != KVSDK_OK) {
    b->error = kvsdk_last_error();
    return *b;
  }
  b->snapshot.resize(size);
  kvsdk_cache_save_to_buffer(b->cache, nullptr, b->snapshot.data(), size, &size);
  return *b;
}

void report(benchmark::State& state, size_t bytes) {
  const Tensors& t = tensors();
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(t.fp16_bytes));
  state.counters["ratio"] = double(bytes) / double(t.fp16_bytes);
  state.counters["vs_baseline"] = double(bytes) / double(t.baseline.size());
}

void BM_Save(benchmark::State& state, const std::string& spec) {
  Built& b = build(spec);
  if (!b.error.empty()) {
    state.SkipWithError(b.error.c_str());
    return;
  }
  std::vector<unsigned char> buf(b.snapshot.size());
  size_t size = 0;
  for (auto _ : state) {
    if (kvsdk_cache_save_to_buffer(b.cache, nullptr, buf.data(), buf.size(), &size) != KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      break;
    }
  }
  report(state, size);
}

void BM_Load(benchmark::State& state, const std::string& spec) {
  Built& b = build(spec);
  if (!b.error.empty()) {
    state.SkipWithError(b.error.c_str());
    return;
  }
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.n_threads = 1;  // loads check and decompress frames on the context's pool: one thread here
  kvsdk_context* ctx = nullptr;
  kvsdk_context_create(&ctx, &o);
  for (auto _ : state) {
    kvsdk_cache* c = nullptr;
    if (kvsdk_cache_load_from_buffer(&c, ctx, b.snapshot.data(), b.snapshot.size(), nullptr,
                                     nullptr) != KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      break;
    }
    kvsdk_cache_destroy(c);
  }
  kvsdk_context_destroy(ctx);
  report(state, b.snapshot.size());
}

void BM_BaselineSave(benchmark::State& state) {
  const Tensors& t = tensors();
  std::vector<uint16_t> raw(t.fp16_bytes / 2, 0x3c00);
  std::vector<unsigned char> out(ZSTD_compressBound(t.fp16_bytes));
  // Compress the real rows: decompress the baseline once into `raw`.
  ZSTD_decompress(raw.data(), t.fp16_bytes, t.baseline.data(), t.baseline.size());
  size_t n = 0;
  for (auto _ : state) {
    n = ZSTD_compress(out.data(), out.size(), raw.data(), t.fp16_bytes, 3);
    benchmark::DoNotOptimize(n);
  }
  report(state, n);
}

void BM_BaselineLoad(benchmark::State& state) {
  const Tensors& t = tensors();
  for (auto _ : state) {
    std::unique_ptr<uint16_t[]> out(new uint16_t[t.fp16_bytes / 2]);
    const size_t n = ZSTD_decompress(out.get(), t.fp16_bytes, t.baseline.data(), t.baseline.size());
    if (n != t.fp16_bytes) {
      state.SkipWithError("baseline decompression failed");
      break;
    }
    benchmark::DoNotOptimize(out.get());
  }
  report(state, t.baseline.size());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BaselineZstd3Save", BM_BaselineSave)
      ->Unit(benchmark::kMillisecond)->Iterations(3);
  benchmark::RegisterBenchmark("BaselineZstd3Load", BM_BaselineLoad)
      ->Unit(benchmark::kMillisecond)->Iterations(3);
  for (const char* spec : kPresets) {
    const std::string s(spec);
    benchmark::RegisterBenchmark(("Save/" + s).c_str(), [s](benchmark::State& st) { BM_Save(st, s); })
        ->Unit(benchmark::kMillisecond)->Iterations(3);
    benchmark::RegisterBenchmark(("Load/" + s).c_str(), [s](benchmark::State& st) { BM_Load(st, s); })
        ->Unit(benchmark::kMillisecond)->Iterations(3);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
