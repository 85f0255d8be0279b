// Generates the golden snapshot files in tests/golden/ (run once per format version; the files
// are committed and every later kvsdk must still load them):
//
//   cmake --build --preset dev --target kvsdk-make-golden
//   ./build/dev/tests/kvsdk-make-golden tests/golden tests/fuzz/corpus
//
// The optional second directory receives tiny seed snapshots for the fuzzer
// (tests/fuzz/load_fuzzer.cpp): small inputs let it reach deep code quickly.
//
// Files (format 1.0):
//   v1_0_exact_f32.kvsnap    f32 host dtype, uneven layers, one frame per layer
//   v1_0_multiframe_f16.kvsnap  f16 host dtype, max_frame_bytes 64 (about one row per frame)
//   v1_0_journal_bf16.kvsnap bf16 host dtype, base + an append delta + an eviction delta
//   v1_0_torn_tail.kvsnap    the journal file with its last delta cut in half
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "container.h"
#include "core/cache.h"
#include "core/half.h"
#include "golden_content.h"
#include "kvsdk.h"
#include "zstd_frame.h"

using namespace kvsdk_golden;

namespace {

void check(kvsdk_status st, const char* what) {
  if (st != KVSDK_OK) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, kvsdk_status_str(st), kvsdk_last_error());
    std::exit(1);
  }
}

// Appends tokens [t0, t1) of `layer` in the host dtype of g.
void append(kvsdk_cache* c, const kvsdk_geometry& g, uint32_t layer, uint32_t t0, uint32_t t1) {
  const size_t n = t1 - t0, row = size_t(g.n_kv_heads) * g.head_dim;
  const size_t esz = g.dtype == KVSDK_DTYPE_F32 ? 4 : 2;
  std::vector<unsigned char> k(n * row * esz), v(n * row * esz);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t t = t0 + uint32_t(i);
    pos[i] = int32_t(t);
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      for (uint32_t d = 0; d < g.head_dim; ++d) {
        const size_t at = (i * row + h * g.head_dim + d) * esz;
        for (int which = 0; which < 2; ++which) {
          const float x = key_value(layer, t, h, d, which == 1);
          unsigned char* dst = (which ? v.data() : k.data()) + at;
          if (g.dtype == KVSDK_DTYPE_F32) {
            std::memcpy(dst, &x, 4);
          } else {
            const uint16_t b = g.dtype == KVSDK_DTYPE_F16 ? kvsdk::f32_to_f16(x) : kvsdk::f32_to_bf16(x);
            std::memcpy(dst, &b, 2);
          }
        }
      }
    }
  }
  check(kvsdk_cache_append(c, layer, n, k.data(), v.data(), pos.data(), k.size()), "append");
}

std::vector<unsigned char> read_all(const std::string& path) {
  FILE* in = std::fopen(path.c_str(), "rb");
  std::vector<unsigned char> bytes;
  for (int ch; in && (ch = std::fgetc(in)) != EOF;) bytes.push_back(uint8_t(ch));
  if (in) std::fclose(in);
  return bytes;
}

kvsdk_cache* base_cache(kvsdk_context* ctx, const kvsdk_geometry& g) {
  kvsdk_cache* c = nullptr;
  check(kvsdk_cache_create(&c, ctx, &g, nullptr), "create");
  for (uint32_t l = 0; l < g.n_layers; ++l) append(c, g, l, 0, base_tokens(l));
  return c;
}

// The fuzzer's structured mode (tests/fuzz/load_fuzzer.cpp): 0xFB, then per frame of `snapshot`
// [kind - 1][length u32 LE][decompressed FlatBuffer].
void write_structured_seed(const std::string& snapshot, const std::string& out_path) {
  namespace fmt = kvsdk::format;
  const std::vector<unsigned char> f = read_all(snapshot);
  const uint64_t id = fmt::decode_file_header(f.data()).snapshot_id;
  std::vector<unsigned char> out = {0xFB};
  fmt::ZstdDecompressor z;
  std::vector<unsigned char> raw;
  for (size_t pos = fmt::kFileHeaderBytes; pos + fmt::kFrameHeaderBytes <= f.size();) {
    fmt::FrameHeader h;
    if (!fmt::decode_frame_header(&f[pos], id, &h)) {  // the trailer
      pos += fmt::kTrailerBytes;
      continue;
    }
    z.decompress(&f[pos + fmt::kFrameHeaderBytes], h.payload_bytes, h.raw_bytes, raw);
    pos += fmt::kFrameHeaderBytes + h.payload_bytes;
    if (h.kind == uint8_t(fmt::FrameKind::kIndex)) continue;  // the sealer writes its own
    out.push_back(uint8_t(h.kind - 1));
    const uint32_t len = uint32_t(raw.size());
    for (int i = 0; i < 4; ++i) out.push_back(uint8_t(len >> (8 * i)));
    out.insert(out.end(), raw.begin(), raw.end());
  }
  FILE* o = std::fopen(out_path.c_str(), "wb");
  if (!o || std::fwrite(out.data(), 1, out.size(), o) != out.size()) std::exit(1);
  std::fclose(o);
}

// Tiny seeds: 1 layer, 1 KV head, head_dim 2; empty, 3 rows, and 3 rows + a journal delta.
void write_seeds(kvsdk_context* ctx, const std::string& dir) {
  kvsdk_geometry g = golden_geometry(KVSDK_DTYPE_F16);
  g.n_layers = 1;
  g.n_q_heads = 1;
  g.n_kv_heads = 1;
  g.head_dim = 2;
  kvsdk_cache* c = nullptr;
  check(kvsdk_cache_create(&c, ctx, &g, nullptr), "create");
  check(kvsdk_cache_save(c, (dir + "/seed_empty.kvsnap").c_str(), nullptr), "save");
  append(c, g, 0, 0, 3);
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.max_frame_bytes = 10;
  check(kvsdk_cache_save(c, (dir + "/seed_tiny.kvsnap").c_str(), &o), "save");
  const std::string j = dir + "/seed_tiny_journal.kvsnap";
  check(kvsdk_cache_save(c, j.c_str(), nullptr), "save");
  append(c, g, 0, 3, 4);
  check(kvsdk_cache_save_delta(c, j.c_str(), &o), "delta");
  kvsdk_cache_destroy(c);
  write_structured_seed(j, dir + "/seed_structured.bin");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s GOLDEN_DIR [FUZZ_SEED_DIR]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  kvsdk_context* ctx = nullptr;
  check(kvsdk_context_create(&ctx, nullptr), "context");

  kvsdk_geometry g = golden_geometry(KVSDK_DTYPE_F32);
  kvsdk_cache* c = base_cache(ctx, g);
  check(kvsdk_cache_save(c, (dir + "/v1_0_exact_f32.kvsnap").c_str(), nullptr), "save");
  kvsdk_cache_destroy(c);

  g = golden_geometry(KVSDK_DTYPE_F16);
  c = base_cache(ctx, g);
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.max_frame_bytes = 64;
  check(kvsdk_cache_save(c, (dir + "/v1_0_multiframe_f16.kvsnap").c_str(), &o), "save");
  kvsdk_cache_destroy(c);

  // Journal: base, then tokens 5..6 (layer 0) and 7 (layer 1), then "eviction": layer 0 head 1
  // loses rows 1 and 2 (positions 1, 2) and layer 1 head 0 loses its first row, then token 8 of
  // layer 1 arrives. golden_test.cpp expects exactly these rows.
  g = golden_geometry(KVSDK_DTYPE_BF16);
  c = base_cache(ctx, g);
  const std::string journal = dir + "/v1_0_journal_bf16.kvsnap";
  check(kvsdk_cache_save(c, journal.c_str(), nullptr), "save");
  append(c, g, 0, 5, 7);
  append(c, g, 1, 7, 8);
  check(kvsdk_cache_save_delta(c, journal.c_str(), nullptr), "delta 1");
  std::vector<kvsdk::LayerState> layers = {c->impl->layer(0), c->impl->layer(1)};
  auto erase = [&](kvsdk::ExactStore& e, size_t from, size_t n) {
    e.positions.erase(e.positions.begin() + long(from), e.positions.begin() + long(from + n));
    e.k.erase(e.k.begin() + long(from * g.head_dim), e.k.begin() + long((from + n) * g.head_dim));
    e.v.erase(e.v.begin() + long(from * g.head_dim), e.v.begin() + long((from + n) * g.head_dim));
  };
  erase(layers[0].heads[1], 1, 2);
  erase(layers[1].heads[0], 0, 1);
  c->impl = kvsdk::Cache::restore(ctx->impl, c->impl->geometry(), c->impl->policy(), layers);
  append(c, g, 1, 8, 9);
  check(kvsdk_cache_save_delta(c, journal.c_str(), nullptr), "delta 2");
  kvsdk_cache_destroy(c);

  // Torn tail: the journal file with its last delta cut in half.
  std::vector<unsigned char> bytes = read_all(journal);
  // The last frame starts after the last "KVFR" magic.
  size_t last = 0;
  for (size_t i = 0; i + 4 <= bytes.size(); ++i) {
    if (std::memcmp(&bytes[i], "KVFR", 4) == 0) last = i;
  }
  bytes.resize(last + (bytes.size() - last) / 2);
  FILE* out = std::fopen((dir + "/v1_0_torn_tail.kvsnap").c_str(), "wb");
  if (!out || std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size()) return 1;
  std::fclose(out);
  if (argc == 3) write_seeds(ctx, argv[2]);
  kvsdk_context_destroy(ctx);
  std::printf("golden snapshots written to %s\n", dir.c_str());
  return 0;
}
