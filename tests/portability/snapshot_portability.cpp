// Cross-architecture snapshot driver: one deterministic conversation per preset family, saved
// by one build and continued by another (x86-64 <-> aarch64 under qemu). Public C ABI only.
//
//   kvsdk-snapshot-portability write DIR [PRESET...]   for each preset (default: every one in
//       kPresets) saves DIR/<preset>.kvsdk (a full save, then one journal delta; smallkv also
//       saves its proxy's cache as DIR/<preset>.proxy.kvsdk) and DIR/<preset>.expected (the
//       outputs of the writer's own uninterrupted continuation)
//   kvsdk-snapshot-portability check DIR [PRESET...]   loads each snapshot, continues the
//       conversation and compares (exit 0 = every preset portable)
//   kvsdk-snapshot-portability list                    prints the presets
//
// The conversation: steps of up to kChunk tokens per layer (append, observe the step's queries,
// attend them causally; specache prefetches a speculative query before each attend; smallkv's
// proxy, a 'full' cache of a smaller model, runs its step first). Evicting presets hold a
// per-cache budget of half the exact size of the whole conversation (spindlekv: 3/4), so they evict before the
// save and keep evicting after the load; KIVI groups and windows are small enough that rows are
// quantized, and smallkv has matched its heads before the save (see kvsdk.h: a snapshot taken
// later continues bit-identically).
//
// check demands, bit for bit: the loaded cache holds exactly what an uninterrupted cache of this
// build holds (keys, values, positions, token counts, bytes), its continuation's attention outputs
// equal that uninterrupted cache's, and equal the writer's recorded outputs too: kvsdk is built
// with -ffp-contract=off and computes exp/sin/cos/acos/pow itself (backends/cpu/portable_math.h)
// rather than with the platform's libm, so no architecture or C library rounds differently. On
// failure it reports how many floats are bit-identical and the largest difference.
#include <kvsdk.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kLayers = 4, kQHeads = 4, kKvHeads = 2, kHeadDim = 32;
constexpr uint32_t kProxyQHeads = 2, kProxyKvHeads = 1;  // smallkv's proxy: a smaller model
constexpr int32_t kSavedTokens = 40;     // in the full save
constexpr int32_t kDeltaTokens = 16;     // in the journal delta after it
constexpr int32_t kFurtherTokens = 24;   // appended after the load
constexpr int32_t kTotal = kSavedTokens + kDeltaTokens + kFurtherTokens;
constexpr int32_t kChunk = 13;           // tokens per step (not a divisor of the counts)
constexpr uint32_t kExpectedMagic = 0x4b56504fu;  // "OPVK" little-endian: a portability record

// Every preset family; the evicting ones run under a budget (see make_preset).
const char* const kPresets[] = {"full",      "streaming_llm", "h2o",       "snapkv",
                                "pyramidkv", "xkv",           "kivi",      "xkv+kivi2",
                                "h2o+kivi4", "spindlekv",     "minicache", "minicache+kivi4",
                                "smallkv",   "specache"};

// Arch-independent pseudo-random values: splitmix64, then 24 bits -> [-1, 1) exactly in f32.
float value_at(uint64_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int32_t>(z >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

// Rows of tokens [first, first + count): [count][heads][kHeadDim]. Streams: 1 keys, 2 values,
// 3 queries, 4 speculative queries (specache), 5..7 the proxy's keys, values and queries.
// Queries are scaled up so that the softmax is far from uniform (evictions depend on it).
std::vector<float> rows(uint32_t layer, int32_t first, int32_t count, uint32_t heads,
                        uint64_t stream) {
  const float scale = stream == 3 || stream == 4 || stream == 7 ? 4.0f : 1.0f;
  std::vector<float> out(size_t(count) * heads * kHeadDim);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t token = uint64_t(first) + i / (heads * kHeadDim);
    const uint64_t key = (stream << 56) | (uint64_t(layer) << 48) | (token << 16) |
                         (i % (heads * kHeadDim));
    out[i] = scale * value_at(key);
  }
  return out;
}

std::vector<int32_t> positions(int32_t first, int32_t count) {
  std::vector<int32_t> pos(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) pos[size_t(i)] = first + i;
  return pos;
}

bool ok(kvsdk_status st, const char* what) {
  if (st == KVSDK_OK) return true;
  std::fprintf(stderr, "%s: %s (%s)\n", what, kvsdk_status_str(st), kvsdk_last_error());
  return false;
}

struct Preset {
  std::string name;
  kvsdk_policy policy;
  uint64_t budget = 0;  // per-cache budget (kvsdk_cache_set_budget), 0: none
  bool proxy = false;   // smallkv
  bool prefetch = false;  // specache
};

kvsdk_geometry geometry(bool proxy) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = kLayers;
  g.n_q_heads = proxy ? kProxyQHeads : kQHeads;
  g.n_kv_heads = proxy ? kProxyKvHeads : kKvHeads;
  g.head_dim = kHeadDim;
  g.dtype = KVSDK_DTYPE_F32;  // stored as f16; f32 in and out makes every output bit visible
  return g;
}

// A share of what an exact cache of the whole conversation holds (f16 keys and values, an int32
// position per row): evicting presets must evict, before the save and after the load.
uint64_t share_of_full(uint64_t percent) {
  return uint64_t(kLayers) * kKvHeads * kTotal * (2u * kHeadDim * 2u + 4u) * percent / 100u;
}

bool make_preset(const std::string& name, Preset* p) {
  p->name = name;
  if (!ok(kvsdk_policy_parse(&p->policy, name.c_str()), name.c_str())) return false;
  kvsdk_policy& pol = p->policy;
  pol.quant_group = 8;     // KIVI blocks fill after a few tokens
  pol.quant_residual = 8;
  pol.obs_window = 8;
  pol.pool_kernel = 3;
  pol.sink_tokens = 2;
  pol.fetch_tokens = 8;    // specache
  pol.match_tokens = 16;   // smallkv: matched well before the save
  const int32_t m = pol.method;
  const bool never_evicts = m == KVSDK_METHOD_FULL || m == KVSDK_METHOD_KIVI ||
                            m == KVSDK_METHOD_MINICACHE || m == KVSDK_METHOD_SPECACHE;
  // spindlekv's codebook layers (below boundary_layer) alone take ~45% of the exact size; its
  // evicting layers get the rest of 75%.
  p->budget = never_evicts ? 0 : share_of_full(m == KVSDK_METHOD_SPINDLEKV ? 75 : 50);
  p->proxy = m == KVSDK_METHOD_SMALLKV;
  p->prefetch = m == KVSDK_METHOD_SPECACHE;
  return true;
}

std::string file_stem(const std::string& dir, const std::string& preset) {
  std::string s = preset;
  std::replace(s.begin(), s.end(), '+', '_');
  return dir + "/" + s;
}

struct Session {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  kvsdk_cache* proxy = nullptr;
  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    kvsdk_cache_destroy(cache);
    kvsdk_cache_destroy(proxy);
    kvsdk_context_destroy(ctx);
  }
};

bool make_context(Session* s) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);  // CPU, unlimited budget (budgets are per cache)
  return ok(kvsdk_context_create(&s->ctx, &o), "context_create");
}

bool make_caches(const Preset& p, Session* s) {
  const kvsdk_geometry g = geometry(false);
  if (!make_context(s) || !ok(kvsdk_cache_create(&s->cache, s->ctx, &g, &p.policy), "create"))
    return false;
  if (p.budget && !ok(kvsdk_cache_set_budget(s->cache, p.budget), "set_budget")) return false;
  if (!p.proxy) return true;
  const kvsdk_geometry pg = geometry(true);
  return ok(kvsdk_cache_create(&s->proxy, s->ctx, &pg, nullptr), "create proxy") &&
         ok(kvsdk_cache_set_proxy(s->cache, s->proxy), "set_proxy");
}

// Append + attend of tokens [first, first + n) in one layer of a cache of `heads` query heads.
bool append_attend(kvsdk_cache* cache, uint32_t layer, int32_t first, int32_t n, uint32_t q_heads,
                   uint32_t kv_heads, uint64_t stream0, const Preset* p,
                   std::vector<float>* outputs) {
  const std::vector<float> k = rows(layer, first, n, kv_heads, stream0);
  const std::vector<float> v = rows(layer, first, n, kv_heads, stream0 + 1);
  const std::vector<float> q = rows(layer, first, n, q_heads, stream0 + 2);
  const std::vector<int32_t> pos = positions(first, n);
  if (!ok(kvsdk_cache_append(cache, layer, size_t(n), k.data(), v.data(), pos.data(),
                             k.size() * sizeof(float)),
          "append"))
    return false;
  const size_t q_bytes = q.size() * sizeof(float);
  if (p && !ok(kvsdk_cache_observe(cache, layer, size_t(n), q.data(), pos.data(), q_bytes),
               "observe"))
    return false;
  if (p && p->prefetch) {  // the speculative next token's query, before the step's attend
    const std::vector<float> sq = rows(layer, first + n, 1, q_heads, 4);
    const int32_t spos = first + n;
    if (!ok(kvsdk_cache_prefetch(cache, layer, 1, sq.data(), &spos, sq.size() * sizeof(float)),
            "prefetch"))
      return false;
  }
  std::vector<float> out(q.size());
  if (!ok(kvsdk_cache_attend(cache, layer, size_t(n), q.data(), pos.data(), q_bytes, out.data(),
                             q_bytes),
          "attend"))
    return false;
  if (outputs) outputs->insert(outputs->end(), out.begin(), out.end());
  return true;
}

// Steps over tokens [first, first + count); attention outputs go to `outputs` (may be NULL).
bool run_steps(const Preset& p, Session* s, int32_t first, int32_t count,
               std::vector<float>* outputs) {
  for (int32_t at = first; at < first + count; at += kChunk) {
    const int32_t n = std::min(kChunk, first + count - at);
    // smallkv: the proxy's step (every layer) runs just before the large model's.
    for (uint32_t layer = 0; s->proxy && layer < kLayers; ++layer) {
      if (!append_attend(s->proxy, layer, at, n, kProxyQHeads, kProxyKvHeads, 5, nullptr,
                         outputs))
        return false;
    }
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      if (!append_attend(s->cache, layer, at, n, kQHeads, kKvHeads, 1, &p, outputs)) return false;
    }
  }
  return true;
}

bool save(kvsdk_cache* cache, const std::string& path, bool delta) {
  // Default options: specache's backing store included, so it resumes exactly.
  return delta ? ok(kvsdk_cache_save_delta(cache, path.c_str(), nullptr), "save_delta")
               : ok(kvsdk_cache_save(cache, path.c_str(), nullptr), "save");
}

// The conversation as the writer had it when it saved: full save, then a journal delta.
bool build_saved_state(const Preset& p, Session* s, const std::string* stem) {
  if (!make_caches(p, s) || !run_steps(p, s, 0, kSavedTokens, nullptr)) return false;
  if (stem && (!save(s->cache, *stem + ".kvsdk", false) ||
               (s->proxy && !save(s->proxy, *stem + ".proxy.kvsdk", false))))
    return false;
  if (!run_steps(p, s, kSavedTokens, kDeltaTokens, nullptr)) return false;
  return !stem || (save(s->cache, *stem + ".kvsdk", true) &&
                   (!s->proxy || save(s->proxy, *stem + ".proxy.kvsdk", true)));
}

bool write_record(const std::string& path, const std::vector<float>& outputs, uint64_t tokens) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  // Both supported architectures are little-endian, as is the snapshot format; the record is
  // written in native order and its magic number would expose a big-endian reader.
  const uint32_t header[2] = {kExpectedMagic, uint32_t(outputs.size())};
  bool good = std::fwrite(header, sizeof header, 1, f) == 1 &&
              std::fwrite(&tokens, sizeof tokens, 1, f) == 1 &&
              std::fwrite(outputs.data(), sizeof(float), outputs.size(), f) == outputs.size();
  return std::fclose(f) == 0 && good;
}

bool read_record(const std::string& path, std::vector<float>* outputs, uint64_t* tokens) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  uint32_t header[2] = {0, 0};
  bool good = std::fread(header, sizeof header, 1, f) == 1 && header[0] == kExpectedMagic &&
              header[1] <= (1u << 24) && std::fread(tokens, sizeof *tokens, 1, f) == 1;
  if (good) {
    outputs->resize(header[1]);
    good = std::fread(outputs->data(), sizeof(float), outputs->size(), f) == outputs->size() &&
           std::fgetc(f) == EOF;  // nothing after the outputs
  }
  std::fclose(f);
  return good;
}

bool stats(const kvsdk_cache* cache, kvsdk_cache_stats* st) {
  std::memset(st, 0, sizeof *st);
  st->struct_size = sizeof *st;
  return ok(kvsdk_cache_stats_get(cache, st), "stats");
}

int write_preset(const std::string& dir, const Preset& p) {
  const std::string stem = file_stem(dir, p.name);
  Session s;
  std::vector<float> outputs;
  kvsdk_cache_stats st;
  if (!build_saved_state(p, &s, &stem) ||
      !run_steps(p, &s, kSavedTokens + kDeltaTokens, kFurtherTokens, &outputs) ||
      !stats(s.cache, &st))
    return 1;
  if (!write_record(stem + ".expected", outputs, st.tokens)) {
    std::fprintf(stderr, "cannot write %s.expected\n", stem.c_str());
    return 1;
  }
  std::printf("%-16s wrote %s.kvsdk (%d + %d tokens per layer, %llu of %llu appended rows "
              "held) and the continuation's %zu outputs\n",
              p.name.c_str(), stem.c_str(), kSavedTokens, kDeltaTokens,
              (unsigned long long)st.tokens, (unsigned long long)st.appended_tokens * kKvHeads,
              outputs.size());
  return 0;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// Every layer and KV head of `loaded` holds what `reference` holds, bit for bit.
bool same_contents(const kvsdk_cache* loaded, const kvsdk_cache* reference, uint32_t kv_heads,
                   const char* which) {
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint32_t head = 0; head < kv_heads; ++head) {
      size_t n_ref = 0, n_got = 0;
      if (!ok(kvsdk_cache_read(reference, layer, head, nullptr, nullptr, nullptr, 0, &n_ref),
              "read") ||
          !ok(kvsdk_cache_read(loaded, layer, head, nullptr, nullptr, nullptr, 0, &n_got),
              "read"))
        return false;
      if (n_ref != n_got) {
        std::fprintf(stderr, "%s layer %u head %u: %zu tokens loaded, %zu expected\n", which,
                     layer, head, n_got, n_ref);
        return false;
      }
      std::vector<float> k1(n_ref * kHeadDim), v1(k1.size()), k2(k1.size()), v2(k1.size());
      std::vector<int32_t> p1(n_ref), p2(n_ref);
      if (!ok(kvsdk_cache_read(reference, layer, head, k1.data(), v1.data(), p1.data(), n_ref,
                               &n_ref),
              "read") ||
          !ok(kvsdk_cache_read(loaded, layer, head, k2.data(), v2.data(), p2.data(), n_ref,
                               &n_got),
              "read"))
        return false;
      if (!same_bits(k1.data(), k2.data(), k1.size() * 4) ||
          !same_bits(v1.data(), v2.data(), v1.size() * 4) ||
          !same_bits(p1.data(), p2.data(), p1.size() * 4)) {
        std::fprintf(stderr, "%s layer %u head %u: loaded rows differ from the original\n",
                     which, layer, head);
        return false;
      }
    }
  }
  kvsdk_cache_stats a, b;
  if (!stats(loaded, &a) || !stats(reference, &b)) return false;
  if (a.tokens != b.tokens || a.appended_tokens != b.appended_tokens || a.bytes != b.bytes) {
    std::fprintf(stderr, "%s stats differ: tokens %llu/%llu appended %llu/%llu bytes %llu/%llu\n",
                 which, (unsigned long long)a.tokens, (unsigned long long)b.tokens,
                 (unsigned long long)a.appended_tokens, (unsigned long long)b.appended_tokens,
                 (unsigned long long)a.bytes, (unsigned long long)b.bytes);
    return false;
  }
  return true;
}

bool load(Session* s, const std::string& path) {
  kvsdk_load_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  kvsdk_cache** out = s->cache ? &s->proxy : &s->cache;
  if (!ok(kvsdk_cache_load(out, s->ctx, path.c_str(), nullptr, &info), path.c_str()))
    return false;
  if (info.journal_frames_applied == 0 || info.journal_frames_dropped != 0) {
    std::fprintf(stderr, "%s: %u journal frames applied, %u dropped (expected >0 and 0)\n",
                 path.c_str(), info.journal_frames_applied, info.journal_frames_dropped);
    return false;
  }
  return true;
}

int check_preset(const std::string& dir, const Preset& p) {
  const std::string stem = file_stem(dir, p.name);
  std::vector<float> writer_outputs;
  uint64_t writer_tokens = 0;
  if (!read_record(stem + ".expected", &writer_outputs, &writer_tokens)) {
    std::fprintf(stderr, "%s: cannot read %s.expected (missing or malformed; run 'write' "
                 "first)\n", p.name.c_str(), stem.c_str());
    return 1;
  }
  // The loaded cache is re-linked and re-budgeted by the host, as kvsdk.h describes: neither the
  // proxy link nor a per-cache budget is part of a snapshot.
  Session loaded;
  if (!make_context(&loaded) || !load(&loaded, stem + ".kvsdk") ||
      (p.proxy && !load(&loaded, stem + ".proxy.kvsdk")))
    return 1;
  kvsdk_policy pol;
  std::memset(&pol, 0, sizeof pol);
  pol.struct_size = sizeof pol;
  if (!ok(kvsdk_cache_policy(loaded.cache, &pol), "policy")) return 1;
  if (pol.method != p.policy.method || pol.quant_bits != p.policy.quant_bits) {
    std::fprintf(stderr, "%s: the snapshot holds method %d+kivi%d, not this preset\n",
                 p.name.c_str(), pol.method, pol.quant_bits);
    return 1;
  }
  if (p.budget && !ok(kvsdk_cache_set_budget(loaded.cache, p.budget), "set_budget")) return 1;
  if (p.proxy && !ok(kvsdk_cache_set_proxy(loaded.cache, loaded.proxy), "set_proxy")) return 1;

  Session reference;  // the same conversation, never saved: what "continues identically" means
  if (!build_saved_state(p, &reference, nullptr)) return 1;
  if (!same_contents(loaded.cache, reference.cache, kKvHeads, p.name.c_str()) ||
      (p.proxy && !same_contents(loaded.proxy, reference.proxy, kProxyKvHeads, "proxy")))
    return 1;

  std::vector<float> got, want;
  const int32_t at = kSavedTokens + kDeltaTokens;
  if (!run_steps(p, &loaded, at, kFurtherTokens, &got) ||
      !run_steps(p, &reference, at, kFurtherTokens, &want))
    return 1;
  kvsdk_cache_stats st;
  if (!stats(loaded.cache, &st)) return 1;
  if (got.size() != want.size() || !same_bits(got.data(), want.data(), got.size() * 4)) {
    std::fprintf(stderr, "%s: continuation after load differs from the uninterrupted one\n",
                 p.name.c_str());
    return 1;
  }
  if (st.tokens != writer_tokens || writer_outputs.size() != got.size()) {
    std::fprintf(stderr, "%s: writer had %llu tokens and %zu outputs, reader %llu and %zu\n",
                 p.name.c_str(), (unsigned long long)writer_tokens, writer_outputs.size(),
                 (unsigned long long)st.tokens, got.size());
    return 1;
  }
  size_t identical = 0;
  float max_diff = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    if (same_bits(&got[i], &writer_outputs[i], sizeof(float))) {
      ++identical;
      continue;
    }
    const float d = std::fabs(got[i] - writer_outputs[i]);
    if (d > max_diff || std::isnan(d)) max_diff = d;
  }
  std::printf("%-16s rows, stats and continuation bit-identical to the uninterrupted run; vs "
              "the writer's build: %zu/%zu outputs bit-identical, max |diff| %.3g\n",
              p.name.c_str(), identical, got.size(), double(max_diff));
  if (identical != got.size()) {
    std::fprintf(stderr, "%s: %zu outputs differ from the writer's build\n", p.name.c_str(),
                 got.size() - identical);
    return 1;
  }
  return 0;
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s write|check DIR [PRESET...]\n       %s list\n", argv0, argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "list") == 0) {
    for (const char* p : kPresets) std::printf("%s\n", p);
    return 0;
  }
  if (argc < 3) return usage(argv[0]);
  const bool write = std::strcmp(argv[1], "write") == 0;
  if (!write && std::strcmp(argv[1], "check") != 0) return usage(argv[0]);
  const std::string dir = argv[2];
  std::vector<std::string> names(argv + 3, argv + argc);
  if (names.empty()) names.assign(std::begin(kPresets), std::end(kPresets));
  int failed = 0;
  for (const std::string& name : names) {
    if (std::find(std::begin(kPresets), std::end(kPresets), name) == std::end(kPresets)) {
      std::fprintf(stderr, "unknown preset '%s' (run '%s list')\n", name.c_str(), argv[0]);
      return 2;
    }
    Preset p;
    if (!make_preset(name, &p)) return 2;
    if ((write ? write_preset(dir, p) : check_preset(dir, p)) != 0) {
      std::fprintf(stderr, "%s: FAILED\n", name.c_str());
      ++failed;
    }
  }
  if (failed) std::fprintf(stderr, "%d of %zu presets failed\n", failed, names.size());
  return failed ? 1 : 0;
}
