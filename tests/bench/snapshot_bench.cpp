// Snapshot save/load throughput and size for a Llama-3-8B-like cache, against two baselines in
// the same run: the raw FP16 rows written with write + fsync and read back (what llama.cpp's
// state files do: RawDump*), and the raw rows compressed by zstd level 3 (BaselineZstd3*).
//
//   cmake --preset release && cmake --build --preset release --target snapshot_bench
//   ./build/release/tests/bench/snapshot_bench
//
// Geometry: 32 layers, 32 query heads, 8 KV heads, head_dim 128, f16 host tensors; 8k and 16k
// tokens by default; KVSDK_BENCH_TOKENS=32768 (a comma-separated list) runs other sizes. 32k is
// 4 GiB of f16 per copy and the run holds about five copies: run it alone on 24 GiB. Keys have a few large-magnitude channels, as real keys do
// (a handful of outlier channels carry most of the norm); values are unit normal.
// KVSDK_BENCH_LAYERS=4 keeps fewer layers (throughput is per byte; the ratio is per layer).
// Throughput is logical: FP16 bytes of keys and values / time (bytes_per_second); `ratio` is the
// output size over the FP16 size. Both sides run single-threaded, from and to memory.
//
// KVSDK_BENCH_THREADS=1,2 (a comma-separated list) adds rows "Kvsdk*/threads:N/T/real_time" for
// the cache loaded into a context of N threads (kvsdk_context_options.n_threads: frames are
// compressed and decompressed on its pool), timed by the wall clock (CPU time of the calling
// thread would miss the workers'), and "BaselineZstd3*/threads:0/T/real_time" rows timed alike.
// Each thread count holds one more copy of the cache. E.g. the issue 18 figures:
//   KVSDK_BENCH_LAYERS=4 KVSDK_BENCH_TOKENS=8192 KVSDK_BENCH_THREADS=1,2 \
//     ./build/release/tests/bench/snapshot_bench --benchmark_filter=threads
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvsdk.h"

namespace {

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kDim = 128;

// A comma-separated list of positive integers from the environment (empty when unset).
std::vector<int64_t> env_list(const char* name) {
  std::vector<int64_t> out;
  if (const char* env = std::getenv(name)) {
    for (const char* p = env; *p;) {
      char* end = nullptr;
      const long long v = std::strtoll(p, &end, 10);
      if (end == p || v <= 0) break;
      out.push_back(v);
      p = *end == ',' ? end + 1 : end;
    }
  }
  return out;
}

std::vector<int64_t> token_counts() {
  std::vector<int64_t> out = env_list("KVSDK_BENCH_TOKENS");
  if (out.empty()) out = {8192, 16384};
  return out;
}

const uint32_t kLayers = [] {
  const std::vector<int64_t> l = env_list("KVSDK_BENCH_LAYERS");
  return l.empty() ? 32u : uint32_t(l[0]);
}();

kvsdk_geometry geometry() {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = kLayers;
  g.n_q_heads = kQHeads;
  g.n_kv_heads = kKvHeads;
  g.head_dim = kDim;
  g.dtype = KVSDK_DTYPE_F16;
  g.rope_theta = 500000.0f;
  return g;
}

uint16_t to_f16(float f) {  // round-to-nearest for normal range values (enough for test data)
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (exp <= 0) return uint16_t(sign);
  if (exp >= 31) return uint16_t(sign | 0x7bff);
  uint32_t h = sign | (uint32_t(exp) << 10) | (mant >> 13);
  if (mant & 0x1000) ++h;
  return uint16_t(h);
}

// kvsdk's save options: the defaults, or KVSDK_BENCH_LEVEL (zstd level; a negative level as
// its absolute value plus 100, e.g. 101 for -1) and KVSDK_BENCH_FRAME_KIB (max_frame_bytes in
// KiB) to compare levels and frame sizes in the same setting.
const kvsdk_save_options* save_options() {
  static kvsdk_save_options o = [] {
    kvsdk_save_options x;
    kvsdk_save_options_init(&x);
    const std::vector<int64_t> level = env_list("KVSDK_BENCH_LEVEL");
    if (!level.empty()) x.zstd_level = level[0] > 100 ? -int32_t(level[0] - 100) : int32_t(level[0]);
    const std::vector<int64_t> kib = env_list("KVSDK_BENCH_FRAME_KIB");
    if (!kib.empty()) x.max_frame_bytes = uint64_t(kib[0]) << 10;
    return x;
  }();
  return &o;
}

// One cache (and its raw FP16 dump) per token count, built once.
struct Fixture {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  std::vector<uint16_t> raw;  // the baseline's input: every head's keys then values
  uint64_t fp16_bytes = 0;
  std::vector<unsigned char> snapshot;  // a kvsdk snapshot of the cache
  std::vector<unsigned char> baseline;  // zstd level 3 of `raw`
  // The cache loaded into a context of N threads (KVSDK_BENCH_THREADS rows), made on first use.
  std::map<int64_t, std::pair<kvsdk_context*, kvsdk_cache*>> threaded;
  ~Fixture() {
    for (auto& [n, cc] : threaded) {
      kvsdk_cache_destroy(cc.second);
      kvsdk_context_destroy(cc.first);
    }
    kvsdk_cache_destroy(cache);
    kvsdk_context_destroy(ctx);
  }
  // The context and cache of `n_threads` (0: the fixture's own, single-threaded).
  std::pair<kvsdk_context*, kvsdk_cache*> on_threads(int64_t n_threads) {
    if (n_threads == 0) return {ctx, cache};
    auto& cc = threaded[n_threads];
    if (cc.first) return cc;
    kvsdk_context_options o;
    kvsdk_context_options_init(&o);
    o.n_threads = int32_t(n_threads);
    kvsdk_context_create(&cc.first, &o);
    kvsdk_cache_load_from_buffer(&cc.second, cc.first, snapshot.data(), snapshot.size(), nullptr,
                                 nullptr);
    return cc;
  }
};

Fixture& fixture(int64_t tokens) {
  static std::map<int64_t, std::unique_ptr<Fixture>> all;
  auto& f = all[tokens];
  if (f) return *f;
  all.clear();  // one fixture alive at a time keeps memory in check
  auto& nf = all[tokens];
  nf = std::make_unique<Fixture>();
  Fixture& x = *nf;
  kvsdk_context_options o;  // the default rows: single-threaded, as before n_threads existed
  kvsdk_context_options_init(&o);
  o.n_threads = 1;
  kvsdk_context_create(&x.ctx, &o);
  const kvsdk_geometry g = geometry();
  kvsdk_cache_create(&x.cache, x.ctx, &g, nullptr);
  // Fresh pseudo-random values for every element (repeating a pool would let zstd find long
  // matches real caches do not have): a sum of four uniform bytes is close to normal.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto normal = [](uint64_t r) {
    const int s = int(r & 0xff) + int((r >> 8) & 0xff) + int((r >> 16) & 0xff) + int((r >> 24) & 0xff);
    return (float(s) - 510.0f) / 147.8f;  // mean 0, unit variance
  };
  const int outliers[] = {7, 19, 70, 101};  // large-magnitude key channels
  const size_t chunk = 512;
  std::vector<uint16_t> k(chunk * kKvHeads * kDim), v(k.size());
  std::vector<int32_t> pos(chunk);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int64_t t0 = 0; t0 < tokens; t0 += int64_t(chunk)) {
      for (size_t i = 0; i < k.size(); ++i) {
        const uint64_t r = next();
        const uint32_t c = uint32_t(i % kDim);
        float kx = normal(r);
        for (int o : outliers) {
          if (int(c) == o) kx = kx * 2.0f + 20.0f;
        }
        k[i] = to_f16(kx);
        v[i] = to_f16(normal(r >> 32));
      }
      for (size_t i = 0; i < chunk; ++i) pos[i] = int32_t(t0 + int64_t(i));
      kvsdk_cache_append(x.cache, l, chunk, k.data(), v.data(), pos.data(), k.size() * 2);
    }
  }
  x.fp16_bytes = uint64_t(kLayers) * uint64_t(tokens) * kKvHeads * kDim * 2 * 2;
  x.raw.resize(x.fp16_bytes / 2);
  size_t at = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kKvHeads; ++h) {
      size_t n = 0;
      const size_t cap = size_t(tokens);
      kvsdk_cache_read(x.cache, l, h, x.raw.data() + at, x.raw.data() + at + cap * kDim, nullptr,
                       cap, &n);
      at += 2 * cap * kDim;
    }
  }
  size_t size = 0;
  kvsdk_cache_save_to_buffer(x.cache, save_options(), nullptr, 0, &size);
  x.snapshot.resize(size);
  kvsdk_cache_save_to_buffer(x.cache, save_options(), x.snapshot.data(), size, &size);
  x.baseline.resize(ZSTD_compressBound(x.fp16_bytes));
  x.baseline.resize(ZSTD_compress(x.baseline.data(), x.baseline.size(), x.raw.data(),
                                  x.fp16_bytes, 3));
  return x;
}

// A file in TMPDIR (or /tmp), never the working directory: an interrupted run leaves its
// temporary file there, not in a source tree.
std::string temp_file(const char* name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/" + name;
}

void report(benchmark::State& state, const Fixture& f, size_t out_bytes) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(f.fp16_bytes));
  state.counters["ratio"] = double(out_bytes) / double(f.fp16_bytes);
  state.counters["fp16_MiB"] = double(f.fp16_bytes) / double(1 << 20);
}

// threads: 0 for a default row, else a KVSDK_BENCH_THREADS row's count.
void BM_KvsdkSaveToBuffer(benchmark::State& state, int64_t threads) {
  Fixture& f = fixture(state.range(0));
  kvsdk_cache* cache = f.on_threads(threads).second;
  std::vector<unsigned char> buf(f.snapshot.size());
  size_t size = 0;
  for (auto _ : state) {
    if (kvsdk_cache_save_to_buffer(cache, save_options(), buf.data(), buf.size(), &size) != KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      break;
    }
  }
  report(state, f, size);
}

void BM_KvsdkLoadFromBuffer(benchmark::State& state, int64_t threads) {
  Fixture& f = fixture(state.range(0));
  kvsdk_context* ctx = f.on_threads(threads).first;
  for (auto _ : state) {
    kvsdk_cache* c = nullptr;
    if (kvsdk_cache_load_from_buffer(&c, ctx, f.snapshot.data(), f.snapshot.size(), nullptr,
                                     nullptr) != KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      break;
    }
    kvsdk_cache_destroy(c);
  }
  report(state, f, f.snapshot.size());
}

void BM_KvsdkSaveToFile(benchmark::State& state, int64_t threads) {
  Fixture& f = fixture(state.range(0));
  kvsdk_cache* cache = f.on_threads(threads).second;
  // Left in place for KvsdkLoadFromFile, which runs after it.
  const std::string path = temp_file("kvsdk_snapshot_bench.kvsnap");
  for (auto _ : state) {
    if (kvsdk_cache_save(cache, path.c_str(), save_options()) != KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      break;
    }
  }
  report(state, f, f.snapshot.size());
}

// What llama.cpp's state files do: the raw f16 rows written and fsync'd, no compression.
void BM_RawDumpSave(benchmark::State& state, int64_t /*threads*/) {
  Fixture& f = fixture(state.range(0));
  const std::string path = temp_file("kvsdk_snapshot_bench.raw");
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    bool ok = fd >= 0;
    const char* p = reinterpret_cast<const char*>(f.raw.data());
    for (uint64_t done = 0; ok && done < f.fp16_bytes;) {
      const ssize_t n = ::write(fd, p + done, size_t(f.fp16_bytes - done));
      ok = n > 0;
      done += ok ? uint64_t(n) : 0;
    }
    ok = ok && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) {
      state.SkipWithError("raw dump write failed");
      break;
    }
  }
  report(state, f, f.fp16_bytes);
}

// The raw dump read back into fresh memory (a load must allocate its cache). The file was just
// written, so it is read from the page cache, as kvsdk's file loads below are.
void BM_RawDumpLoad(benchmark::State& state, int64_t /*threads*/) {
  Fixture& f = fixture(state.range(0));
  const std::string path = temp_file("kvsdk_snapshot_bench.raw");
  for (auto _ : state) {
    std::unique_ptr<uint16_t[]> out(new uint16_t[f.raw.size()]);
    const int fd = ::open(path.c_str(), O_RDONLY);
    bool ok = fd >= 0;
    char* p = reinterpret_cast<char*>(out.get());
    for (uint64_t done = 0; ok && done < f.fp16_bytes;) {
      const ssize_t n = ::read(fd, p + done, size_t(f.fp16_bytes - done));
      ok = n > 0;
      done += ok ? uint64_t(n) : 0;
    }
    if (fd >= 0) ::close(fd);
    if (!ok) {
      state.SkipWithError("raw dump read failed (RawDumpSave runs first)");
      break;
    }
    benchmark::DoNotOptimize(out.get());
  }
  report(state, f, f.fp16_bytes);
}

// kvsdk_cache_load of the file KvsdkSaveToFile wrote (from the page cache).
void BM_KvsdkLoadFromFile(benchmark::State& state, int64_t threads) {
  Fixture& f = fixture(state.range(0));
  kvsdk_context* ctx = f.on_threads(threads).first;
  const std::string path = temp_file("kvsdk_snapshot_bench.kvsnap");
  for (auto _ : state) {
    kvsdk_cache* c = nullptr;
    if (kvsdk_cache_load(&c, ctx, path.c_str(), nullptr, nullptr) != KVSDK_OK) {
      state.SkipWithError(kvsdk_last_error());
      break;
    }
    kvsdk_cache_destroy(c);
  }
  report(state, f, f.snapshot.size());
}

void BM_BaselineZstd3Save(benchmark::State& state, int64_t /*threads*/) {
  Fixture& f = fixture(state.range(0));
  std::vector<unsigned char> out(ZSTD_compressBound(f.fp16_bytes));
  size_t n = 0;
  for (auto _ : state) {
    n = ZSTD_compress(out.data(), out.size(), f.raw.data(), f.fp16_bytes, 3);
    benchmark::DoNotOptimize(n);
  }
  report(state, f, n);
}

void BM_BaselineZstd3Load(benchmark::State& state, int64_t /*threads*/) {
  Fixture& f = fixture(state.range(0));
  for (auto _ : state) {
    // Fresh memory for the loaded KV, as any load needs (kvsdk's load allocates its cache too).
    std::unique_ptr<uint16_t[]> out(new uint16_t[f.raw.size()]);
    const size_t n = ZSTD_decompress(out.get(), f.fp16_bytes, f.baseline.data(), f.baseline.size());
    if (n != f.fp16_bytes) {
      state.SkipWithError("baseline decompression failed");
      break;
    }
    benchmark::DoNotOptimize(out.get());
  }
  report(state, f, f.baseline.size());
}

}  // namespace

// Registered token count first, so that each fixture is built once.
int main(int argc, char** argv) {
  // Writers before the readers of their files: RawDumpSave -> RawDumpLoad, KvsdkSaveToFile ->
  // KvsdkLoadFromFile.
  const std::pair<const char*, void (*)(benchmark::State&, int64_t)> benches[] = {
      {"RawDumpSave", BM_RawDumpSave},
      {"BaselineZstd3Save", BM_BaselineZstd3Save},
      {"KvsdkSaveToBuffer", BM_KvsdkSaveToBuffer},
      {"KvsdkSaveToFile", BM_KvsdkSaveToFile},
      {"RawDumpLoad", BM_RawDumpLoad},
      {"BaselineZstd3Load", BM_BaselineZstd3Load},
      {"KvsdkLoadFromBuffer", BM_KvsdkLoadFromBuffer},
      {"KvsdkLoadFromFile", BM_KvsdkLoadFromFile}};
  for (int64_t t : token_counts()) {
    for (const auto& [name, fn] : benches) {
      // CPU time of the (single-threaded) process: the build machine is shared, so wall time
      // measures the neighbours. File saves add fsync wait on top (not in CPU time).
      benchmark::RegisterBenchmark(name, fn, int64_t(0))
          ->Arg(t)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(2);
    }
    // Wall-clock rows: the baselines (threads:0), then kvsdk on each thread count.
    const std::vector<int64_t> threads = env_list("KVSDK_BENCH_THREADS");
    if (threads.empty()) continue;
    for (const auto& [name, fn] : benches) {
      const bool kvsdk = std::string(name).rfind("Kvsdk", 0) == 0;
      for (int64_t n : kvsdk ? threads : std::vector<int64_t>{0}) {
        const std::string row = std::string(name) + "/threads:" + std::to_string(n);
        benchmark::RegisterBenchmark(row.c_str(), fn, n)
            ->Arg(t)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->Iterations(2);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::remove(temp_file("kvsdk_snapshot_bench.raw").c_str());
  std::remove(temp_file("kvsdk_snapshot_bench.kvsnap").c_str());
  return 0;
}
