// Benchmark (issue 15, deliverable 4): end-to-end decode tokens/s of the reference runtime
// (samples/llama: embedding, RMSNorm, RoPE, SwiGLU, f32 matmuls, and kvsdk's append, attend,
// observe and prefetch) per preset, against `full` in the same run, on Llama-3-8B-like layers:
// width 4096, 32 query heads, 8 KV heads, head_dim 128, SwiGLU width 14336.
//
// The weights are pseudo-random (llama::Model::synthetic): decode speed does not depend on their
// values, and no 8B checkpoint ships with the project. The layers are 2 by default
// (KVSDK_BENCH_LAYERS): MiniCache merges adjacent layers and PyramidKV sizes layers by depth,
// so one is not enough; more layers only repeat the per-layer work. The classifier has 4,008
// rows, Llama-3-8B's 128,256-entry vocabulary over its 32 layers, so that the logits'
// share of a step is a layer's share in the real model. The matmuls read f32 weights (the
// reference runtime has no quantized ones), ~1.8 GB a step, against 128 MiB of f16 keys and
// values for a full cache at 32k tokens: the weights bound the step, and the presets' differences
// show as a few percent of it. With 4-bit weights (8x fewer bytes) the cache's share, and the
// presets' differences, would be about 8x larger; this runtime cannot measure that.
//
// Each cache is filled to N tokens (KVSDK_BENCH_TOKENS, default 4096,32768) by appending
// pseudo-random keys and values layer by layer in chunks of 512 tokens and observing each chunk's
// last 32 queries (the eviction presets' window), as a prefill would; the fill is not timed. Each
// iteration then decodes one token: llama::Session::step (append, attend, observe per layer, then
// the logits), or for `specache` llama::SpeCacheDecoder::step (the output and the speculative
// token together, and the prefetch; SpeCache (docs/papers.md) §3.3). KVSDK_BENCH_STEPS (default
// 5) tokens per row. Contexts use their default thread count (all cores), as the demo's do.
//
// Rows run as full, preset 1, full, preset 2, ..., full for each N (the full session keeps
// decoding on one cache), and the summary printed after the table divides each preset's
// tokens/s by the mean of the full rows just before and after it: on a shared or virtual
// machine single rows drift. Two presets are measured by kvsdk-demo on the bundled models
// instead (scripts/e2e_ratios.py): `smallkv` needs a proxy model of the same family (a second
// synthetic model would time a pairing no one ships), and `spindlekv`'s codebook layers compress
// only keys that repeat directions, as real keys do and pseudo-random rows do not (filled with
// them, its codebook layer is as large as an exact one and 50% of a full cache cannot hold it).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "context_handle.h"
#include "error.h"
#include "generate.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "specache_decode.h"

namespace {

std::vector<int64_t> env_list(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  std::vector<int64_t> out;
  std::stringstream ss(v && *v ? v : fallback);
  for (std::string s; std::getline(ss, s, ',');) {
    if (!s.empty()) out.push_back(std::stoll(s));
  }
  return out;
}

const llama::Model& model() {
  static const llama::Model m = [] {
    llama::Config c;
    c.dim = 4096;
    c.hidden_dim = 14336;
    c.n_layers = int(env_list("KVSDK_BENCH_LAYERS", "2").at(0));
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.vocab_size = 4008;
    c.seq_len = 1 << 20;
    c.shared_classifier = true;
    return llama::Model::synthetic(c, 0x6b7673646b2d7274ull);
  }();
  return m;
}

int steps() { return int(env_list("KVSDK_BENCH_STEPS", "5").at(0)); }

struct Preset {
  const char* label;   // row name
  const char* policy;  // kvsdk_policy_parse spec
  double budget;       // share of a full cache of N + every row's steps
};
constexpr Preset kPresets[] = {
    {"kivi@50%", "kivi", 0.50},
    {"snapkv@25%", "snapkv", 0.25},
    {"snapkv+kivi2@25%", "snapkv+kivi2", 0.25},
    {"xkv+kivi2@25%", "xkv+kivi2", 0.25},
    {"pyramidkv@25%", "pyramidkv", 0.25},
    {"h2o@25%", "h2o", 0.25},
    {"streaming_llm@25%", "streaming_llm", 0.25},
    {"specache", "specache", 1.0},
    {"minicache", "minicache", 1.0},
};
constexpr size_t kPresetCount = sizeof(kPresets) / sizeof(kPresets[0]);

// Bytes of a full cache of N tokens plus every row's decode steps (the budgets' 100%).
uint64_t full_bytes(int64_t n) {
  static const uint64_t per_token = llama::full_cache_bytes_per_token(model());
  return per_token * uint64_t(n + int64_t(kPresetCount + 2) * steps() + 8);
}

// Appends N pseudo-random tokens to every layer, observing each chunk's last 32 queries.
void fill(kvsdk_cache* cache, int64_t n) {
  const llama::Config& c = model().config();
  const size_t kv = size_t(c.kv_dim()), d = size_t(c.dim), chunk = 512, window = 32;
  std::vector<float> k(chunk * kv), v(chunk * kv), q(window * d);
  std::vector<int32_t> pos(chunk);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto normalish = [&x] {  // a sum of four uniform bytes: close to normal, unit variance
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const int s =
        int(x & 0xff) + int((x >> 8) & 0xff) + int((x >> 16) & 0xff) + int((x >> 24) & 0xff);
    return (float(s) - 510.0f) / 147.8f;
  };
  for (uint32_t l = 0; l < uint32_t(c.n_layers); ++l) {
    for (int64_t t0 = 0; t0 < n; t0 += int64_t(chunk)) {
      const size_t rows = size_t(std::min<int64_t>(int64_t(chunk), n - t0));
      for (size_t i = 0; i < rows * kv; ++i) {
        k[i] = normalish();
        v[i] = normalish();
      }
      for (size_t i = 0; i < rows; ++i) pos[i] = int32_t(t0 + int64_t(i));
      llama::check(kvsdk_cache_append(cache, l, rows, k.data(), v.data(), pos.data(),
                                      rows * kv * sizeof(float)),
                   "kvsdk_cache_append");
      const size_t w = std::min(window, rows);
      for (size_t i = 0; i < w * d; ++i) q[i] = normalish();
      llama::check(kvsdk_cache_observe(cache, l, w, q.data(), pos.data() + (rows - w),
                                       w * d * sizeof(float)),
                   "kvsdk_cache_observe");
    }
  }
}

// A conversation of one preset at N tokens: its context, cache and decoder.
struct Conversation {
  std::unique_ptr<llama::ContextHandle> ctx;
  std::unique_ptr<llama::Session> session;            // every policy but specache
  kvsdk_cache* specache_cache = nullptr;              // owned (SpeCacheDecoder does not own it)
  std::unique_ptr<llama::SpeCacheDecoder> specache;
  std::vector<float> logits;
  int token = 1, spec = 0;

  Conversation(const Preset& p, int64_t n) : logits(size_t(model().config().vocab_size)) {
    ctx = std::make_unique<llama::ContextHandle>(uint64_t(p.budget * double(full_bytes(n))));
    kvsdk_policy policy;
    llama::check(kvsdk_policy_parse(&policy, p.policy), "kvsdk_policy_parse");
    const kvsdk_geometry g = llama::geometry_of(model().config());
    kvsdk_cache* cache = nullptr;
    llama::check(kvsdk_cache_create(&cache, ctx->ctx, &g, &policy), "kvsdk_cache_create");
    try {
      fill(cache, n);
      if (policy.method == KVSDK_METHOD_SPECACHE) {
        specache = std::make_unique<llama::SpeCacheDecoder>(model(), cache, int(n));
        spec = specache->pre_decode(token);  // Algorithm 2: the first speculative token (untimed)
        specache_cache = cache;
      } else {
        session = std::make_unique<llama::Session>(model(), cache, int(n));  // owns it from here
      }
    } catch (...) {
      specache.reset();
      if (!session) kvsdk_cache_destroy(cache);
      throw;
    }
  }
  ~Conversation() {
    specache.reset();
    kvsdk_cache_destroy(specache_cache);
    session.reset();
  }

  // One decoded token, greedy.
  void step() {
    const size_t vocab = logits.size();
    if (specache) {
      spec = specache->step(token, spec, logits.data());
      token = llama::argmax(logits.data(), vocab);
    } else {
      token = llama::argmax(session->step(token), vocab);
    }
  }
};

// Seconds per token of each row, by registration index, for the summary.
std::map<std::pair<int64_t, int>, double>& seconds_per_token() {
  static std::map<std::pair<int64_t, int>, double> m;
  return m;
}

// The full conversation of the current N, shared by its full rows.
std::unique_ptr<Conversation>& full_conversation(int64_t n) {
  static std::map<int64_t, std::unique_ptr<Conversation>> m;
  return m[n];
}

constexpr Preset kFull = {"full", "full", 1.0};

void run_row(benchmark::State& state, int64_t n, int slot, const Preset* p) {
  std::unique_ptr<Conversation> own;
  Conversation* conv = nullptr;
  try {
    if (p == &kFull) {
      std::unique_ptr<Conversation>& f = full_conversation(n);
      if (!f) f = std::make_unique<Conversation>(kFull, n);
      conv = f.get();
    } else {
      own = std::make_unique<Conversation>(*p, n);
      conv = own.get();
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) conv->step();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      double(state.iterations());
  seconds_per_token()[{n, slot}] = secs;
  state.counters["tokens_per_s"] = 1.0 / secs;
  // Against the full row just before (the summary also takes the one after).
  const auto before = seconds_per_token().find({n, slot - 1});
  if (p != &kFull && before != seconds_per_token().end()) {
    state.counters["x_full_before"] = before->second / secs;
  }
  state.SetLabel(p->label);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> sizes = env_list("KVSDK_BENCH_TOKENS", "4096,32768");
  const int n_steps = steps();
  // Registration order is run order: full, preset, full, preset, ..., full per size.
  struct Row {
    int64_t n;
    int slot;
    const Preset* p;
  };
  std::vector<Row> rows;
  for (int64_t n : sizes) {
    int slot = 0;
    rows.push_back({n, slot++, &kFull});
    for (const Preset& p : kPresets) {
      rows.push_back({n, slot++, &p});
      rows.push_back({n, slot++, &kFull});
    }
  }
  for (const Row& r : rows) {
    const std::string name = std::string("decode/") + std::to_string(r.n) + "/" +
                             std::to_string(r.slot) + "/" + r.p->label;
    benchmark::RegisterBenchmark(name.c_str(),
                                 [r](benchmark::State& st) { run_row(st, r.n, r.slot, r.p); })
        ->Iterations(n_steps)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // Each preset's tokens/s over the mean of the full rows around it (rows the filter left out
  // are missing from the map and skipped).
  std::printf("\nx full: a preset's tokens/s / the mean tokens/s of the full rows around it\n");
  const auto& sec = seconds_per_token();
  for (const Row& r : rows) {
    if (r.p == &kFull) continue;
    const auto self = sec.find({r.n, r.slot}), a = sec.find({r.n, r.slot - 1}),
               b = sec.find({r.n, r.slot + 1});
    if (self == sec.end() || a == sec.end() || b == sec.end()) continue;
    const double full_rate = (1.0 / a->second + 1.0 / b->second) / 2.0;
    std::printf("%6lld tokens  %-20s x full %.2f  (%.2f tokens/s; full %.2f and %.2f)\n",
                static_cast<long long>(r.n), r.p->label, (1.0 / self->second) / full_rate,
                1.0 / self->second, 1.0 / a->second, 1.0 / b->second);
  }
  return 0;
}
