// Cross-architecture snapshot driver: one deterministic conversation, saved by one build and
// continued by another (x86-64 <-> aarch64 under qemu). Uses the public C ABI only.
//
//   kvsdk-snapshot-portability write DIR   saves DIR/conversation.kvsdk (full save + one journal
//                                          delta) and DIR/expected.bin (what the writer's own
//                                          uninterrupted continuation produced)
//   kvsdk-snapshot-portability check DIR   loads the snapshot, continues the conversation and
//                                          compares (exit 0 = portable)
//
// check demands, bit for bit: the loaded cache holds exactly what an uninterrupted cache of this
// build holds (keys, values, positions, token counts, bytes), and after further appends its
// attention outputs equal that uninterrupted cache's, and equal the writer's recorded outputs
// too: kvsdk is built with -ffp-contract=off, so no architecture fuses a*b+c differently and a
// conversation continues with the same bits on x86-64 and aarch64. On failure it reports how many
// floats are bit-identical and the largest difference.
#include <kvsdk.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kLayers = 2, kQHeads = 4, kKvHeads = 2, kHeadDim = 64;
constexpr int32_t kSavedTokens = 40;     // in the full save
constexpr int32_t kDeltaTokens = 16;     // in the journal delta after it
constexpr int32_t kFurtherTokens = 24;   // appended after the load
constexpr int32_t kQueries = 8;          // causal queries at the end of the conversation
constexpr int32_t kChunk = 13;           // append granularity (not a divisor of the counts)
constexpr uint32_t kExpectedMagic = 0x4b56504fu;  // "OPVK" little-endian: a portability record

// Arch-independent pseudo-random values: splitmix64, then 24 bits -> [-1, 1) exactly in f32.
float value_at(uint64_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int32_t>(z >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

// Rows of token `pos`: [n_kv_heads][head_dim] for keys (stream 1) or values (stream 2), and
// [n_q_heads][head_dim] for queries (stream 3).
std::vector<float> rows(uint32_t layer, int32_t first, int32_t count, uint32_t heads,
                        uint64_t stream) {
  std::vector<float> out(size_t(count) * heads * kHeadDim);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t token = uint64_t(first) + i / (heads * kHeadDim);
    const uint64_t key = (stream << 56) | (uint64_t(layer) << 48) | (token << 16) |
                         (i % (heads * kHeadDim));
    out[i] = value_at(key);
  }
  return out;
}

bool ok(kvsdk_status st, const char* what) {
  if (st == KVSDK_OK) return true;
  std::fprintf(stderr, "%s: %s (%s)\n", what, kvsdk_status_str(st), kvsdk_last_error());
  return false;
}

bool append_tokens(kvsdk_cache* cache, int32_t first, int32_t count) {
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (int32_t at = first; at < first + count; at += kChunk) {
      const int32_t n = std::min(kChunk, first + count - at);
      const std::vector<float> k = rows(layer, at, n, kKvHeads, 1);
      const std::vector<float> v = rows(layer, at, n, kKvHeads, 2);
      std::vector<int32_t> pos(n);
      for (int32_t i = 0; i < n; ++i) pos[i] = at + i;
      if (!ok(kvsdk_cache_append(cache, layer, size_t(n), k.data(), v.data(), pos.data(),
                                 k.size() * sizeof(float)),
              "append"))
        return false;
    }
  }
  return true;
}

// Attention of the last kQueries positions (causal) over every layer: [layer][query][head][dim].
bool attend_all(kvsdk_cache* cache, std::vector<float>* out) {
  const int32_t end = kSavedTokens + kDeltaTokens + kFurtherTokens;
  out->assign(size_t(kLayers) * kQueries * kQHeads * kHeadDim, 0.0f);
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    const std::vector<float> q = rows(layer, end - kQueries, kQueries, kQHeads, 3);
    std::vector<int32_t> qpos(kQueries);
    for (int32_t i = 0; i < kQueries; ++i) qpos[i] = end - kQueries + i;
    float* dst = out->data() + size_t(layer) * kQueries * kQHeads * kHeadDim;
    const size_t bytes = q.size() * sizeof(float);
    if (!ok(kvsdk_cache_attend(cache, layer, kQueries, q.data(), qpos.data(), bytes, dst, bytes),
            "attend"))
      return false;
  }
  return true;
}

struct Session {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  ~Session() {
    kvsdk_cache_destroy(cache);
    kvsdk_context_destroy(ctx);
  }
};

bool make_context(Session* s) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);  // CPU, unlimited budget
  return ok(kvsdk_context_create(&s->ctx, &o), "context_create");
}

bool make_cache(Session* s) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = kLayers;
  g.n_q_heads = kQHeads;
  g.n_kv_heads = kKvHeads;
  g.head_dim = kHeadDim;
  g.dtype = KVSDK_DTYPE_F32;  // stored as f16; f32 in and out makes every output bit visible
  return make_context(s) && ok(kvsdk_cache_create(&s->cache, s->ctx, &g, nullptr), "create");
}

// The conversation as the writer had it when it saved: full save, then a journal delta.
bool build_saved_state(Session* s, const std::string* snapshot_path) {
  if (!make_cache(s) || !append_tokens(s->cache, 0, kSavedTokens)) return false;
  if (snapshot_path && !ok(kvsdk_cache_save(s->cache, snapshot_path->c_str(), nullptr), "save"))
    return false;
  if (!append_tokens(s->cache, kSavedTokens, kDeltaTokens)) return false;
  return !snapshot_path ||
         ok(kvsdk_cache_save_delta(s->cache, snapshot_path->c_str(), nullptr), "save_delta");
}

bool continue_and_attend(Session* s, std::vector<float>* out) {
  return append_tokens(s->cache, kSavedTokens + kDeltaTokens, kFurtherTokens) &&
         attend_all(s->cache, out);
}

bool write_file(const std::string& path, const std::vector<float>& outputs, uint64_t tokens) {
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

bool read_file(const std::string& path, std::vector<float>* outputs, uint64_t* tokens) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  uint32_t header[2] = {0, 0};
  bool good = std::fread(header, sizeof header, 1, f) == 1 && header[0] == kExpectedMagic &&
              std::fread(tokens, sizeof *tokens, 1, f) == 1;
  if (good) {
    outputs->resize(header[1]);
    good = std::fread(outputs->data(), sizeof(float), outputs->size(), f) == outputs->size();
  }
  std::fclose(f);
  return good;
}

uint64_t total_tokens(const kvsdk_cache* cache) {
  kvsdk_cache_stats st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  return kvsdk_cache_stats_get(cache, &st) == KVSDK_OK ? st.tokens : UINT64_MAX;
}

int do_write(const std::string& dir) {
  const std::string snap = dir + "/conversation.kvsdk";
  Session s;
  if (!build_saved_state(&s, &snap)) return 1;
  std::vector<float> outputs;
  if (!continue_and_attend(&s, &outputs)) return 1;
  if (!write_file(dir + "/expected.bin", outputs, total_tokens(s.cache))) {
    std::fprintf(stderr, "cannot write %s/expected.bin\n", dir.c_str());
    return 1;
  }
  std::printf("wrote %s (%d + %d tokens per layer) and the continuation's %zu outputs\n",
              snap.c_str(), kSavedTokens, kDeltaTokens, outputs.size());
  return 0;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// Every layer and KV head of `loaded` holds what `reference` holds, bit for bit.
bool same_contents(const kvsdk_cache* loaded, const kvsdk_cache* reference) {
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint32_t head = 0; head < kKvHeads; ++head) {
      size_t n_ref = 0, n_got = 0;
      if (!ok(kvsdk_cache_read(reference, layer, head, nullptr, nullptr, nullptr, 0, &n_ref),
              "read") ||
          !ok(kvsdk_cache_read(loaded, layer, head, nullptr, nullptr, nullptr, 0, &n_got),
              "read"))
        return false;
      if (n_ref != n_got) {
        std::fprintf(stderr, "layer %u head %u: %zu tokens loaded, %zu expected\n", layer, head,
                     n_got, n_ref);
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
        std::fprintf(stderr, "layer %u head %u: loaded rows differ from the original\n", layer,
                     head);
        return false;
      }
    }
  }
  return true;
}

int do_check(const std::string& dir) {
  const std::string snap = dir + "/conversation.kvsdk";
  std::vector<float> writer_outputs;
  uint64_t writer_tokens = 0;
  if (!read_file(dir + "/expected.bin", &writer_outputs, &writer_tokens)) {
    std::fprintf(stderr, "cannot read %s/expected.bin (run 'write' first)\n", dir.c_str());
    return 1;
  }

  Session loaded;
  kvsdk_load_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  if (!make_context(&loaded) ||
      !ok(kvsdk_cache_load(&loaded.cache, loaded.ctx, snap.c_str(), nullptr, &info), "load"))
    return 1;
  if (info.journal_frames_applied == 0 || info.journal_frames_dropped != 0) {
    std::fprintf(stderr, "journal: %u frames applied, %u dropped (expected >0 and 0)\n",
                 info.journal_frames_applied, info.journal_frames_dropped);
    return 1;
  }

  Session reference;  // the same conversation, never saved: what "continues identically" means
  if (!build_saved_state(&reference, nullptr)) return 1;
  if (!same_contents(loaded.cache, reference.cache)) return 1;
  kvsdk_cache_stats a, b;
  std::memset(&a, 0, sizeof a);
  std::memset(&b, 0, sizeof b);
  a.struct_size = b.struct_size = sizeof a;
  if (!ok(kvsdk_cache_stats_get(loaded.cache, &a), "stats") ||
      !ok(kvsdk_cache_stats_get(reference.cache, &b), "stats"))
    return 1;
  if (a.tokens != b.tokens || a.appended_tokens != b.appended_tokens || a.bytes != b.bytes) {
    std::fprintf(stderr, "stats differ: tokens %llu/%llu appended %llu/%llu bytes %llu/%llu\n",
                 (unsigned long long)a.tokens, (unsigned long long)b.tokens,
                 (unsigned long long)a.appended_tokens, (unsigned long long)b.appended_tokens,
                 (unsigned long long)a.bytes, (unsigned long long)b.bytes);
    return 1;
  }

  std::vector<float> got, want;
  if (!continue_and_attend(&loaded, &got) || !continue_and_attend(&reference, &want)) return 1;
  if (!same_bits(got.data(), want.data(), got.size() * sizeof(float))) {
    std::fprintf(stderr, "continuation after load differs from the uninterrupted conversation\n");
    return 1;
  }
  if (total_tokens(loaded.cache) != writer_tokens || writer_outputs.size() != got.size()) {
    std::fprintf(stderr, "writer had %llu tokens and %zu outputs, reader %llu and %zu\n",
                 (unsigned long long)writer_tokens, writer_outputs.size(),
                 (unsigned long long)total_tokens(loaded.cache), got.size());
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
  std::printf("loaded %s (format %u.%u, %u journal frame(s)); rows and stats bit-identical; "
              "continuation bit-identical to the uninterrupted run; vs the writer's build: "
              "%zu/%zu outputs bit-identical, max |diff| %.3g\n",
              snap.c_str(), info.format_major, info.format_minor, info.journal_frames_applied,
              identical, got.size(), double(max_diff));
  if (identical != got.size()) {
    std::fprintf(stderr, "%zu outputs differ from the writer's build\n", got.size() - identical);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "write") == 0) return do_write(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "check") == 0) return do_check(argv[2]);
  std::fprintf(stderr, "usage: %s write|check DIR\n", argv[0]);
  return 2;
}
