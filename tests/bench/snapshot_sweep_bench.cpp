// Save and load time per token across conversation lengths, every 64 tokens from 64 to 4096, per
// preset, on real keys and values (issue 18, deliverable 4: "so that no cliff hides"). The
// bundled shakespeare-base model reads the held-out part of tinyshakespeare
// (KVSDK_SHARED_DIR/data) 64 tokens at a time through the reference runtime, whose KV cache is
// the preset's kvsdk cache; after every chunk the cache is saved to a file (with fsync, as
// kvsdk_cache_save does), to a buffer, and loaded back from the file. Each is timed as the best
// of 3 (wall clock), and the table prints microseconds per token held in the snapshot's
// conversation (tokens seen), so a flat column is a linear cost. The last lines give, per preset,
// max/min of each per-token column over the range (issue 18 asks for < 2x).
//
//   cmake --preset release && cmake --build build/release --target snapshot_sweep_bench
//   ./build/release/tests/bench/snapshot_sweep_bench [preset ...] [--max-tokens N]
//
// Positions run past the model's trained context (1024) after the first 1024 tokens: the keys
// and values stay real activations of the model, which is what the snapshot sizes depend on.
// Skips (exit 0, with a message) when the held-out text is absent.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "model.h"
#include "session.h"
#include "tokenizer.h"

namespace {

constexpr size_t kChunk = 64;
constexpr size_t kHeldOutStart = 1003854;  // ../shared/data/README.md
constexpr int kRepeats = 3;

const char* const kDefaultPresets[] = {"full",    "kivi",         "kivi+kivi4", "kivi+kivi8",
                                       "snapkv",  "snapkv+kivi2", "h2o",        "streaming_llm",
                                       "spindlekv", "minicache",  "specache"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
  size_t tokens;
  double save_file, save_buffer, load;  // seconds, best of kRepeats
  size_t bytes;
};

bool check(kvsdk_status s, const char* what) {
  if (s != KVSDK_OK) std::fprintf(stderr, "%s: %s\n", what, kvsdk_last_error());
  return s == KVSDK_OK;
}

bool sweep(const llama::Model& model, const std::vector<int>& tokens, kvsdk_context* ctx,
           const std::string& preset, const std::string& file, std::vector<Row>* rows) {
  kvsdk_policy policy;
  if (!check(kvsdk_policy_parse(&policy, preset.c_str()), preset.c_str())) return false;
  llama::Session session(model, ctx, &policy);
  const kvsdk_geometry g = llama::geometry_of(model.config());
  std::vector<unsigned char> buf;
  for (size_t done = 0; done + kChunk <= tokens.size(); done += kChunk) {
    session.forward(tokens.data() + done, kChunk, nullptr);
    Row r{done + kChunk, 1e9, 1e9, 1e9, 0};
    for (int rep = 0; rep < kRepeats; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      if (!check(kvsdk_cache_save(session.cache(), file.c_str(), nullptr), "save")) return false;
      r.save_file = std::min(r.save_file, seconds_since(t0));
      size_t size = 0;
      if (!check(kvsdk_cache_save_to_buffer(session.cache(), nullptr, nullptr, 0, &size), "size")) {
        return false;
      }
      buf.resize(size);
      t0 = std::chrono::steady_clock::now();
      if (!check(kvsdk_cache_save_to_buffer(session.cache(), nullptr, buf.data(), buf.size(), &size),
                 "save to buffer")) {
        return false;
      }
      r.save_buffer = std::min(r.save_buffer, seconds_since(t0));
      r.bytes = size;
      kvsdk_cache* loaded = nullptr;
      t0 = std::chrono::steady_clock::now();
      if (!check(kvsdk_cache_load(&loaded, ctx, file.c_str(), &g, nullptr), "load")) return false;
      r.load = std::min(r.load, seconds_since(t0));
      kvsdk_cache_destroy(loaded);
    }
    rows->push_back(r);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> presets;
  size_t max_tokens = 4096;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) {
      max_tokens = size_t(std::strtoull(argv[++i], nullptr, 10));
    } else {
      presets.emplace_back(argv[i]);
    }
  }
  if (presets.empty()) presets.assign(std::begin(kDefaultPresets), std::end(kDefaultPresets));
  const char* env = std::getenv("KVSDK_SHARED_DIR");
  const std::string shared = env ? env : KVSDK_SHARED_DIR;
  std::ifstream in(shared + "/data/tinyshakespeare.txt", std::ios::binary);
  if (!in) {
    std::printf("SKIPPED: %s/data/tinyshakespeare.txt is absent (set KVSDK_SHARED_DIR)\n",
                shared.c_str());
    return 0;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.size() <= kHeldOutStart) {
    std::fprintf(stderr, "tinyshakespeare.txt is shorter than its held-out start\n");
    return 1;
  }
  const std::string models = std::string(KVSDK_SOURCE_DIR) + "/samples/models/";
  const llama::Model model = llama::Model::load(models + "shakespeare-base.bin");
  const llama::Tokenizer tok =
      llama::Tokenizer::load(models + "shakespeare-base.tok.bin", model.config().vocab_size);
  std::vector<int> tokens = tok.encode(text.substr(kHeldOutStart), false);
  tokens.resize(std::min(tokens.size(), max_tokens) / kChunk * kChunk);

  kvsdk_context_options co;
  kvsdk_context_options_init(&co);
  co.n_threads = 1;
  kvsdk_context* ctx = nullptr;
  if (!check(kvsdk_context_create(&ctx, &co), "context")) return 1;
  const std::string file = "snapshot_sweep_bench.kvs";
  std::printf("%-14s %6s %12s %12s %12s %10s\n", "preset", "tokens", "save us/tok", "buffer us/tok",
              "load us/tok", "B/tok");
  std::vector<std::pair<std::string, std::vector<Row>>> all;
  int rc = 0;
  for (const std::string& p : presets) {
    std::vector<Row> rows;
    if (!sweep(model, tokens, ctx, p, file, &rows)) {
      rc = 1;
      continue;
    }
    for (const Row& r : rows) {
      const double n = double(r.tokens);
      std::printf("%-14s %6zu %12.3f %12.3f %12.3f %10.1f\n", p.c_str(), r.tokens,
                  r.save_file * 1e6 / n, r.save_buffer * 1e6 / n, r.load * 1e6 / n,
                  double(r.bytes) / n);
    }
    all.emplace_back(p, std::move(rows));
  }
  std::remove(file.c_str());
  std::printf("\nmax/min of the per-token time over %zu..%zu tokens (issue 18: < 2 everywhere)\n",
              kChunk, tokens.size());
  std::printf("%-14s %10s %10s %10s\n", "preset", "save", "buffer", "load");
  for (const auto& [p, rows] : all) {
    const auto spread = [&](double Row::*f) {
      double lo = 1e30, hi = 0;
      for (const Row& r : rows) {
        const double x = r.*f / double(r.tokens);
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      return hi / lo;
    };
    std::printf("%-14s %10.2f %10.2f %10.2f\n", p.c_str(), spread(&Row::save_file),
                spread(&Row::save_buffer), spread(&Row::load));
  }
  kvsdk_context_destroy(ctx);
  return rc;
}
