// Generates the golden snapshot files in tests/golden/ (run once per format version; the files
// are committed and every later kvsdk must still load them):
//
//   cmake --build --preset dev --target kvsdk-make-golden
//   ./build/dev/tests/kvsdk-make-golden [--only=v1_0|v2_0|v3_0|v3_1|v4_0|v5_0|v1_2] tests/golden [tests/fuzz/corpus]
//
// --only picks one format version's files (default: all, which also rewrites the older versions'
// files: never use the default on tests/golden). Regenerate only a version that the writer of the
// day still writes, and never one that is already committed: every committed file must stay
// byte-identical. Today's writer (format 3.0) saves caches without compressed tiers and without
// an observation window as format 1.2, so its v1_0 files would no longer be format 1.0 (the
// committed ones were written by the 1.0 writer); the v2_0 files were written by the 2.0 writer
// (commit efa394b) with --only=v2_0; the v3_0 and v1_2 files by the 3.0 writer with --only=v3_0
// and --only=v1_2, before the format major moved on (each writes its files and its
// <version>_expected.h; the generator fails if a file's container header is not that version).
// The optional second directory receives tiny seed snapshots for the fuzzer
// (tests/fuzz/load_fuzzer.cpp): small inputs let it reach deep code quickly.
//
// Files (format 1.0):
//   v1_0_exact_f32.kvsnap    f32 host dtype, uneven layers, one frame per layer
//   v1_0_multiframe_f16.kvsnap  f16 host dtype, max_frame_bytes 64 (about one row per frame)
//   v1_0_journal_bf16.kvsnap bf16 host dtype, base + an append delta + an eviction delta
//   v1_0_torn_tail.kvsnap    the journal file with its last delta cut in half
//
// Files (format 2.0: caches with compressed tiers; the script is in golden_content.h):
//   v2_0_kivi.kvsnap, v2_0_xkv_kivi2.kvsnap, v2_0_spindlekv.kvsnap, v2_0_minicache.kvsnap,
//   v2_0_minicache_kivi4.kvsnap, v2_0_smallkv.kvsnap, v2_0_specache.kvsnap (include_backing 1),
//   v2_0_specache_nobacking.kvsnap (include_backing 0): each a full save plus one journal delta.
//   v2_0_expected.h          what each of them holds after load, measured here when writing
//                            them (digests of kvsdk_cache_read and of fixed-query attention,
//                            the policy, the frames, the continuation); golden_test.cpp checks it.
//
// Files (format 3.0: window-method caches and caches with compressed tiers, field-by-field tier
// deltas; the v3 script in golden_content.h): each a full save, a journal delta that only
// appends, and a journal delta after kvsdk_cache_set_budget (the policy evicts to it; policies
// that never evict compress further), so deltas over deltas are pinned:
//   v3_0_snapkv, v3_0_pyramidkv, v3_0_xkv, v3_0_xkv_kivi2, v3_0_h2o_kivi4, v3_0_kivi,
//   v3_0_spindlekv, v3_0_minicache, v3_0_minicache_kivi4, v3_0_smallkv (with its proxy),
//   v3_0_specache (default save options, prefetch after every layer), v3_0_specache_nobacking
//   (include_backing 0)  (.kvsnap)
//   v3_0_expected.h          as v2_0_expected.h, with the state after each delta (V3Expected).
// Files (format 3.1, written by the 3.1 writer with --only=v3_1: what 3.1 writes differently from
// 3.0, H2O scores as differences in journal deltas; same script, v3_1_cases):
//   v3_1_h2o_kivi4.kvsnap, v3_1_expected.h
// Files (format 4.0, written by the 4.0 writer with --only=v4_0: compressed stores as typed tables,
// journal deltas by field id; every preset family the 4.0 writer saves as 4.0; same script,
// v4_0_cases):
//   v4_0_snapkv, v4_0_pyramidkv, v4_0_xkv, v4_0_xkv_kivi2, v4_0_h2o_kivi4, v4_0_kivi,
//   v4_0_spindlekv, v4_0_minicache, v4_0_minicache_kivi4, v4_0_smallkv, v4_0_specache,
//   v4_0_specache_nobacking  (.kvsnap), v4_0_expected.h
// Files (format 1.2: the exact caches the 3.0 writer saves as 1.2; same script):
//   v1_2_full, v1_2_streaming_llm, v1_2_h2o  (.kvsnap; full never evicts: both its deltas append)
//   v1_2_expected.h
// Files (format 5.0, written by the 5.0 writer with --only=v5_0: a conversation on a shared
// prefix; the v5 script in golden_content.h):
//   v5_0_prefix_base.kvsnap        the frozen 'kivi' prefix saved alone (a plain 4.1 file)
//   v5_0_prefix_embedded.kvsnap    a 'snapkv' conversation on it, embed_prefix 1, + one delta
//   v5_0_prefix_referenced.kvsnap  the same conversation, embed_prefix 0 (content hash), + delta
//   v5_0_expected.h
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "container.h"
#include "core/cache.h"
#include "golden_content.h"
#include "kvsdk.h"
#include "util/half.h"
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

// ---------------------------------------------------------------------------------------------
// Format 2.0: caches with compressed tiers.
// ---------------------------------------------------------------------------------------------

void fail_if(bool bad, const std::string& what) {
  if (bad) {
    std::fprintf(stderr, "%s (%s)\n", what.c_str(), kvsdk_last_error());
    std::exit(1);
  }
}

// A fresh proxy (smallkv) that has run the proxy's share of steps [0, steps); NULL otherwise.
kvsdk_cache* v2_proxy(const V2Case& cs, kvsdk_context* ctx, uint32_t steps) {
  if (!cs.proxy) return nullptr;
  const kvsdk_geometry pg = v2_proxy_geometry();
  kvsdk_cache* p = nullptr;
  check(kvsdk_cache_create(&p, ctx, &pg, nullptr), "proxy create");
  for (uint32_t s = 0; s < steps; ++s) check(v2_proxy_step(p, s), "proxy step");
  return p;
}

V2State measure(kvsdk_cache* c, kvsdk_cache* proxy) {
  V2State st;
  check(v2_measure(c, proxy, &st), "measure");
  return st;
}

kvsdk_cache* load_bytes(kvsdk_context* ctx, const std::vector<unsigned char>& bytes,
                        kvsdk_load_info* info) {
  const kvsdk_geometry g = v2_geometry();
  kvsdk_cache* c = nullptr;
  info->struct_size = sizeof *info;
  check(kvsdk_cache_load_from_buffer(&c, ctx, bytes.data(), bytes.size(), &g, info), "load");
  return c;
}

// kV2ContinueSteps more steps on `c` (its proxy, for smallkv, has run the same steps): digest of
// every step's attention outputs, then of every (layer, head)'s rows.
uint64_t continuation(const V2Case& cs, kvsdk_cache* c, kvsdk_cache* proxy) {
  std::vector<float> outputs;
  const uint32_t from = kV2BaseSteps + kV2DeltaSteps;
  for (uint32_t s = from; s < from + kV2ContinueSteps; ++s) {
    check(v2_step(cs, c, proxy, s, &outputs), "continue");
  }
  uint64_t d = 0;
  check(v2_continuation_digest(c, outputs, &d), "continuation digest");
  return d;
}

// The frames of a written file, from its container records.
std::vector<V2Frame> frames_of(const std::vector<unsigned char>& f, uint64_t* base_end) {
  namespace fmt = kvsdk::format;
  const uint64_t id = fmt::decode_file_header(f.data()).snapshot_id;
  std::vector<V2Frame> frames;
  *base_end = 0;
  for (size_t pos = fmt::kFileHeaderBytes; pos + fmt::kFrameHeaderBytes <= f.size();) {
    fmt::FrameHeader h;
    if (!fmt::decode_frame_header(&f[pos], id, &h)) {
      fail_if(*base_end != 0 || std::memcmp(&f[pos], fmt::kTrailerMagic, 8) != 0,
              "unexpected record");
      pos += fmt::kTrailerBytes;
      *base_end = pos;
      continue;
    }
    frames.push_back({pos, h.payload_bytes, h.kind});
    pos += fmt::kFrameHeaderBytes + h.payload_bytes;
  }
  return frames;
}

std::string state_literal(const V2State& s) {
  std::string out = "{{";
  char buf[64];
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    std::snprintf(buf, sizeof buf, "%s%" PRIu64, l ? ", " : "", s.appended[l]);
    out += buf;
  }
  out += "},\n      {";
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    out += l ? ", {" : "{";
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      std::snprintf(buf, sizeof buf, "%s%" PRIu64, h ? ", " : "", s.tokens[l][h]);
      out += buf;
    }
    out += "}";
  }
  out += "},\n      {";
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    out += l ? ",\n       {" : "{";
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      std::snprintf(buf, sizeof buf, "%s0x%016" PRIx64 "ull", h ? ", " : "", s.rows[l][h]);
      out += buf;
    }
    out += "}";
  }
  out += "},\n      {";
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    std::snprintf(buf, sizeof buf, "%s0x%016" PRIx64 "ull", l ? (l == 2 ? ",\n       " : ", ") : "",
                  s.attention[l]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "},\n      0x%02x}", s.tier_mask);
  return out + buf;
}

std::string policy_literal(const kvsdk_policy& p) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{%d, %d, %d, %d, %d, %d, %d, %d, %d, %af, %af, %af, %d, %af, %af, %d, %d}",
                p.method, p.quant_bits, p.quant_group, p.quant_residual, p.sink_tokens,
                p.recent_tokens, p.obs_window, p.pool_kernel, p.pool_kind, double(p.heavy_ratio),
                double(p.schedule_alpha), double(p.schedule_beta), p.boundary_layer,
                double(p.merge_t), double(p.retain_ratio), p.fetch_tokens, p.match_tokens);
  return buf;
}

// Writes one v2 file and returns its entry of v2_0_expected.h.
std::string write_v2(const V2Case& cs, const std::string& dir) {
  const std::string path = dir + "/" + cs.file;
  const uint32_t delta_end = kV2BaseSteps + kV2DeltaSteps;
  kvsdk_context* ctx = golden_context();
  check(ctx ? KVSDK_OK : KVSDK_E_INTERNAL, "context");
  kvsdk_policy want_policy = v2_policy(cs);
  kvsdk_policy parsed;
  check(kvsdk_policy_parse(&parsed, cs.preset), cs.preset);

  // The conversation: full save after the base steps, one delta after the delta steps.
  kvsdk_cache* proxy = v2_proxy(cs, ctx, 0);
  kvsdk_cache* c = nullptr;
  check(v2_build(cs, ctx, proxy, kV2BaseSteps, &c), "build");
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.include_backing = cs.include_backing;
  check(kvsdk_cache_save(c, path.c_str(), &o), "save");
  for (uint32_t s = kV2BaseSteps; s < delta_end; ++s) check(v2_step(cs, c, proxy, s, nullptr), "step");
  check(kvsdk_cache_save_delta(c, path.c_str(), &o), "delta");
  V2State live{};
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      check(v2_rows_digest(c, l, h, &live.tokens[l][h], &live.rows[l][h]), "read");
    }
  }
  const uint64_t uninterrupted = continuation(cs, c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);

  // What the file holds, measured by loading it: whole, and cut at the end of its base.
  const std::vector<unsigned char> bytes = read_all(path);
  uint64_t base_end = 0;
  const std::vector<V2Frame> frames = frames_of(bytes, &base_end);
  fail_if(base_end == 0 || base_end >= bytes.size(), "no journal after the base");
  uint32_t journal_frames = 0;
  for (const V2Frame& f : frames) journal_frames += f.kind == uint8_t(kvsdk::format::FrameKind::kJournal);

  kvsdk_load_info info{};
  c = load_bytes(ctx, bytes, &info);
  fail_if(info.format_major != 2 || info.format_minor != 0, "not a format 2.0 file");
  fail_if(info.journal_frames_applied != journal_frames || info.journal_frames_dropped != 0,
          "journal not applied whole");
  kvsdk_policy got;
  kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
  check(kvsdk_cache_policy(c, &got), "policy");
  fail_if(got.method != want_policy.method || got.quant_bits != want_policy.quant_bits ||
              got.method != parsed.method || got.quant_bits != parsed.quant_bits,
          std::string(cs.file) + ": loaded policy differs");
  proxy = v2_proxy(cs, ctx, delta_end);
  const V2State full = measure(c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      fail_if(full.rows[l][h] != live.rows[l][h] || full.tokens[l][h] != live.tokens[l][h],
              std::string(cs.file) + ": loaded rows differ from the saved cache's");
    }
  }

  const std::vector<unsigned char> base_bytes(bytes.begin(), bytes.begin() + long(base_end));
  kvsdk_load_info base_info{};
  c = load_bytes(ctx, base_bytes, &base_info);
  fail_if(base_info.journal_frames_applied != 0 || base_info.journal_frames_dropped != 0,
          "base has a journal");
  proxy = v2_proxy(cs, ctx, kV2BaseSteps);
  const V2State base = measure(c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);

  // The loaded file continues as the uninterrupted conversation did.
  c = load_bytes(ctx, bytes, &info);
  proxy = v2_proxy(cs, ctx, delta_end);
  if (proxy) check(kvsdk_cache_set_proxy(c, proxy), "set proxy");
  const uint64_t resumed = continuation(cs, c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);
  fail_if(resumed != uninterrupted,
          std::string(cs.file) + ": the loaded cache continues differently from the saved one");

  // Every compressed representation is really in the file.
  const uint32_t want_tiers = [&] {
    const std::string p = cs.preset;
    if (p == "spindlekv") return 1u << KVSDK_TIER_CODEBOOK;
    if (p.rfind("minicache", 0) == 0) {
      return (1u << KVSDK_TIER_MERGED) | (p == "minicache" ? 0u : 1u << KVSDK_TIER_QUANTIZED);
    }
    if (p == "smallkv") return 1u << KVSDK_TIER_VALUE_ONLY;
    return 1u << KVSDK_TIER_QUANTIZED;  // kivi, xkv+kivi2, specache
  }();
  fail_if((base.tier_mask & want_tiers) != want_tiers || (full.tier_mask & want_tiers) != want_tiers,
          std::string(cs.file) + ": a compressed tier is missing");
  kvsdk_context_destroy(ctx);

  std::string e = "    {\"" + std::string(cs.file) + "\", \"" + cs.preset + "\", " +
                  std::to_string(cs.include_backing) + ", " + std::to_string(cs.cache_budget) +
                  ",\n     " + policy_literal(got) + ",\n     " +
                  std::to_string(info.format_major) + ", " + std::to_string(info.format_minor) +
                  ", " + std::to_string(info.journal_frames_applied) + ", " +
                  std::to_string(bytes.size()) + ", " + std::to_string(base_end) + ",\n     {";
  for (size_t i = 0; i < frames.size(); ++i) {
    e += (i ? (i % 4 == 0 ? ",\n      " : ", ") : "") + std::string("{") +
         std::to_string(frames[i].offset) + ", " + std::to_string(frames[i].payload_bytes) + ", " +
         std::to_string(frames[i].kind) + "}";
  }
  char cont[32];
  std::snprintf(cont, sizeof cont, "0x%016" PRIx64 "ull", uninterrupted);
  e += "},\n     " + state_literal(base) + ",\n     " + state_literal(full) + ",\n     " + cont +
       "},\n";
  std::printf("%-32s %6zu bytes (base %" PRIu64 ", %u journal frames), tiers base 0x%02x "
              "full 0x%02x, rows/head full:",
              cs.file, bytes.size(), base_end, journal_frames, base.tier_mask, full.tier_mask);
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    std::printf(" %" PRIu64 "/%" PRIu64, full.tokens[l][0], full.tokens[l][1]);
  }
  std::printf("\n");
  return e;
}

void write_v2_files(const std::string& dir) {
  size_t n = 0;
  const V2Case* cases = v2_cases(&n);
  std::string body;
  for (size_t i = 0; i < n; ++i) body += write_v2(cases[i], dir);
  const std::string header =
      "// GENERATED by tests/golden/make_golden.cpp (kvsdk " + std::string(kvsdk_version_string()) +
      ", snapshot format 2.0) together with the\n"
      "// v2_0_*.kvsnap files: what each file holds after load, measured by loading it when it was\n"
      "// written. Do not edit by hand; the files and this record change together or not at all.\n"
      "// Fields: see V2Expected in golden_content.h.\n"
      "#pragma once\n\n#include <vector>\n\n#include \"golden_content.h\"\n\n"
      "namespace kvsdk_golden {\n\n"
      "inline const std::vector<V2Expected>& v2_expected() {\n"
      "  static const std::vector<V2Expected> expected = {\n" +
      body + "  };\n  return expected;\n}\n\n}  // namespace kvsdk_golden\n";
  FILE* out = std::fopen((dir + "/v2_0_expected.h").c_str(), "wb");
  if (!out || std::fwrite(header.data(), 1, header.size(), out) != header.size()) std::exit(1);
  std::fclose(out);
}

// ---------------------------------------------------------------------------------------------
// Formats 3.0 and 1.2: the v3 script (golden_content.h), a base and two journal deltas.
// ---------------------------------------------------------------------------------------------

uint64_t v3_continuation(const V3Case& cs, kvsdk_cache* c, kvsdk_cache* proxy) {
  std::vector<float> outputs;
  for (uint32_t s = kV3EndSteps; s < kV3EndSteps + kV3ContinueSteps; ++s) {
    check(v2_step(cs.script, c, proxy, s, &outputs), "continue");
  }
  uint64_t d = 0;
  check(v2_continuation_digest(c, outputs, &d), "continuation digest");
  return d;
}

struct LiveRows {
  uint64_t tokens[kV2Layers][kV2KvHeads], rows[kV2Layers][kV2KvHeads];
};

LiveRows live_rows(const kvsdk_cache* c) {
  LiveRows r{};
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      check(v2_rows_digest(c, l, h, &r.tokens[l][h], &r.rows[l][h]), "read");
    }
  }
  return r;
}

void fail_unless_rows(const V2State& got, const LiveRows& want, const std::string& what) {
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      fail_if(got.rows[l][h] != want.rows[l][h] || got.tokens[l][h] != want.tokens[l][h],
              what + ": loaded rows differ from the saved cache's");
    }
  }
}

// Rows appended between two states minus rows the second holds more: 0 when the part only
// appended, > 0 when rows were evicted (summed over every layer and head).
uint64_t rows_lost(const V2State& a, const V2State& b) {
  uint64_t lost = 0;
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      const uint64_t grown = b.appended[l] - a.appended[l];
      if (a.tokens[l][h] + grown > b.tokens[l][h]) lost += a.tokens[l][h] + grown - b.tokens[l][h];
    }
  }
  return lost;
}

// Writes one v3_0 or v1_2 file (format major.minor expected) and returns its record entry.
std::string write_v3(const V3Case& cs, const std::string& dir, uint32_t major, uint32_t minor) {
  namespace fmt = kvsdk::format;
  const std::string file = cs.script.file;
  const std::string path = dir + "/" + file;
  kvsdk_context* ctx = golden_context();
  check(ctx ? KVSDK_OK : KVSDK_E_INTERNAL, "context");
  const kvsdk_policy want_policy = v2_policy(cs.script);
  kvsdk_policy parsed;
  check(kvsdk_policy_parse(&parsed, cs.script.preset), cs.script.preset);

  // The conversation: base, delta 1 (appends), delta 2 (under the eviction budget).
  kvsdk_cache* proxy = v2_proxy(cs.script, ctx, 0);
  kvsdk_cache* c = nullptr;
  check(v3_base(cs, ctx, proxy, &c), "base steps");
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.include_backing = cs.script.include_backing;
  std::remove(path.c_str());
  check(kvsdk_cache_save(c, path.c_str(), &o), "save");
  const LiveRows live_base = live_rows(c);
  check(v3_append_part(cs, c, proxy), "delta 1 steps");
  check(kvsdk_cache_save_delta(c, path.c_str(), &o), "delta 1");
  const uint64_t delta1_end = read_all(path).size();
  const LiveRows live_delta1 = live_rows(c);
  uint64_t evict_budget = 0;
  check(v3_evict_part(cs, c, proxy, &evict_budget), "delta 2 steps");
  check(kvsdk_cache_save_delta(c, path.c_str(), &o), "delta 2");
  const LiveRows live_full = live_rows(c);
  const uint64_t uninterrupted = v3_continuation(cs, c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);

  const std::vector<unsigned char> bytes = read_all(path);
  const fmt::FileHeader fh = fmt::decode_file_header(bytes.data());
  fail_if(fh.major != major || fh.minor != minor,
          file + ": container header says " + std::to_string(fh.major) + "." +
              std::to_string(fh.minor));
  uint64_t base_end = 0;
  const std::vector<V2Frame> frames = frames_of(bytes, &base_end);
  fail_if(base_end == 0 || base_end >= delta1_end || delta1_end >= bytes.size(),
          file + ": not a base and two deltas");
  uint32_t journal_frames = 0, delta1_frames = 0;
  for (const V2Frame& f : frames) {
    if (f.kind != uint8_t(fmt::FrameKind::kJournal)) continue;
    ++journal_frames;
    if (f.offset < delta1_end) ++delta1_frames;
  }
  fail_if(delta1_frames == 0 || delta1_frames == journal_frames, file + ": empty delta");

  // What the file holds: whole, cut after delta 1, cut after the base.
  kvsdk_load_info info{};
  c = load_bytes(ctx, bytes, &info);
  fail_if(info.format_major != major || info.format_minor != minor, file + ": load info version");
  fail_if(info.journal_frames_applied != journal_frames || info.journal_frames_dropped != 0,
          file + ": journal not applied whole");
  kvsdk_policy got;
  kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
  check(kvsdk_cache_policy(c, &got), "policy");
  fail_if(got.method != want_policy.method || got.quant_bits != want_policy.quant_bits ||
              got.method != parsed.method || got.quant_bits != parsed.quant_bits,
          file + ": loaded policy differs");
  proxy = v2_proxy(cs.script, ctx, kV3EndSteps);
  const V2State full = measure(c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);
  fail_unless_rows(full, live_full, file + " (whole)");

  kvsdk_load_info d1_info{};
  c = load_bytes(ctx, std::vector<unsigned char>(bytes.begin(), bytes.begin() + long(delta1_end)),
                 &d1_info);
  fail_if(d1_info.journal_frames_applied != delta1_frames || d1_info.journal_frames_dropped != 0,
          file + ": delta 1 not applied whole");
  proxy = v2_proxy(cs.script, ctx, kV3Delta1Steps);
  const V2State delta1 = measure(c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);
  fail_unless_rows(delta1, live_delta1, file + " (to delta 1)");

  kvsdk_load_info base_info{};
  c = load_bytes(ctx, std::vector<unsigned char>(bytes.begin(), bytes.begin() + long(base_end)),
                 &base_info);
  fail_if(base_info.journal_frames_applied != 0 || base_info.journal_frames_dropped != 0,
          file + ": base has a journal");
  proxy = v2_proxy(cs.script, ctx, kV3BaseSteps);
  const V2State base = measure(c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);
  if (cs.script.include_backing) fail_unless_rows(base, live_base, file + " (base)");

  // Delta 1 only appended; delta 2 evicted where the case sets a budget.
  fail_if(rows_lost(base, delta1) != 0, file + ": delta 1 lost rows");
  fail_if(cs.evict_percent != 0 && rows_lost(delta1, full) == 0,
          file + ": the budget of delta 2 evicted nothing");
  fail_if(cs.evict_percent != 0 && evict_budget == 0, file + ": no budget");

  // The loaded file continues as the uninterrupted conversation did (include_backing 0: the
  // rebuilt backing rows of the base differ at the next prefetch, so only recorded).
  c = load_bytes(ctx, bytes, &info);
  proxy = v2_proxy(cs.script, ctx, kV3EndSteps);
  if (proxy) check(kvsdk_cache_set_proxy(c, proxy), "set proxy");
  const uint64_t resumed = v3_continuation(cs, c, proxy);
  kvsdk_cache_destroy(c);
  kvsdk_cache_destroy(proxy);
  const bool like_writer = resumed == uninterrupted;
  fail_if(cs.script.include_backing && !like_writer,
          file + ": the loaded cache continues differently from the saved one");

  // Every compressed representation is really in the file.
  const std::string p = cs.script.preset;
  uint32_t want_tiers = 0;
  if (p == "spindlekv") want_tiers = 1u << KVSDK_TIER_CODEBOOK;
  if (p.rfind("minicache", 0) == 0) {
    want_tiers = (1u << KVSDK_TIER_MERGED) | (p == "minicache" ? 0u : 1u << KVSDK_TIER_QUANTIZED);
  }
  if (p == "smallkv") want_tiers = 1u << KVSDK_TIER_VALUE_ONLY;
  if (p == "kivi" || p == "specache" || p.find("+kivi") != std::string::npos) {
    want_tiers |= 1u << KVSDK_TIER_QUANTIZED;
  }
  // (smallkv demotes rows to values only when it evicts: in delta 2, under its budget.)
  const uint32_t want_delta1 = p == "smallkv" ? 0u : want_tiers;
  fail_if((full.tier_mask & want_tiers) != want_tiers ||
              (delta1.tier_mask & want_delta1) != want_delta1,
          file + ": a compressed tier is missing");
  kvsdk_context_destroy(ctx);

  std::string e = "    {\"" + file + "\", \"" + cs.script.preset + "\", " +
                  std::to_string(cs.script.include_backing) + ", " +
                  std::to_string(cs.script.cache_budget) + ", " + std::to_string(evict_budget) +
                  ",\n     " + policy_literal(got) + ",\n     " + std::to_string(fh.major) + ", " +
                  std::to_string(fh.minor) + ", " + std::to_string(journal_frames) + ", " +
                  std::to_string(delta1_frames) + ", " + std::to_string(bytes.size()) + ", " +
                  std::to_string(base_end) + ", " + std::to_string(delta1_end) + ",\n     {";
  for (size_t i = 0; i < frames.size(); ++i) {
    e += (i ? (i % 4 == 0 ? ",\n      " : ", ") : "") + std::string("{") +
         std::to_string(frames[i].offset) + ", " + std::to_string(frames[i].payload_bytes) + ", " +
         std::to_string(frames[i].kind) + "}";
  }
  char cont[32];
  std::snprintf(cont, sizeof cont, "0x%016" PRIx64 "ull", resumed);
  e += "},\n     " + state_literal(base) + ",\n     " + state_literal(delta1) + ",\n     " +
       state_literal(full) + ",\n     " + cont + ", " + (like_writer ? "true" : "false") + "},\n";
  std::printf("%-32s %u.%u %6zu bytes (base %" PRIu64 ", delta 1 to %" PRIu64
              ", %u+%u journal frames), budget %" PRIu64 ", rows lost in delta 2 %" PRIu64
              ", tiers 0x%02x, rows/head full:",
              file.c_str(), fh.major, fh.minor, bytes.size(), base_end, delta1_end, delta1_frames,
              journal_frames - delta1_frames, evict_budget, rows_lost(delta1, full),
              full.tier_mask);
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    std::printf(" %" PRIu64 "/%" PRIu64, full.tokens[l][0], full.tokens[l][1]);
  }
  std::printf("\n");
  return e;
}

// version "v3_0", "v3_1", "v4_0" or "v1_2": its files and <version>_expected.h.
void write_v3_files(const std::string& dir, const std::string& version) {
  const uint32_t major = uint32_t(version[1] - '0'), minor = uint32_t(version[3] - '0');
  size_t n = 0;
  const V3Case* cases = version == "v3_0"   ? v3_cases(&n)
                        : version == "v3_1" ? v3_1_cases(&n)
                        : version == "v4_0" ? v4_0_cases(&n)
                                            : v1_2_cases(&n);
  std::string body;
  for (size_t i = 0; i < n; ++i) body += write_v3(cases[i], dir, major, minor);
  const std::string ver = std::to_string(major) + "." + std::to_string(minor);
  const std::string header =
      "// GENERATED by tests/golden/make_golden.cpp (kvsdk " + std::string(kvsdk_version_string()) +
      ", snapshot format " + ver + ") together with the\n// " + version +
      "_*.kvsnap files: what each file holds after load, measured by loading it when it was\n"
      "// written. Do not edit by hand; the files and this record change together or not at all.\n"
      "// Fields: see V3Expected in golden_content.h.\n"
      "#pragma once\n\n#include <vector>\n\n#include \"golden_content.h\"\n\n"
      "namespace kvsdk_golden {\n\n"
      "inline const std::vector<V3Expected>& " + version + "_expected() {\n"
      "  static const std::vector<V3Expected> expected = {\n" +
      body + "  };\n  return expected;\n}\n\n}  // namespace kvsdk_golden\n";
  FILE* out = std::fopen((dir + "/" + version + "_expected.h").c_str(), "wb");
  if (!out || std::fwrite(header.data(), 1, header.size(), out) != header.size()) std::exit(1);
  std::fclose(out);
}

// ---------------------------------------------------------------------------------------------
// Format 5.0: a conversation on a shared prefix (the v5 script in golden_content.h).
// ---------------------------------------------------------------------------------------------

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  FILE* out = std::fopen(path.c_str(), "wb");
  if (!out || std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size()) std::exit(1);
  std::fclose(out);
}

// The base file loaded (kvsdk_cache_load) and frozen: the prefix a referencing file loads on.
kvsdk_cache* v5_loaded_prefix(kvsdk_context* ctx, const std::string& dir) {
  kvsdk_cache* p = nullptr;
  check(kvsdk_cache_load(&p, ctx, (dir + "/" + kV5PrefixFile).c_str(), nullptr, nullptr),
        "load the prefix file");
  check(kvsdk_cache_freeze(p), "freeze the loaded prefix");
  return p;
}

// Loads `bytes` of a v5 conversation: alone (embedding) or on `prefix` (referencing; through a
// scratch file, kvsdk_cache_load_on_prefix reads paths only).
kvsdk_cache* v5_load(kvsdk_context* ctx, kvsdk_cache* prefix, const std::string& dir,
                     const std::vector<unsigned char>& bytes, kvsdk_load_info* info) {
  kvsdk_load_info_init(info);
  kvsdk_cache* c = nullptr;
  if (!prefix) {
    check(kvsdk_cache_load_from_buffer(&c, ctx, bytes.data(), bytes.size(), nullptr, info), "load");
    return c;
  }
  const std::string scratch = dir + "/.v5_scratch.kvsnap";
  write_bytes(scratch, bytes);
  check(kvsdk_cache_load_on_prefix(&c, prefix, scratch.c_str(), info), "load on prefix");
  std::remove(scratch.c_str());
  return c;
}

std::string frames_literal(const std::vector<V2Frame>& frames) {
  std::string e = "{";
  for (size_t i = 0; i < frames.size(); ++i) {
    e += (i ? (i % 4 == 0 ? ",\n      " : ", ") : "") + std::string("{") +
         std::to_string(frames[i].offset) + ", " + std::to_string(frames[i].payload_bytes) + ", " +
         std::to_string(frames[i].kind) + "}";
  }
  return e + "}";
}

std::string v5_entry(const std::string& file, const char* preset, uint32_t embed,
                     const kvsdk_policy& policy, const kvsdk_load_info& info, uint64_t size,
                     uint64_t base_end, const std::vector<V2Frame>& frames, const V2State& base,
                     const V2State& full, uint64_t continuation) {
  char cont[32];
  std::snprintf(cont, sizeof cont, "0x%016" PRIx64 "ull", continuation);
  return "    {\"" + file + "\", \"" + preset + "\", " + std::to_string(embed) + ",\n     " +
         policy_literal(policy) + ",\n     " + std::to_string(info.format_major) + ", " +
         std::to_string(info.format_minor) + ", " + std::to_string(info.journal_frames_applied) +
         ", " + std::to_string(size) + ", " + std::to_string(base_end) + ",\n     " +
         frames_literal(frames) + ",\n     " + state_literal(base) + ",\n     " +
         state_literal(full) + ",\n     " + cont + "},\n";
}

void write_v5_files(const std::string& dir) {
  namespace fmt = kvsdk::format;
  kvsdk_context* ctx = golden_context();
  check(ctx ? KVSDK_OK : KVSDK_E_INTERNAL, "context");
  std::string body;

  // The prefix, frozen, and its own snapshot (a plain file: no prefix, no journal).
  kvsdk_cache* prefix = nullptr;
  check(v5_prefix(ctx, &prefix), "prefix");
  const std::string prefix_path = dir + "/" + kV5PrefixFile;
  std::remove(prefix_path.c_str());
  check(kvsdk_cache_save(prefix, prefix_path.c_str(), nullptr), "save the prefix");
  const LiveRows live_prefix = live_rows(prefix);
  {
    const std::vector<unsigned char> bytes = read_all(prefix_path);
    uint64_t base_end = 0;
    const std::vector<V2Frame> frames = frames_of(bytes, &base_end);
    fail_if(base_end != bytes.size(), "the prefix file has a journal");
    const fmt::FileHeader fh = fmt::decode_file_header(bytes.data());
    fail_if(fh.major != 4 || fh.minor != 1, "the prefix file is not format 4.1");
    kvsdk_load_info info;
    kvsdk_cache* c = v5_load(ctx, nullptr, dir, bytes, &info);
    fail_if(info.format_major != 4 || info.format_minor != 1, "prefix load info version");
    kvsdk_policy got;
    kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
    check(kvsdk_cache_policy(c, &got), "policy");
    const V2State st = measure(c, nullptr);
    kvsdk_cache_destroy(c);
    fail_unless_rows(st, live_prefix, "prefix file");
    fail_if((st.tier_mask & (1u << KVSDK_TIER_QUANTIZED)) == 0, "the prefix holds no kivi blocks");
    body += v5_entry(kV5PrefixFile, kV5PrefixPreset, 2, got, info, bytes.size(), base_end, frames,
                     st, st, 0);
    std::printf("%-32s %u.%u %6zu bytes\n", kV5PrefixFile, fh.major, fh.minor, bytes.size());
  }

  size_t n = 0;
  const V5Case* cases = v5_0_cases(&n);
  uint64_t attention_of_first = 0;
  for (size_t i = 0; i < n; ++i) {
    const V5Case& cs = cases[i];
    const std::string file = cs.file, path = dir + "/" + file;
    kvsdk_save_options o;
    kvsdk_save_options_init(&o);
    o.embed_prefix = cs.embed_prefix;
    kvsdk_cache* c = nullptr;
    check(v5_conversation(prefix, cs.preset, kV5Delta1Steps, &c), "conversation");
    std::remove(path.c_str());
    check(kvsdk_cache_save(c, path.c_str(), &o), "save");
    const uint64_t base_end = read_all(path).size();
    const LiveRows live_base = live_rows(c);
    check(v5_steps(cs.preset, c, kV5Delta1Steps, kV5EndSteps), "delta steps");
    check(kvsdk_cache_save_delta(c, path.c_str(), &o), "delta");
    const LiveRows live_full = live_rows(c);
    std::vector<float> outputs;
    check(v5_steps(cs.preset, c, kV5EndSteps, kV5EndSteps + kV5ContinueSteps, &outputs),
          "continue");
    uint64_t uninterrupted = 0;
    check(v2_continuation_digest(c, outputs, &uninterrupted), "continuation digest");
    kvsdk_cache_destroy(c);

    const std::vector<unsigned char> bytes = read_all(path);
    const fmt::FileHeader fh = fmt::decode_file_header(bytes.data());
    fail_if(fh.major != 5 || fh.minor != 0, file + ": not a format 5.0 file");
    uint64_t frames_end = 0;
    const std::vector<V2Frame> frames = frames_of(bytes, &frames_end);
    fail_if(frames_end != base_end || base_end >= bytes.size(), file + ": not a base and a delta");
    uint32_t journal_frames = 0;
    for (const V2Frame& f : frames) journal_frames += f.kind == uint8_t(fmt::FrameKind::kJournal);

    // Referencing files load on the prefix file, loaded and frozen.
    kvsdk_cache* on = cs.embed_prefix ? nullptr : v5_loaded_prefix(ctx, dir);
    if (!cs.embed_prefix) {
      kvsdk_cache* refused = nullptr;
      fail_if(kvsdk_cache_load_from_buffer(&refused, ctx, bytes.data(), bytes.size(), nullptr,
                                           nullptr) != KVSDK_E_STATE,
              file + ": a referencing file loaded without its prefix");
    }
    kvsdk_load_info info;
    c = v5_load(ctx, on, dir, bytes, &info);
    fail_if(info.format_major != 5 || info.format_minor != 0, file + ": load info version");
    fail_if(info.journal_frames_applied != journal_frames || info.journal_frames_dropped != 0,
            file + ": journal not applied whole");
    kvsdk_policy got;
    kvsdk_policy_init(&got, KVSDK_METHOD_FULL);
    check(kvsdk_cache_policy(c, &got), "policy");
    fail_if(got.method != v2_policy(v5_script(cs.preset)).method, file + ": policy differs");
    const V2State full = measure(c, nullptr);
    kvsdk_cache_destroy(c);
    fail_unless_rows(full, live_full, file + " (whole)");

    kvsdk_load_info base_info;
    c = v5_load(ctx, on, dir, std::vector<unsigned char>(bytes.begin(), bytes.begin() + long(base_end)),
                &base_info);
    fail_if(base_info.journal_frames_applied != 0, file + ": base has a journal");
    const V2State base = measure(c, nullptr);
    kvsdk_cache_destroy(c);
    fail_unless_rows(base, live_base, file + " (base)");
    fail_if(rows_lost(base, full) != 0, file + ": the delta lost rows");

    c = v5_load(ctx, on, dir, bytes, &info);
    outputs.clear();
    check(v5_steps(cs.preset, c, kV5EndSteps, kV5EndSteps + kV5ContinueSteps, &outputs),
          "continue loaded");
    uint64_t resumed = 0;
    check(v2_continuation_digest(c, outputs, &resumed), "continuation digest");
    kvsdk_cache_destroy(c);
    kvsdk_cache_destroy(on);
    fail_if(resumed != uninterrupted, file + ": the loaded cache continues differently");

    // Both files hold the same conversation: the same attention over prefix and own rows.
    uint64_t a = fnv1a(kFnvBasis, full.attention, sizeof full.attention);
    if (i == 0) attention_of_first = a;
    fail_if(a != attention_of_first, file + ": attention differs from the embedding file's");

    body += v5_entry(file, cs.preset, cs.embed_prefix, got, info, bytes.size(), base_end, frames,
                     base, full, resumed);
    std::printf("%-32s %u.%u %6zu bytes (base %" PRIu64 ", %u journal frames)\n", file.c_str(),
                fh.major, fh.minor, bytes.size(), base_end, journal_frames);
  }
  kvsdk_cache_destroy(prefix);
  uint64_t used = 1;
  check(kvsdk_context_used_bytes(ctx, &used), "used");
  fail_if(used != 0, "bytes left charged");
  kvsdk_context_destroy(ctx);

  const std::string header =
      "// GENERATED by tests/golden/make_golden.cpp (kvsdk " + std::string(kvsdk_version_string()) +
      ", snapshot format 5.0) together with the\n"
      "// v5_0_*.kvsnap files: what each file holds after load, measured by loading it when it was\n"
      "// written. Do not edit by hand; the files and this record change together or not at all.\n"
      "// Fields: see V5Expected in golden_content.h.\n"
      "#pragma once\n\n#include <vector>\n\n#include \"golden_content.h\"\n\n"
      "namespace kvsdk_golden {\n\n"
      "inline const std::vector<V5Expected>& v5_0_expected() {\n"
      "  static const std::vector<V5Expected> expected = {\n" +
      body + "  };\n  return expected;\n}\n\n}  // namespace kvsdk_golden\n";
  write_bytes(dir + "/v5_0_expected.h",
              std::vector<unsigned char>(header.begin(), header.end()));
}

}  // namespace

// Format 1.0 (written by the 1.0 writer; today's writer would write these caches as 1.2).
void write_v1_files(kvsdk_context* ctx, const std::string& dir) {
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
  std::vector<kvsdk::LayerState> layers = {c->impl->layer_image(0), c->impl->layer_image(1)};
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
  if (!out || std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size()) std::exit(1);
  std::fclose(out);
}

int main(int argc, char** argv) {
  std::string only;
  if (argc > 1 && std::strncmp(argv[1], "--only=", 7) == 0) {
    only = argv[1] + 7;
    --argc;
    ++argv;
  }
  if ((argc != 2 && argc != 3) ||
      (!only.empty() && only != "v1_0" && only != "v2_0" && only != "v3_0" && only != "v3_1" &&
       only != "v4_0" && only != "v1_2" && only != "v5_0")) {
    std::fprintf(stderr,
                 "usage: %s [--only=v1_0|v2_0|v3_0|v3_1|v4_0|v5_0|v1_2] GOLDEN_DIR [FUZZ_SEED_DIR]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  kvsdk_context* ctx = golden_context();
  check(ctx ? KVSDK_OK : KVSDK_E_INTERNAL, "context");
  if (only.empty() || only == "v1_0") write_v1_files(ctx, dir);
  if (only.empty() || only == "v2_0") write_v2_files(dir);
  if (only.empty() || only == "v3_0") write_v3_files(dir, "v3_0");
  if (only.empty() || only == "v3_1") write_v3_files(dir, "v3_1");
  if (only.empty() || only == "v4_0") write_v3_files(dir, "v4_0");
  if (only.empty() || only == "v1_2") write_v3_files(dir, "v1_2");
  if (only.empty() || only == "v5_0") write_v5_files(dir);
  if (argc == 3) write_seeds(ctx, argv[2]);
  kvsdk_context_destroy(ctx);
  std::printf("golden snapshots written to %s\n", dir.c_str());
  return 0;
}
