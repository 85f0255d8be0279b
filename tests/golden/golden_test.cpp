// Golden snapshots: files written by an earlier kvsdk (tests/golden/*.kvsnap, made once by
// make_golden.cpp) must load with exactly the rows they were saved with, forever.
//   v1_0_*: exact caches (format 1.0), checked row by row against golden_content.h's formulas.
//   v2_0_*: caches with compressed tiers (format 2.0), checked against what the generator
//           measured when it wrote them (v2_0_expected.h), continued next to a cache rebuilt by
//           the same script, and damaged (a flipped byte in every frame, cuts inside the base).
//   v3_0_*, v1_2_*: the 3.0 writer's files (window methods and compressed tiers as 3.0, other
//           exact caches as 1.2): a base and two journal deltas each, checked against
//           v3_0_expected.h / v1_2_expected.h part by part and continued as the v2_0 files are.
//   v3_1_*: the 3.1 writer's file that differs from 3.0 (h2o+kivi4: H2O scores as differences in
//           its journal deltas), checked by the same script against v3_1_expected.h.
//   v4_0_*: the 4.0 writer's files (compressed stores as typed tables, deltas by field id): every
//           preset family it saves as 4.0, by the same script, against v4_0_expected.h.
//   v5_0_*: the 5.0 writer's files: a conversation on a shared prefix (kvsdk_cache_freeze,
//           kvsdk_cache_create_on_prefix), embedding its prefix (loads alone) and referencing it by
//           content hash (kvsdk_cache_load only refuses it, KVSDK_E_STATE; it loads with
//           kvsdk_cache_load_on_prefix on the prefix's own snapshot v5_0_prefix_base, loaded and
//           frozen), against v5_0_expected.h; a damaged embedded prefix is refused.
//   Every golden file, of every version: a deterministic mutation sweep (single-byte flips and
//           truncations spread over the whole file and on every record boundary). Each damaged
//           copy is refused with a status and an error message, or loads exactly what the
//           undamaged file (or, for damage in the journal, its last complete delta before the
//           damage) holds.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "container.h"
#include "golden_content.h"
#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"
#include "v1_2_expected.h"
#include "v2_0_expected.h"
#include "v3_0_expected.h"
#include "v3_1_expected.h"
#include "v4_0_expected.h"
#include "v5_0_expected.h"
#include "../formats/snapshot_mutation.h"

using namespace kvsdk_golden;
using namespace kvsdk_test;

namespace {

// Every golden file named `prefix`*.kvsnap has a record in `header` (a file added without one
// would go unchecked).
void expect_every_file_recorded(const std::string& prefix, const std::vector<std::string>& recorded,
                                const char* header) {
  DIR* d = opendir(KVSDK_GOLDEN_DIR);
  ASSERT_NE(d, nullptr);
  for (dirent* ent; (ent = readdir(d)) != nullptr;) {
    const std::string name = ent->d_name;
    if (name.rfind(prefix, 0) == 0 && name.size() > 7 && name.substr(name.size() - 7) == ".kvsnap") {
      EXPECT_NE(std::find(recorded.begin(), recorded.end(), name), recorded.end())
          << name << " has no record in " << header;
    }
  }
  closedir(d);
}

// The policy a loaded golden cache reports equals the recorded one and its preset spec.
void expect_policy(const kvsdk_cache* c, const V2Policy& w, const char* preset);

}  // namespace

namespace {

struct Expected {
  const char* file;
  int32_t dtype;
  uint32_t applied, dropped;
  // Positions each (layer, head) must hold, and appended tokens per layer.
  std::vector<std::vector<std::vector<int32_t>>> positions;
  std::vector<uint64_t> appended;
};

std::vector<int32_t> range(int32_t a, int32_t b) {
  std::vector<int32_t> r;
  for (int32_t i = a; i < b; ++i) r.push_back(i);
  return r;
}

std::vector<Expected> expectations() {
  const auto base = std::vector<std::vector<std::vector<int32_t>>>{
      {range(0, 5), range(0, 5)}, {range(0, 7), range(0, 7)}};
  return {
      {"v1_0_exact_f32.kvsnap", KVSDK_DTYPE_F32, 0, 0, base, {5, 7}},
      {"v1_0_multiframe_f16.kvsnap", KVSDK_DTYPE_F16, 0, 0, base, {5, 7}},
      {"v1_0_journal_bf16.kvsnap", KVSDK_DTYPE_BF16, 2, 0,
       {{range(0, 7), {0, 3, 4, 5, 6}}, {range(1, 9), range(0, 9)}}, {7, 9}},
      {"v1_0_torn_tail.kvsnap", KVSDK_DTYPE_BF16, 1, 1,
       {{range(0, 7), range(0, 7)}, {range(0, 8), range(0, 8)}}, {7, 8}},
  };
}

float host_value(const std::vector<unsigned char>& buf, size_t i, int32_t dtype) {
  if (dtype == KVSDK_DTYPE_F32) {
    float f;
    std::memcpy(&f, &buf[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &buf[i * 2], 2);
  return dtype == KVSDK_DTYPE_F16 ? kvsdk::f16_to_f32(h) : kvsdk::bf16_to_f32(h);
}

TEST(Golden, EveryGoldenSnapshotLoadsWithItsExactRows) {
  for (const Expected& e : expectations()) {
    SCOPED_TRACE(e.file);
    const std::string path = std::string(KVSDK_GOLDEN_DIR) + "/" + e.file;
    auto ctx = make_context(0, kGoldenBackend);
    const kvsdk_geometry want = golden_geometry(e.dtype);
    kvsdk_cache* raw = nullptr;
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &want, &info), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr c(raw);
    EXPECT_EQ(info.format_major, 1u);
    EXPECT_EQ(info.format_minor, 0u);
    EXPECT_EQ(info.journal_frames_applied, e.applied);
    EXPECT_EQ(info.journal_frames_dropped, e.dropped);
    kvsdk_policy p;
    kvsdk_policy_init(&p, KVSDK_METHOD_H2O);
    ASSERT_EQ(kvsdk_cache_policy(c.get(), &p), KVSDK_OK);
    EXPECT_EQ(p.method, KVSDK_METHOD_FULL);
    const size_t esz = e.dtype == KVSDK_DTYPE_F32 ? 4 : 2;
    for (uint32_t l = 0; l < want.n_layers; ++l) {
      kvsdk_layer_stats ls{};
      ls.struct_size = sizeof ls;
      ASSERT_EQ(kvsdk_cache_layer_stats_get(c.get(), l, &ls), KVSDK_OK);
      EXPECT_EQ(ls.appended_tokens, e.appended[l]);
      for (uint32_t h = 0; h < want.n_kv_heads; ++h) {
        const std::vector<int32_t>& expect = e.positions[l][h];
        size_t n = 0;
        ASSERT_EQ(kvsdk_cache_read(c.get(), l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
        ASSERT_EQ(n, expect.size()) << "layer " << l << " head " << h;
        std::vector<unsigned char> k(n * want.head_dim * esz), v(k.size());
        std::vector<int32_t> pos(n);
        ASSERT_EQ(kvsdk_cache_read(c.get(), l, h, k.data(), v.data(), pos.data(), n, &n), KVSDK_OK);
        EXPECT_EQ(pos, expect) << "layer " << l << " head " << h;
        for (size_t r = 0; r < n; ++r) {
          for (uint32_t d = 0; d < want.head_dim; ++d) {
            const uint32_t t = uint32_t(expect[r]);
            ASSERT_EQ(host_value(k, r * want.head_dim + d, e.dtype), key_value(l, t, h, d, false));
            ASSERT_EQ(host_value(v, r * want.head_dim + d, e.dtype), key_value(l, t, h, d, true));
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Format 2.0
// ------------------------------------------------------------------------------------------------

std::string golden_path(const char* file) { return std::string(KVSDK_GOLDEN_DIR) + "/" + file; }

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

// The generator's case that wrote `file` among `n` cases (NULL when none did).
template <class Case>
const Case* case_named(const Case* cases, size_t n, const std::string& file) {
  for (size_t i = 0; i < n; ++i) {
    if (file == cases[i].file) return &cases[i];
  }
  return nullptr;
}

const V2Case* case_of(const V2Expected& e) {
  size_t n = 0;
  const V2Case* cases = v2_cases(&n);
  return case_named(cases, n, e.file);
}

// A proxy (smallkv only) that has run the proxy's share of steps [0, steps); NULL otherwise.
CachePtr v2_proxy(const V2Case& cs, kvsdk_context* ctx, uint32_t steps) {
  if (!cs.proxy) return nullptr;
  CachePtr p = make_cache(ctx, v2_proxy_geometry());
  EXPECT_TRUE(p) << kvsdk_last_error();
  for (uint32_t s = 0; p && s < steps; ++s) {
    EXPECT_EQ(v2_proxy_step(p.get(), s), KVSDK_OK) << kvsdk_last_error();
  }
  return p;
}

// Loads `bytes` (expected geometry: the v2 one); `out` untouched on failure (checked).
kvsdk_status v2_load(kvsdk_context* ctx, const std::vector<unsigned char>& bytes, CachePtr* out,
                     kvsdk_load_info* info) {
  const kvsdk_geometry g = v2_geometry();
  kvsdk_cache* raw = reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1));
  info->struct_size = sizeof *info;
  const void* data = bytes.empty() ? "" : static_cast<const void*>(bytes.data());  // not NULL
  const kvsdk_status st = kvsdk_cache_load_from_buffer(&raw, ctx, data, bytes.size(), &g, info);
  if (st == KVSDK_OK) {
    out->reset(raw);
  } else {
    EXPECT_EQ(raw, reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1))) << "out touched on failure";
  }
  return st;
}

void expect_state(const V2State& got, const V2State& want, const char* what) {
  SCOPED_TRACE(what);
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    EXPECT_EQ(got.appended[l], want.appended[l]) << "layer " << l;
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      EXPECT_EQ(got.tokens[l][h], want.tokens[l][h]) << "layer " << l << " head " << h;
      EXPECT_EQ(got.rows[l][h], want.rows[l][h]) << "read-back rows, layer " << l << " head " << h;
    }
    EXPECT_EQ(got.attention[l], want.attention[l]) << "fixed-query attention, layer " << l;
  }
  EXPECT_EQ(got.tier_mask, want.tier_mask) << "tiers holding bytes";
}

// Digests of what kvsdk_cache_read returns, per (layer, head).
std::vector<uint64_t> rows_of(const kvsdk_cache* c) {
  std::vector<uint64_t> d;
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      uint64_t n = 0, digest = 0;
      EXPECT_EQ(v2_rows_digest(c, l, h, &n, &digest), KVSDK_OK);
      d.push_back(digest);
    }
  }
  return d;
}

std::vector<uint64_t> recorded_rows(const V2State& s) {
  std::vector<uint64_t> d;
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) d.push_back(s.rows[l][h]);
  }
  return d;
}

constexpr uint8_t kJournalFrame = 4;
constexpr uint64_t kHeaderBytes = 32;  // file header, frame header and trailer of format 2.0

// The generator's record and the files agree: one file per case of the script, each as
// recorded (size, frames), and no v2_0 file without a record.
TEST(GoldenV2, EveryFileOfTheScriptIsRecorded) {
  size_t n = 0;
  const V2Case* cases = v2_cases(&n);
  ASSERT_EQ(v2_expected().size(), n);
  std::vector<std::string> recorded;
  for (const V2Expected& e : v2_expected()) {
    SCOPED_TRACE(e.file);
    recorded.push_back(e.file);
    const V2Case* cs = case_of(e);
    ASSERT_NE(cs, nullptr) << "no case in golden_content.h's script";
    EXPECT_STREQ(cs->preset, e.preset);
    EXPECT_EQ(cs->include_backing, e.include_backing);
    EXPECT_EQ(cs->cache_budget, e.cache_budget);
    const std::vector<unsigned char> f = file_bytes(golden_path(e.file));
    ASSERT_EQ(f.size(), e.file_bytes) << "file changed without its record";
    ASSERT_GE(e.frames.size(), 4u);
    uint64_t pos = kHeaderBytes;
    for (const V2Frame& fr : e.frames) {
      if (fr.offset == e.base_end) pos += kHeaderBytes;  // the trailer before the journal
      EXPECT_EQ(fr.offset, pos);
      EXPECT_EQ(std::memcmp(&f[fr.offset], "KVFR", 4), 0) << "frame at " << fr.offset;
      EXPECT_EQ(fr.kind == kJournalFrame, fr.offset >= e.base_end);
      pos = fr.offset + kHeaderBytes + fr.payload_bytes;
    }
    EXPECT_EQ(pos, e.file_bytes);
    EXPECT_EQ(std::memcmp(&f[e.base_end - kHeaderBytes], "KVSDKEND", 8), 0);
  }
  expect_every_file_recorded("v2_0_", recorded, "v2_0_expected.h");
}

// Every v2_0 file loads as format 2.0 with its journal, its policy, and exactly the rows and
// attention recorded when it was written.
TEST(GoldenV2, EveryFileLoadsWithItsRecordedContent) {
  for (const V2Expected& e : v2_expected()) {
    SCOPED_TRACE(e.file);
    const V2Case* cs = case_of(e);
    ASSERT_NE(cs, nullptr);
    auto ctx = make_context(0, kGoldenBackend);
    kvsdk_cache* raw = nullptr;
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    const kvsdk_geometry want = v2_geometry();
    ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), golden_path(e.file).c_str(), &want, &info),
              KVSDK_OK)
        << kvsdk_last_error();
    CachePtr c(raw);
    EXPECT_EQ(info.format_major, 2u);
    EXPECT_EQ(info.format_minor, 0u);
    EXPECT_EQ(info.format_major, e.format_major);
    EXPECT_EQ(info.format_minor, e.format_minor);
    EXPECT_EQ(info.journal_frames_applied, e.journal_frames_applied);
    EXPECT_GE(info.journal_frames_applied, 1u);
    EXPECT_EQ(info.journal_frames_dropped, 0u);

    expect_policy(c.get(), e.policy, e.preset);
    if (HasFatalFailure()) return;

    CachePtr proxy = v2_proxy(*cs, ctx.get(), kV2BaseSteps + kV2DeltaSteps);
    V2State got;
    ASSERT_EQ(v2_measure(c.get(), proxy.get(), &got), KVSDK_OK) << kvsdk_last_error();
    expect_state(got, e.full, "base + journal delta");
  }
}

// The full snapshot alone (the file cut where its journal begins) holds the base state.
TEST(GoldenV2, TheBaseAloneLoadsWithItsRecordedContent) {
  for (const V2Expected& e : v2_expected()) {
    SCOPED_TRACE(e.file);
    const V2Case* cs = case_of(e);
    ASSERT_NE(cs, nullptr);
    auto ctx = make_context(0, kGoldenBackend);
    const std::vector<unsigned char> f = file_bytes(golden_path(e.file));
    ASSERT_EQ(f.size(), e.file_bytes);
    const std::vector<unsigned char> base(f.begin(), f.begin() + long(e.base_end));
    CachePtr c;
    kvsdk_load_info info{};
    ASSERT_EQ(v2_load(ctx.get(), base, &c, &info), KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(info.format_major, 2u);
    EXPECT_EQ(info.format_minor, 0u);
    EXPECT_EQ(info.journal_frames_applied, 0u);
    EXPECT_EQ(info.journal_frames_dropped, 0u);
    // Today's code rebuilds the same rows from the script.
    CachePtr rebuilt_proxy = v2_proxy(*cs, ctx.get(), 0);
    kvsdk_cache* raw = nullptr;
    ASSERT_EQ(v2_build(*cs, ctx.get(), rebuilt_proxy.get(), kV2BaseSteps, &raw), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr rebuilt(raw);
    EXPECT_EQ(rows_of(rebuilt.get()), recorded_rows(e.base));
    CachePtr proxy = v2_proxy(*cs, ctx.get(), kV2BaseSteps);
    V2State got;
    ASSERT_EQ(v2_measure(c.get(), proxy.get(), &got), KVSDK_OK) << kvsdk_last_error();
    expect_state(got, e.base, "base alone");
  }
}

// After load every file continues, step by step, like a cache rebuilt from the same script (for
// smallkv with a proxy rebuilt from the same tokens), and as the writer's own cache did.
TEST(GoldenV2, EveryFileContinuesLikeARebuiltCache) {
  const uint32_t from = kV2BaseSteps + kV2DeltaSteps;
  for (const V2Expected& e : v2_expected()) {
    SCOPED_TRACE(e.file);
    const V2Case* cs = case_of(e);
    ASSERT_NE(cs, nullptr);
    auto ctx = make_context(0, kGoldenBackend);
    CachePtr loaded;
    kvsdk_load_info info{};
    ASSERT_EQ(v2_load(ctx.get(), file_bytes(golden_path(e.file)), &loaded, &info), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr loaded_proxy = v2_proxy(*cs, ctx.get(), from);
    if (cs->proxy) {
      ASSERT_EQ(kvsdk_cache_set_proxy(loaded.get(), loaded_proxy.get()), KVSDK_OK)
          << kvsdk_last_error();
    }
    CachePtr rebuilt_proxy = v2_proxy(*cs, ctx.get(), 0);
    kvsdk_cache* raw = nullptr;
    ASSERT_EQ(v2_build(*cs, ctx.get(), rebuilt_proxy.get(), from, &raw), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr rebuilt(raw);
    EXPECT_EQ(rows_of(loaded.get()), rows_of(rebuilt.get()));
    EXPECT_EQ(rows_of(loaded.get()), recorded_rows(e.full));
    std::vector<float> all;
    for (uint32_t s = from; s < from + kV2ContinueSteps; ++s) {
      std::vector<float> a, b;
      ASSERT_EQ(v2_step(*cs, loaded.get(), loaded_proxy.get(), s, &a), KVSDK_OK)
          << "step " << s << ": " << kvsdk_last_error();
      ASSERT_EQ(v2_step(*cs, rebuilt.get(), rebuilt_proxy.get(), s, &b), KVSDK_OK)
          << "step " << s << ": " << kvsdk_last_error();
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "step " << s << " outputs";
      EXPECT_EQ(rows_of(loaded.get()), rows_of(rebuilt.get())) << "step " << s << " rows";
      all.insert(all.end(), a.begin(), a.end());
    }
    uint64_t digest = 0;
    ASSERT_EQ(v2_continuation_digest(loaded.get(), all, &digest), KVSDK_OK);
    EXPECT_EQ(digest, e.continuation) << "continues differently from the writer's cache";
  }
}

// Damaged copies: a flipped byte in every frame (payload and header) and cuts inside the full
// snapshot are refused with KVSDK_E_CORRUPT (nothing charged, `out` untouched). The journal
// follows the documented torn-tail rule instead (kvsdk_cache_save_delta, corruption_test.cpp):
// a damaged or cut journal frame is dropped, and the base state loads.
TEST(GoldenV2, DamagedCopiesAreRejectedNeverTrusted) {
  for (const V2Expected& e : v2_expected()) {
    SCOPED_TRACE(e.file);
    auto ctx = make_context(0, kGoldenBackend);
    const std::vector<unsigned char> f = file_bytes(golden_path(e.file));
    ASSERT_EQ(f.size(), e.file_bytes);
    const std::vector<uint64_t> base_rows = recorded_rows(e.base);
    auto journal_dropped = [&](const std::vector<unsigned char>& bad, const std::string& what) {
      CachePtr c;
      kvsdk_load_info info{};
      ASSERT_EQ(v2_load(ctx.get(), bad, &c, &info), KVSDK_OK) << what << ": " << kvsdk_last_error();
      EXPECT_EQ(info.journal_frames_applied, 0u) << what;
      EXPECT_GE(info.journal_frames_dropped, 1u) << what;
      EXPECT_EQ(rows_of(c.get()), base_rows) << what;
    };
    size_t corrupt = 0;
    for (const V2Frame& fr : e.frames) {
      // The middle byte of the payload, and a byte of the frame header (its sizes).
      for (const uint64_t at : {fr.offset + kHeaderBytes + fr.payload_bytes / 2, fr.offset + 9}) {
        const std::string what = "frame at " + std::to_string(fr.offset) + " (kind " +
                                 std::to_string(fr.kind) + "), byte " + std::to_string(at) +
                                 " flipped";
        std::vector<unsigned char> bad = f;
        bad[at] ^= 0xFF;
        if (fr.kind == kJournalFrame) {
          journal_dropped(bad, what);
        } else {
          CachePtr c;
          kvsdk_load_info info{};
          EXPECT_EQ(v2_load(ctx.get(), bad, &c, &info), KVSDK_E_CORRUPT) << what;
          ++corrupt;
        }
      }
    }
    EXPECT_GE(corrupt, 2u * 4u);
    // Cuts inside the base: the file header, every frame (header, payload), the trailer.
    std::vector<uint64_t> cuts = {0, 1, 8, 16, kHeaderBytes - 1, kHeaderBytes,
                                  e.base_end - kHeaderBytes, e.base_end - kHeaderBytes / 2,
                                  e.base_end - 1};
    for (const V2Frame& fr : e.frames) {
      if (fr.kind == kJournalFrame) continue;
      for (const uint64_t d : {uint64_t(1), uint64_t(16), kHeaderBytes, kHeaderBytes + 1,
                               kHeaderBytes + fr.payload_bytes / 2,
                               kHeaderBytes + fr.payload_bytes - 1}) {
        cuts.push_back(fr.offset + d);
      }
    }
    for (const uint64_t cut : cuts) {
      ASSERT_LT(cut, e.base_end);
      CachePtr c;
      kvsdk_load_info info{};
      EXPECT_EQ(v2_load(ctx.get(), std::vector<unsigned char>(f.begin(), f.begin() + long(cut)), &c,
                        &info),
                KVSDK_E_CORRUPT)
          << "cut at " << cut;
    }
    // Cuts inside the journal: a torn tail.
    for (const V2Frame& fr : e.frames) {
      if (fr.kind != kJournalFrame) continue;
      for (const uint64_t d : {uint64_t(1), kHeaderBytes, kHeaderBytes + fr.payload_bytes / 2,
                               kHeaderBytes + fr.payload_bytes - 1}) {
        journal_dropped(std::vector<unsigned char>(f.begin(), f.begin() + long(fr.offset + d)),
                        "cut at " + std::to_string(fr.offset + d));
      }
    }
    // The failed loads charged nothing.
    uint64_t used = 1;
    ASSERT_EQ(kvsdk_context_used_bytes(ctx.get(), &used), KVSDK_OK);
    EXPECT_EQ(used, 0u);
  }
}

// ------------------------------------------------------------------------------------------------
// Formats 3.0 and 1.2 (the v3 script: base, an appending delta, a delta under an eviction budget)
// ------------------------------------------------------------------------------------------------

// Every version written by the v3 script: its file prefix, record, cases and container version.
struct V3Version {
  const char* prefix;
  const std::vector<V3Expected>& (*expected)();
  const V3Case* (*cases)(size_t*);
  uint32_t major, minor;
};

const std::vector<V3Version>& v3_versions() {
  static const std::vector<V3Version> versions = {
      {"v3_0_", &v3_0_expected, &v3_cases, 3, 0},
      {"v3_1_", &v3_1_expected, &v3_1_cases, 3, 1},
      {"v4_0_", &v4_0_expected, &v4_0_cases, 4, 0},
      {"v1_2_", &v1_2_expected, &v1_2_cases, 1, 2},
  };
  return versions;
}

const V3Version* v3_version_of(const std::string& file) {
  for (const V3Version& v : v3_versions()) {
    if (file.rfind(v.prefix, 0) == 0) return &v;
  }
  return nullptr;
}

std::vector<const V3Expected*> v3_records() {
  std::vector<const V3Expected*> all;
  for (const V3Version& v : v3_versions()) {
    for (const V3Expected& e : v.expected()) all.push_back(&e);
  }
  return all;
}

const V3Case* v3_case_of(const V3Expected& e) {
  for (const V3Version& v : v3_versions()) {
    size_t n = 0;
    const V3Case* cases = v.cases(&n);
    for (size_t i = 0; i < n; ++i) {
      if (std::string(cases[i].script.file) == e.file) return &cases[i];
    }
  }
  return nullptr;
}

uint32_t header_u16(const std::vector<unsigned char>& f, size_t at) {
  return uint32_t(f[at]) | uint32_t(f[at + 1]) << 8;
}

void expect_policy(const kvsdk_cache* c, const V2Policy& w, const char* preset) {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  ASSERT_EQ(kvsdk_cache_policy(c, &p), KVSDK_OK);
  EXPECT_EQ(p.method, w.method);
  EXPECT_EQ(p.quant_bits, w.quant_bits);
  EXPECT_EQ(p.quant_group, w.quant_group);
  EXPECT_EQ(p.quant_residual, w.quant_residual);
  EXPECT_EQ(p.sink_tokens, w.sink_tokens);
  EXPECT_EQ(p.recent_tokens, w.recent_tokens);
  EXPECT_EQ(p.obs_window, w.obs_window);
  EXPECT_EQ(p.pool_kernel, w.pool_kernel);
  EXPECT_EQ(p.pool_kind, w.pool_kind);
  EXPECT_EQ(p.heavy_ratio, w.heavy_ratio);
  EXPECT_EQ(p.schedule_alpha, w.schedule_alpha);
  EXPECT_EQ(p.schedule_beta, w.schedule_beta);
  EXPECT_EQ(p.boundary_layer, w.boundary_layer);
  EXPECT_EQ(p.merge_t, w.merge_t);
  EXPECT_EQ(p.retain_ratio, w.retain_ratio);
  EXPECT_EQ(p.fetch_tokens, w.fetch_tokens);
  EXPECT_EQ(p.match_tokens, w.match_tokens);
  EXPECT_EQ(p.evict_slack, 0.0f);  // written before the field existed: exact eviction
  EXPECT_EQ(p.kivi_weight_bits, 14);  // and before this one: 14-bit KIVI value weights
  kvsdk_policy parsed;
  ASSERT_EQ(kvsdk_policy_parse(&parsed, preset), KVSDK_OK);
  EXPECT_EQ(p.method, parsed.method);
  EXPECT_EQ(p.quant_bits, parsed.quant_bits);
}

// The record and the files agree: one file per case of each table, each as recorded (size,
// frames, the version in its container header), no file of a v3-script version without a record.
TEST(GoldenV3, EveryFileOfTheScriptIsRecorded) {
  for (const V3Version& v : v3_versions()) {
    size_t n = 0;
    v.cases(&n);
    ASSERT_EQ(v.expected().size(), n) << v.prefix;
  }
  size_t n3 = 0;
  v3_cases(&n3);
  ASSERT_GE(n3, 12u);
  std::vector<std::string> recorded;
  for (const V3Expected* ep : v3_records()) {
    const V3Expected& e = *ep;
    SCOPED_TRACE(e.file);
    recorded.push_back(e.file);
    const V3Case* cs = v3_case_of(e);
    ASSERT_NE(cs, nullptr) << "no case in golden_content.h's v3 script";
    EXPECT_STREQ(cs->script.preset, e.preset);
    EXPECT_EQ(cs->script.include_backing, e.include_backing);
    EXPECT_EQ(cs->script.cache_budget, e.cache_budget);
    EXPECT_EQ(cs->evict_percent != 0, e.evict_budget != 0);
    const V3Version* version = v3_version_of(e.file);
    ASSERT_NE(version, nullptr);
    EXPECT_EQ(e.format_major, version->major);
    EXPECT_EQ(e.format_minor, version->minor);
    const std::vector<unsigned char> f = file_bytes(golden_path(e.file));
    ASSERT_EQ(f.size(), e.file_bytes) << "file changed without its record";
    // The container header: magic, then format major and minor (little-endian u16).
    ASSERT_EQ(std::memcmp(f.data(), "KVSDKSNP", 8), 0);
    EXPECT_EQ(header_u16(f, 8), e.format_major);
    EXPECT_EQ(header_u16(f, 10), e.format_minor);
    const kvsdk::format::FileHeader fh = kvsdk::format::decode_file_header(f.data());
    EXPECT_EQ(fh.major, e.format_major);
    EXPECT_EQ(fh.minor, e.format_minor);
    ASSERT_GE(e.frames.size(), 5u);
    uint64_t pos = kHeaderBytes;
    uint32_t journal = 0, delta1 = 0;
    for (const V2Frame& fr : e.frames) {
      if (fr.offset == e.base_end) pos += kHeaderBytes;  // the trailer before the journal
      EXPECT_EQ(fr.offset, pos);
      EXPECT_EQ(std::memcmp(&f[fr.offset], "KVFR", 4), 0) << "frame at " << fr.offset;
      EXPECT_EQ(fr.kind == kJournalFrame, fr.offset >= e.base_end);
      journal += fr.kind == kJournalFrame;
      delta1 += fr.kind == kJournalFrame && fr.offset < e.delta1_end;
      pos = fr.offset + kHeaderBytes + fr.payload_bytes;
      if (fr.offset < e.delta1_end) EXPECT_LE(pos, e.delta1_end);
    }
    EXPECT_EQ(pos, e.file_bytes);
    EXPECT_EQ(journal, e.journal_frames_applied);
    EXPECT_EQ(delta1, e.delta1_frames);
    EXPECT_GE(delta1, 1u);
    EXPECT_GT(journal, delta1) << "two deltas";
    EXPECT_EQ(std::memcmp(&f[e.base_end - kHeaderBytes], "KVSDKEND", 8), 0);
  }
  DIR* d = opendir(KVSDK_GOLDEN_DIR);
  ASSERT_NE(d, nullptr);
  for (dirent* ent; (ent = readdir(d)) != nullptr;) {
    const std::string name = ent->d_name;
    if (v3_version_of(name) && name.size() > 7 && name.substr(name.size() - 7) == ".kvsnap") {
      EXPECT_NE(std::find(recorded.begin(), recorded.end(), name), recorded.end())
          << name << " has no record in its <version>_expected.h";
    }
  }
  closedir(d);
}

// Every file loads as its version with both deltas, its policy, and exactly the recorded rows and
// attention; cut after delta 1 it holds delta 1's state, cut after its base the base state; and
// today's code rebuilds the same rows (and the same eviction budget) from the script.
TEST(GoldenV3, EveryPartLoadsWithItsRecordedContent) {
  for (const V3Expected* ep : v3_records()) {
    const V3Expected& e = *ep;
    SCOPED_TRACE(e.file);
    const V3Case* cs = v3_case_of(e);
    ASSERT_NE(cs, nullptr);
    auto ctx = make_context(0, kGoldenBackend);
    const std::vector<unsigned char> f = file_bytes(golden_path(e.file));
    ASSERT_EQ(f.size(), e.file_bytes);
    struct Part {
      const char* what;
      uint64_t end;
      uint32_t steps, applied;
      const V2State* state;
    };
    const Part parts[] = {{"whole file", e.file_bytes, kV3EndSteps, e.journal_frames_applied, &e.full},
                          {"cut after delta 1", e.delta1_end, kV3Delta1Steps, e.delta1_frames,
                           &e.delta1},
                          {"cut after the base", e.base_end, kV3BaseSteps, 0, &e.base}};
    for (const Part& part : parts) {
      SCOPED_TRACE(part.what);
      CachePtr c;
      kvsdk_load_info info{};
      ASSERT_EQ(v2_load(ctx.get(), std::vector<unsigned char>(f.begin(), f.begin() + long(part.end)),
                        &c, &info),
                KVSDK_OK)
          << kvsdk_last_error();
      EXPECT_EQ(info.format_major, e.format_major);
      EXPECT_EQ(info.format_minor, e.format_minor);
      EXPECT_EQ(info.journal_frames_applied, part.applied);
      EXPECT_EQ(info.journal_frames_dropped, 0u);
      expect_policy(c.get(), e.policy, e.preset);
      CachePtr proxy = v2_proxy(cs->script, ctx.get(), part.steps);
      V2State got;
      ASSERT_EQ(v2_measure(c.get(), proxy.get(), &got), KVSDK_OK) << kvsdk_last_error();
      expect_state(got, *part.state, part.what);
      // The same rows from today's code running the script.
      CachePtr rebuilt_proxy = v2_proxy(cs->script, ctx.get(), 0);
      kvsdk_cache* raw = nullptr;
      ASSERT_EQ(v3_build(*cs, ctx.get(), rebuilt_proxy.get(), part.steps, &raw), KVSDK_OK)
          << kvsdk_last_error();
      CachePtr rebuilt(raw);
      if (e.include_backing) EXPECT_EQ(rows_of(rebuilt.get()), recorded_rows(*part.state));
    }
    // Delta 1 only appended; under its budget delta 2 evicted (where the case sets one).
    for (uint32_t l = 0; l < kV2Layers; ++l) {
      for (uint32_t h = 0; h < kV2KvHeads; ++h) {
        EXPECT_EQ(e.delta1.tokens[l][h] - e.base.tokens[l][h],
                  e.delta1.appended[l] - e.base.appended[l]);
      }
    }
    uint64_t lost = 0;  // rows appended in delta 2 that it does not hold, or held and evicted
    for (uint32_t l = 0; l < kV2Layers; ++l) {
      for (uint32_t h = 0; h < kV2KvHeads; ++h) {
        const uint64_t could = e.delta1.tokens[l][h] + e.full.appended[l] - e.delta1.appended[l];
        lost += could - std::min(could, e.full.tokens[l][h]);
      }
    }
    if (e.evict_budget) {
      EXPECT_GT(lost, 0u) << "delta 2 evicted nothing";
      CachePtr proxy = v2_proxy(cs->script, ctx.get(), 0);
      kvsdk_cache* raw = nullptr;
      ASSERT_EQ(v3_build(*cs, ctx.get(), proxy.get(), kV3Delta1Steps, &raw), KVSDK_OK);
      CachePtr c(raw);
      uint64_t budget = 0;
      ASSERT_EQ(v3_evict_part(*cs, c.get(), proxy.get(), &budget), KVSDK_OK) << kvsdk_last_error();
      EXPECT_EQ(budget, e.evict_budget) << "the script sets another budget today";
    }
  }
}

// After load every file continues, step by step, like a cache rebuilt from the same script, and
// as the writer's own cache did (include_backing 0: as recorded).
TEST(GoldenV3, EveryFileContinuesLikeARebuiltCache) {
  const uint32_t from = kV3EndSteps;
  for (const V3Expected* ep : v3_records()) {
    const V3Expected& e = *ep;
    SCOPED_TRACE(e.file);
    const V3Case* cs = v3_case_of(e);
    ASSERT_NE(cs, nullptr);
    EXPECT_TRUE(e.continues_like_writer || !e.include_backing);
    auto ctx = make_context(0, kGoldenBackend);
    CachePtr loaded;
    kvsdk_load_info info{};
    ASSERT_EQ(v2_load(ctx.get(), file_bytes(golden_path(e.file)), &loaded, &info), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr loaded_proxy = v2_proxy(cs->script, ctx.get(), from);
    if (cs->script.proxy) {
      ASSERT_EQ(kvsdk_cache_set_proxy(loaded.get(), loaded_proxy.get()), KVSDK_OK)
          << kvsdk_last_error();
    }
    CachePtr rebuilt_proxy = v2_proxy(cs->script, ctx.get(), 0);
    kvsdk_cache* raw = nullptr;
    ASSERT_EQ(v3_build(*cs, ctx.get(), rebuilt_proxy.get(), from, &raw), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr rebuilt(raw);
    EXPECT_EQ(rows_of(loaded.get()), recorded_rows(e.full));
    const bool compare = e.continues_like_writer;
    if (compare) EXPECT_EQ(rows_of(loaded.get()), rows_of(rebuilt.get()));
    std::vector<float> all;
    for (uint32_t s = from; s < from + kV3ContinueSteps; ++s) {
      std::vector<float> a, b;
      ASSERT_EQ(v2_step(cs->script, loaded.get(), loaded_proxy.get(), s, &a), KVSDK_OK)
          << "step " << s << ": " << kvsdk_last_error();
      ASSERT_EQ(v2_step(cs->script, rebuilt.get(), rebuilt_proxy.get(), s, &b), KVSDK_OK)
          << "step " << s << ": " << kvsdk_last_error();
      ASSERT_EQ(a.size(), b.size());
      if (compare) {
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "step " << s << " outputs";
        EXPECT_EQ(rows_of(loaded.get()), rows_of(rebuilt.get())) << "step " << s << " rows";
      }
      all.insert(all.end(), a.begin(), a.end());
    }
    uint64_t digest = 0;
    ASSERT_EQ(v2_continuation_digest(loaded.get(), all, &digest), KVSDK_OK);
    EXPECT_EQ(digest, e.continuation) << "continues differently from the recorded run";
  }
}

// Format 5.0 helpers (the tests are after the mutation sweep).

const V5Expected* v5_record(const std::string& file) {
  for (const V5Expected& e : v5_0_expected()) {
    if (file == e.file) return &e;
  }
  return nullptr;
}

// The case of a conversation file (NULL for the prefix's own file).
const V5Case* v5_case_of(const V5Expected& e) {
  size_t n = 0;
  const V5Case* cases = v5_0_cases(&n);
  return case_named(cases, n, e.file);
}

std::string v5_temp(const std::string& name) {
  return ::testing::TempDir() + "golden_v5_" + std::to_string(getpid()) + "_" + name;
}

// Loads `bytes` of a v5 file: on `prefix` (kvsdk_cache_load_on_prefix, through a scratch file) or
// alone (kvsdk_cache_load_from_buffer, the v2 geometry expected). `out` untouched on failure.
kvsdk_status v5_load(kvsdk_context* ctx, kvsdk_cache* prefix,
                     const std::vector<unsigned char>& bytes, CachePtr* out,
                     kvsdk_load_info* info) {
  if (!prefix) return v2_load(ctx, bytes, out, info);
  const std::string path = v5_temp("load.kvsnap");
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  kvsdk_cache* raw = reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1));
  info->struct_size = sizeof *info;
  const kvsdk_status st = kvsdk_cache_load_on_prefix(&raw, prefix, path.c_str(), info);
  std::remove(path.c_str());
  if (st == KVSDK_OK) {
    out->reset(raw);
  } else {
    EXPECT_EQ(raw, reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1))) << "out touched on failure";
  }
  return st;
}

// v5_0_prefix_base.kvsnap loaded with kvsdk_cache_load, then frozen (unless `freeze` is false).
CachePtr v5_loaded_prefix(kvsdk_context* ctx, bool freeze = true) {
  kvsdk_cache* raw = nullptr;
  const kvsdk_geometry g = v2_geometry();
  EXPECT_EQ(kvsdk_cache_load(&raw, ctx, golden_path(kV5PrefixFile).c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr p(raw);
  if (p && freeze) EXPECT_EQ(kvsdk_cache_freeze(p.get()), KVSDK_OK) << kvsdk_last_error();
  return p;
}

uint64_t used_bytes(kvsdk_context* ctx) {
  uint64_t u = 1;
  EXPECT_EQ(kvsdk_context_used_bytes(ctx, &u), KVSDK_OK);
  return u;
}

uint64_t own_bytes(kvsdk_cache* c) {
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s.bytes;
}

// ------------------------------------------------------------------------------------------------
// Mutation sweep over every golden file of every version
// ------------------------------------------------------------------------------------------------

// What a loaded cache holds, from the public API only: geometry, policy, per-layer appended
// tokens, every (layer, head)'s rows as kvsdk_cache_read returns them, the cache's stats, and the
// attention of fixed queries (its status where the cache cannot attend alone, e.g. smallkv).
struct Content {
  std::vector<uint64_t> digests;
  bool operator==(const Content& o) const { return digests == o.digests; }
};

Content content_of(kvsdk_cache* c) {
  Content out;
  kvsdk_geometry g{};
  kvsdk_geometry_init(&g);
  EXPECT_EQ(kvsdk_cache_geometry(c, &g), KVSDK_OK);
  out.digests.push_back(fnv1a(kFnvBasis, &g, sizeof g));
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  EXPECT_EQ(kvsdk_cache_policy(c, &p), KVSDK_OK);
  out.digests.push_back(fnv1a(kFnvBasis, &p, sizeof p));
  const size_t esz = g.dtype == KVSDK_DTYPE_F32 ? 4 : 2;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    kvsdk_layer_stats ls{};
    ls.struct_size = sizeof ls;
    EXPECT_EQ(kvsdk_cache_layer_stats_get(c, l, &ls), KVSDK_OK);
    out.digests.push_back(ls.appended_tokens);
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      size_t n = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      std::vector<unsigned char> k(n * g.head_dim * esz), v(k.size());
      std::vector<int32_t> pos(n);
      if (n) EXPECT_EQ(kvsdk_cache_read(c, l, h, k.data(), v.data(), pos.data(), n, &n), KVSDK_OK);
      uint64_t d = fnv1a(kFnvBasis, &n, sizeof n);
      d = fnv1a(d, pos.data(), pos.size() * 4);
      d = fnv1a(d, k.data(), k.size());
      out.digests.push_back(fnv1a(d, v.data(), v.size()));
    }
  }
  kvsdk_cache_stats cs{};
  cs.struct_size = sizeof cs;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &cs), KVSDK_OK);
  for (const uint64_t x : {cs.tokens, cs.appended_tokens, cs.bytes, cs.full_bytes, cs.backing_bytes})
    out.digests.push_back(x);
  for (const uint64_t x : cs.bytes_by_tier) out.digests.push_back(x);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const uint32_t nq = 2;
    const std::vector<int32_t> qpos(nq, 1000);
    std::vector<unsigned char> q(size_t(nq) * g.n_q_heads * g.head_dim * esz, 0);
    for (size_t i = 0; i < q.size() / esz; ++i) {
      const float x = query_value(l, uint32_t(i / g.head_dim), uint32_t(i), 0, 5);
      if (esz == 4) {
        std::memcpy(&q[i * 4], &x, 4);
      } else {
        const uint16_t b = g.dtype == KVSDK_DTYPE_F16 ? kvsdk::f32_to_f16(x) : kvsdk::f32_to_bf16(x);
        std::memcpy(&q[i * 2], &b, 2);
      }
    }
    std::vector<unsigned char> o(q.size());
    const kvsdk_status st =
        kvsdk_cache_attend(c, l, nq, q.data(), qpos.data(), q.size(), o.data(), o.size());
    out.digests.push_back(st == KVSDK_OK ? fnv1a(kFnvBasis, o.data(), o.size()) : uint64_t(st));
  }
  return out;
}

// A loaded (or refused) copy.
struct LoadResult {
  kvsdk_status status;
  std::string error;
  kvsdk_load_info info{};
  Content content;
};

// `prefix` (a golden file that references its shared prefix): loaded on it with
// kvsdk_cache_load_on_prefix, through a scratch file; otherwise kvsdk_cache_load_from_buffer.
LoadResult load_any_in(kvsdk_context* ctx, const std::vector<unsigned char>& bytes,
                       kvsdk_cache* prefix) {
  LoadResult r;
  kvsdk_cache* raw = reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1));
  r.info.struct_size = sizeof r.info;
  const void* data = bytes.empty() ? "" : static_cast<const void*>(bytes.data());  // not NULL
  if (prefix) {
    const std::string path = ::testing::TempDir() + "golden_sweep_" + std::to_string(getpid()) +
                             ".kvsnap";
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    r.status = kvsdk_cache_load_on_prefix(&raw, prefix, path.c_str(), &r.info);
    std::remove(path.c_str());
  } else {
    r.status = kvsdk_cache_load_from_buffer(&raw, ctx, data, bytes.size(), nullptr, &r.info);
  }
  if (r.status != KVSDK_OK) {
    const char* err = kvsdk_last_error();
    r.error = err ? err : "";
    EXPECT_EQ(raw, reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1))) << "out touched on failure";
    return r;
  }
  CachePtr c(raw);
  r.content = content_of(c.get());
  return r;
}

// The records of a file, from its container headers: the end of the base (after its trailer) and
// the extent of every complete journal frame after it; `tail_begin` is where a torn tail (bytes
// that are no complete frame) begins, the file size when there is none.
struct Layout {
  uint64_t base_end = 0, tail_begin = 0;
  std::vector<std::pair<uint64_t, uint64_t>> base_frames, journal;  // [begin, end)
};

Layout layout_of(const std::vector<unsigned char>& f) {
  namespace fmt = kvsdk::format;
  Layout out;
  const uint64_t id = fmt::decode_file_header(f.data()).snapshot_id;
  uint64_t pos = fmt::kFileHeaderBytes;
  while (pos + fmt::kFrameHeaderBytes <= f.size()) {
    fmt::FrameHeader h;
    if (!fmt::decode_frame_header(&f[pos], id, &h)) {
      if (out.base_end == 0 && std::memcmp(&f[pos], fmt::kTrailerMagic, 8) == 0) {
        pos += fmt::kTrailerBytes;
        out.base_end = pos;
        continue;
      }
      break;
    }
    const uint64_t end = pos + fmt::kFrameHeaderBytes + h.payload_bytes;
    if (end > f.size()) break;
    (out.base_end ? out.journal : out.base_frames).push_back({pos, end});
    pos = end;
  }
  out.tail_begin = pos;
  return out;
}

// Deterministic offsets: `n` spread evenly over [0, size) with a jitter inside each stretch.
std::vector<uint64_t> spread(uint64_t size, uint64_t n, uint64_t salt) {
  std::vector<uint64_t> at;
  n = std::min(n, size);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t lo = i * size / n, hi = (i + 1) * size / n;
    const uint64_t jitter = ((i + salt) * 0x9e3779b97f4a7c15ull >> 33) % std::max<uint64_t>(1, hi - lo);
    at.push_back(lo + jitter);
  }
  return at;
}

std::vector<std::string> golden_files() {
  std::vector<std::string> names;
  DIR* d = opendir(KVSDK_GOLDEN_DIR);
  if (!d) return names;
  for (dirent* ent; (ent = readdir(d)) != nullptr;) {
    const std::string name = ent->d_name;
    if (name.size() > 7 && name.substr(name.size() - 7) == ".kvsnap") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Every golden file: single-byte flips (a changing bit mask, and 0xFF) at about 80 offsets spread
// over the file and at every record's magic, sizes, hash and payload ends; truncations at about 40
// spread offsets and around every record boundary. A copy damaged inside the base (file header,
// metadata and tier frames, index, trailer) must be refused with a status and a message, unless it
// loads exactly what the undamaged file holds. A copy damaged inside the journal may be refused
// too; if it loads, it holds exactly the state of the last complete delta before the damage (the
// torn-tail rule), with the journal frames of that state applied. A copy damaged inside a torn
// tail loads as the undamaged file. Nothing crashes, and no failed load leaves bytes charged.
TEST(GoldenMutation, EveryDamagedCopyIsRefusedOrLoadsWhatTheFileHolds) {
  const std::vector<std::string> files = golden_files();
  ASSERT_GE(files.size(), 4u + 8u + 12u + 1u + 12u + 3u + 3u);
  ASSERT_NE(std::find(files.begin(), files.end(), "v5_0_prefix_referenced.kvsnap"), files.end());
  size_t total = 0, refused = 0, refused_journal = 0, same_as_file = 0, journal_prefix = 0;
  for (const std::string& name : files) {
    SCOPED_TRACE(name);
    auto ctx = make_context(0, kGoldenBackend);
    const std::vector<unsigned char> f = file_bytes(golden_path(name.c_str()));
    ASSERT_GE(f.size(), 64u);
    // A file that references its shared prefix (format 5.0) loads only on it: every copy loads on
    // the prefix file, loaded and frozen (in the same context: its bytes stay charged).
    const V5Expected* v5 = v5_record(name);
    CachePtr on_prefix;
    if (v5 && v5->embed_prefix == 0) {
      on_prefix = v5_loaded_prefix(ctx.get());
      ASSERT_TRUE(on_prefix);
    }
    const uint64_t charged_before = used_bytes(ctx.get());
    auto load_any = [&](kvsdk_context* c, const std::vector<unsigned char>& bytes) {
      return load_any_in(c, bytes, on_prefix.get());
    };
    const Layout lay = layout_of(f);
    ASSERT_GT(lay.base_end, 0u) << "no trailer";
    ASSERT_FALSE(lay.base_frames.empty());

    // The undamaged file, and every journal prefix (the file cut after the base and after each
    // complete journal frame).
    const LoadResult whole = load_any(ctx.get(), f);
    ASSERT_EQ(whole.status, KVSDK_OK) << whole.error;
    std::vector<uint64_t> bounds = {lay.base_end};
    for (const auto& j : lay.journal) bounds.push_back(j.second);
    std::vector<LoadResult> prefix;
    for (const uint64_t b : bounds) {
      prefix.push_back(load_any(ctx.get(), std::vector<unsigned char>(f.begin(), f.begin() + long(b))));
      ASSERT_EQ(prefix.back().status, KVSDK_OK) << "cut at " << b << ": " << prefix.back().error;
    }
    // A torn tail is ignored: the file loads as its last complete frame's prefix.
    EXPECT_TRUE(prefix.back().content == whole.content);
    EXPECT_EQ(prefix.back().info.journal_frames_applied, whole.info.journal_frames_applied);
    // The prefix state a damage at `at` falls back to: that of the last boundary <= at.
    auto fallback = [&](uint64_t at) -> const LoadResult& {
      size_t i = 0;
      while (i + 1 < bounds.size() && bounds[i + 1] <= at) ++i;
      return prefix[i];
    };

    auto check = [&](const std::vector<unsigned char>& bad, uint64_t at, bool cut,
                     const std::string& what) {
      ++total;
      const LoadResult r = load_any(ctx.get(), bad);
      if (r.status != KVSDK_OK) {
        ++refused;
        refused_journal += at >= lay.base_end;
        EXPECT_FALSE(r.error.empty()) << what << ": refused without a message";
        // Inside the journal a cut is a torn tail, which loads by design.
        EXPECT_FALSE(cut && at >= lay.base_end)
            << what << ": a torn journal tail was refused: " << kvsdk_status_str(r.status) << " "
            << r.error;
        return;
      }
      if (r.content == whole.content &&
          r.info.journal_frames_applied == whole.info.journal_frames_applied &&
          (cut || at >= lay.tail_begin || at < lay.base_end)) {
        ++same_as_file;
        EXPECT_FALSE(cut && at < lay.base_end) << what << ": a cut base loaded";
        return;
      }
      ASSERT_GE(at, lay.base_end) << what << ": damage inside the base loaded different content";
      ASSERT_LT(at, lay.tail_begin) << what << ": damage in a torn tail changed what loads";
      // Damage in journal frame k: the state before frame k (a flip) or of the last complete
      // frame before the cut (a cut).
      uint64_t frame_begin = at;
      if (!cut) {
        for (const auto& j : lay.journal) {
          if (at >= j.first && at < j.second) frame_begin = j.first;
        }
      }
      const LoadResult& want = fallback(frame_begin);
      EXPECT_TRUE(r.content == want.content)
          << what << ": loads content that is neither the file's nor its journal prefix's";
      EXPECT_EQ(r.info.journal_frames_applied, want.info.journal_frames_applied) << what;
      EXPECT_EQ(r.info.format_major, whole.info.format_major) << what;
      EXPECT_EQ(r.info.format_minor, whole.info.format_minor) << what;
      ++journal_prefix;
    };

    // Offsets: spread over the file, plus every record's structure.
    std::vector<uint64_t> flips = spread(f.size(), 80, name.size());
    std::vector<uint64_t> cuts = spread(f.size(), 40, name.size() + 7);
    std::vector<std::pair<uint64_t, uint64_t>> records = lay.base_frames;
    records.insert(records.end(), lay.journal.begin(), lay.journal.end());
    records.push_back({0, kHeaderBytes});                                // file header
    records.push_back({lay.base_end - kHeaderBytes, lay.base_end});      // trailer
    for (const auto& r : records) {
      const uint64_t len = r.second - r.first;
      for (const uint64_t d : {uint64_t(0), uint64_t(5), uint64_t(8), uint64_t(9), uint64_t(13),
                               uint64_t(17), uint64_t(24), uint64_t(31)}) {
        if (d < len) flips.push_back(r.first + d);
      }
      if (len > kHeaderBytes) {
        for (const uint64_t at : {r.first + kHeaderBytes, r.first + kHeaderBytes + (len - kHeaderBytes) / 2, r.second - 1})
          flips.push_back(at);
      }
      for (const uint64_t d : {uint64_t(1), uint64_t(12), kHeaderBytes - 1, kHeaderBytes,
                               kHeaderBytes + 1, len / 2, len - 1}) {
        if (d < len) cuts.push_back(r.first + d);
      }
      cuts.push_back(r.first);
    }
    std::sort(flips.begin(), flips.end());
    flips.erase(std::unique(flips.begin(), flips.end()), flips.end());
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

    for (size_t i = 0; i < flips.size(); ++i) {
      const uint64_t at = flips[i];
      ASSERT_LT(at, f.size());
      const uint8_t mask = i % 3 == 2 ? uint8_t(0xFF) : uint8_t(1u << (i % 8));
      std::vector<unsigned char> bad = f;
      bad[at] ^= mask;
      check(bad, at, false,
            "byte " + std::to_string(at) + " ^= " + std::to_string(mask));
    }
    for (const uint64_t at : cuts) {
      if (at >= f.size()) continue;
      check(std::vector<unsigned char>(f.begin(), f.begin() + long(at)), at, true,
            "cut at " + std::to_string(at));
    }
    uint64_t used = 1;
    ASSERT_EQ(kvsdk_context_used_bytes(ctx.get(), &used), KVSDK_OK);
    EXPECT_EQ(used, charged_before) << "loads left bytes charged";
  }
  std::printf("mutation sweep: %zu files, %zu damaged copies: %zu refused (%zu of them damaged in "
              "the journal), %zu loaded as the file, %zu loaded a journal prefix\n",
              files.size(), total, refused, refused_journal, same_as_file, journal_prefix);
  EXPECT_GT(refused, total / 2);
}

// ------------------------------------------------------------------------------------------------
// Format 5.0 (the v5 script: a conversation on a shared prefix, embedding or referencing it)
// ------------------------------------------------------------------------------------------------

// The record and the files agree: the prefix file and one file per case, each as recorded (size,
// frames, container version), and no v5_0 file without a record.
TEST(GoldenV5, EveryFileOfTheScriptIsRecorded) {
  size_t n = 0;
  const V5Case* cases = v5_0_cases(&n);
  ASSERT_EQ(v5_0_expected().size(), n + 1);
  ASSERT_NE(v5_record(kV5PrefixFile), nullptr);
  EXPECT_EQ(v5_record(kV5PrefixFile)->embed_prefix, 2u);
  for (size_t i = 0; i < n; ++i) {
    const V5Expected* e = v5_record(cases[i].file);
    ASSERT_NE(e, nullptr) << cases[i].file;
    EXPECT_STREQ(e->preset, cases[i].preset);
    EXPECT_EQ(e->embed_prefix, cases[i].embed_prefix);
  }
  std::vector<std::string> recorded;
  for (const V5Expected& e : v5_0_expected()) {
    SCOPED_TRACE(e.file);
    recorded.push_back(e.file);
    const bool prefix_file = e.embed_prefix == 2;
    EXPECT_EQ(prefix_file, v5_case_of(e) == nullptr);
    if (prefix_file) EXPECT_STREQ(e.preset, kV5PrefixPreset);
    // The prefix alone is a plain 4.1 file; only conversations on a prefix are 5.0.
    EXPECT_EQ(e.format_major, prefix_file ? 4u : 5u);
    EXPECT_EQ(e.format_minor, prefix_file ? 1u : 0u);
    EXPECT_EQ(e.journal_frames_applied, prefix_file ? 0u : 1u);
    const std::vector<unsigned char> f = file_bytes(golden_path(e.file));
    ASSERT_EQ(f.size(), e.file_bytes) << "file changed without its record";
    ASSERT_EQ(std::memcmp(f.data(), "KVSDKSNP", 8), 0);
    EXPECT_EQ(header_u16(f, 8), e.format_major);
    EXPECT_EQ(header_u16(f, 10), e.format_minor);
    ASSERT_GE(e.frames.size(), 3u);
    uint64_t pos = kHeaderBytes;
    uint32_t journal = 0;
    for (const V2Frame& fr : e.frames) {
      if (fr.offset == e.base_end) pos += kHeaderBytes;  // the trailer before the journal
      EXPECT_EQ(fr.offset, pos);
      EXPECT_EQ(std::memcmp(&f[fr.offset], "KVFR", 4), 0) << "frame at " << fr.offset;
      EXPECT_EQ(fr.kind == kJournalFrame, fr.offset >= e.base_end);
      journal += fr.kind == kJournalFrame;
      pos = fr.offset + kHeaderBytes + fr.payload_bytes;
    }
    EXPECT_EQ(pos + (prefix_file ? kHeaderBytes : 0), e.file_bytes);
    EXPECT_EQ(journal, e.journal_frames_applied);
    EXPECT_EQ(std::memcmp(&f[e.base_end - kHeaderBytes], "KVSDKEND", 8), 0);
    if (prefix_file) EXPECT_EQ(e.base_end, e.file_bytes);
  }
  // Both conversation files hold the same conversation (the same rows and attention over the
  // prefix); the referencing one is smaller than the one embedding its prefix.
  const V5Expected* emb = v5_record("v5_0_prefix_embedded.kvsnap");
  const V5Expected* ref = v5_record("v5_0_prefix_referenced.kvsnap");
  ASSERT_TRUE(emb && ref);
  EXPECT_EQ(emb->embed_prefix, 1u);
  EXPECT_EQ(ref->embed_prefix, 0u);
  expect_state(ref->full, emb->full, "referenced vs embedded, whole");
  expect_state(ref->base, emb->base, "referenced vs embedded, base");
  EXPECT_EQ(ref->continuation, emb->continuation);
  EXPECT_LT(ref->file_bytes, emb->file_bytes);
  expect_every_file_recorded("v5_0_", recorded, "v5_0_expected.h");
}

// The prefix's own snapshot loads as a plain 4.1 cache (not frozen) with its recorded content,
// today's script rebuilds its rows, and it freezes.
TEST(GoldenV5, ThePrefixFileLoadsAsAPlainSnapshot) {
  const V5Expected* e = v5_record(kV5PrefixFile);
  ASSERT_NE(e, nullptr);
  auto ctx = make_context(0, kGoldenBackend);
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  const kvsdk_geometry want = v2_geometry();
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), golden_path(e->file).c_str(), &want, &info),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr c(raw);
  EXPECT_EQ(info.format_major, 4u);
  EXPECT_EQ(info.format_minor, 1u);
  EXPECT_EQ(info.journal_frames_applied, 0u);
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  expect_policy(c.get(), e->policy, e->preset);
  V2State got;
  ASSERT_EQ(v2_measure(c.get(), nullptr, &got), KVSDK_OK) << kvsdk_last_error();
  expect_state(got, e->full, "the prefix file");
  // Loaded, it is an open cache: it can be continued, and frozen.
  kvsdk_cache* on = nullptr;
  EXPECT_EQ(kvsdk_cache_create_on_prefix(&on, c.get(), nullptr), KVSDK_E_STATE) << "not frozen";
  ASSERT_EQ(kvsdk_cache_freeze(c.get()), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* rebuilt_raw = nullptr;
  ASSERT_EQ(v5_prefix(ctx.get(), &rebuilt_raw), KVSDK_OK) << kvsdk_last_error();
  CachePtr rebuilt(rebuilt_raw);
  EXPECT_EQ(rows_of(rebuilt.get()), recorded_rows(e->full));
}

// Checks a loaded v5 conversation (whole file or cut after its base) against its record.
void expect_v5_part(kvsdk_cache* c, const kvsdk_load_info& info, const V5Expected& e, bool whole) {
  EXPECT_EQ(info.format_major, 5u);
  EXPECT_EQ(info.format_minor, 0u);
  EXPECT_EQ(info.format_major, e.format_major);
  EXPECT_EQ(info.format_minor, e.format_minor);
  EXPECT_EQ(info.journal_frames_applied, whole ? e.journal_frames_applied : 0u);
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  expect_policy(c, e.policy, e.preset);
  V2State got;
  ASSERT_EQ(v2_measure(c, nullptr, &got), KVSDK_OK) << kvsdk_last_error();
  expect_state(got, whole ? e.full : e.base, whole ? "whole file" : "cut after the base");
}

// kV5ContinueSteps more steps on a loaded conversation: as the writer's own cache went on, and
// as a conversation rebuilt by today's script on `prefix`.
void expect_v5_continuation(kvsdk_cache* loaded, kvsdk_cache* prefix, const V5Expected& e) {
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(v5_conversation(prefix, e.preset, kV5EndSteps, &raw), KVSDK_OK) << kvsdk_last_error();
  CachePtr rebuilt(raw);
  EXPECT_EQ(rows_of(loaded), rows_of(rebuilt.get()));
  std::vector<float> a, b;
  ASSERT_EQ(v5_steps(e.preset, loaded, kV5EndSteps, kV5EndSteps + kV5ContinueSteps, &a), KVSDK_OK)
      << kvsdk_last_error();
  ASSERT_EQ(v5_steps(e.preset, rebuilt.get(), kV5EndSteps, kV5EndSteps + kV5ContinueSteps, &b),
            KVSDK_OK)
      << kvsdk_last_error();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "continuation outputs";
  EXPECT_EQ(rows_of(loaded), rows_of(rebuilt.get()));
  uint64_t digest = 0;
  ASSERT_EQ(v2_continuation_digest(loaded, a, &digest), KVSDK_OK);
  EXPECT_EQ(digest, e.continuation) << "continues differently from the writer's cache";
}

// The embedding file loads alone (kvsdk_cache_load, another context than the prefix's): the
// prefix comes back as a private frozen copy, charged with the conversation and released with it.
TEST(GoldenV5, TheEmbeddingFileLoadsAlone) {
  const V5Expected* e = v5_record("v5_0_prefix_embedded.kvsnap");
  ASSERT_NE(e, nullptr);
  auto ctx = make_context(0, kGoldenBackend);
  const kvsdk_geometry want = v2_geometry();
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), golden_path(e->file).c_str(), &want, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr c(raw);
  expect_v5_part(c.get(), info, *e, true);
  // The private prefix is charged: as much as the prefix file loaded alone.
  {
    auto other = make_context(0, kGoldenBackend);
    CachePtr p = v5_loaded_prefix(other.get(), false);
    ASSERT_TRUE(p);
    EXPECT_EQ(used_bytes(ctx.get()), own_bytes(c.get()) + own_bytes(p.get()));
  }
  c.reset();
  EXPECT_EQ(used_bytes(ctx.get()), 0u) << "the private prefix went with its conversation";

  const std::vector<unsigned char> f = file_bytes(golden_path(e->file));
  ASSERT_EQ(f.size(), e->file_bytes);
  CachePtr base;
  ASSERT_EQ(v5_load(ctx.get(), nullptr,
                    std::vector<unsigned char>(f.begin(), f.begin() + long(e->base_end)), &base,
                    &info),
            KVSDK_OK)
      << kvsdk_last_error();
  expect_v5_part(base.get(), info, *e, false);
  base.reset();

  // It continues like the writer's cache, and like a conversation rebuilt on the script's prefix.
  CachePtr loaded;
  ASSERT_EQ(v5_load(ctx.get(), nullptr, f, &loaded, &info), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* pr = nullptr;
  ASSERT_EQ(v5_prefix(ctx.get(), &pr), KVSDK_OK) << kvsdk_last_error();
  CachePtr prefix(pr);
  expect_v5_continuation(loaded.get(), prefix.get(), *e);
}

// The referencing file: kvsdk_cache_load refuses it (KVSDK_E_STATE, nothing charged, `out`
// untouched); kvsdk_cache_load_on_prefix refuses an unfrozen prefix and another prefix, and loads
// it on the prefix file (loaded, frozen) or on the prefix today's script builds, with the
// recorded content; only the conversation's own rows are charged.
TEST(GoldenV5, TheReferencingFileLoadsOnlyOnItsPrefix) {
  const V5Expected* e = v5_record("v5_0_prefix_referenced.kvsnap");
  ASSERT_NE(e, nullptr);
  const std::string path = golden_path(e->file);
  const std::vector<unsigned char> f = file_bytes(path);
  ASSERT_EQ(f.size(), e->file_bytes);
  auto ctx = make_context(0, kGoldenBackend);
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  EXPECT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), nullptr, &info), KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("kvsdk_cache_load_on_prefix"), std::string::npos)
      << kvsdk_last_error();
  EXPECT_EQ(raw, nullptr);
  EXPECT_EQ(info.format_major, 0u) << "info written on failure";
  CachePtr c;
  EXPECT_EQ(v5_load(ctx.get(), nullptr, f, &c, &info), KVSDK_E_STATE);
  EXPECT_EQ(v5_load(ctx.get(), nullptr,
                    std::vector<unsigned char>(f.begin(), f.begin() + long(e->base_end)), &c,
                    &info),
            KVSDK_E_STATE);
  EXPECT_EQ(used_bytes(ctx.get()), 0u);

  CachePtr open = v5_loaded_prefix(ctx.get(), false);
  ASSERT_TRUE(open);
  EXPECT_EQ(v5_load(ctx.get(), open.get(), f, &c, &info), KVSDK_E_STATE) << "not frozen";
  // Another frozen prefix (one more step of the script) is another content hash.
  kvsdk_cache* other_raw = nullptr;
  ASSERT_EQ(v2_build(v5_script(kV5PrefixPreset), ctx.get(), nullptr, kV5PrefixSteps + 1,
                     &other_raw),
            KVSDK_OK);
  CachePtr other(other_raw);
  ASSERT_EQ(kvsdk_cache_freeze(other.get()), KVSDK_OK);
  EXPECT_EQ(v5_load(ctx.get(), other.get(), f, &c, &info), KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("another shared prefix"), std::string::npos)
      << kvsdk_last_error();
  // The prefix file is a plain snapshot: it does not load on a prefix.
  ASSERT_EQ(kvsdk_cache_freeze(open.get()), KVSDK_OK);
  EXPECT_EQ(v5_load(ctx.get(), open.get(), file_bytes(golden_path(kV5PrefixFile)), &c, &info),
            KVSDK_E_STATE);

  const CachePtr& prefix = open;  // the prefix file, loaded and frozen
  const uint64_t before = used_bytes(ctx.get());
  raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load_on_prefix(&raw, prefix.get(), path.c_str(), &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  expect_v5_part(loaded.get(), info, *e, true);
  EXPECT_EQ(used_bytes(ctx.get()), before + own_bytes(loaded.get())) << "the prefix is charged once";
  loaded.reset();
  EXPECT_EQ(used_bytes(ctx.get()), before);

  CachePtr base;
  ASSERT_EQ(v5_load(ctx.get(), prefix.get(),
                    std::vector<unsigned char>(f.begin(), f.begin() + long(e->base_end)), &base,
                    &info),
            KVSDK_OK)
      << kvsdk_last_error();
  expect_v5_part(base.get(), info, *e, false);
  base.reset();

  // On the prefix today's script builds (the same content hash) it loads the same.
  kvsdk_cache* pr = nullptr;
  ASSERT_EQ(v5_prefix(ctx.get(), &pr), KVSDK_OK) << kvsdk_last_error();
  CachePtr scripted(pr);
  CachePtr on_scripted;
  ASSERT_EQ(v5_load(ctx.get(), scripted.get(), f, &on_scripted, &info), KVSDK_OK)
      << kvsdk_last_error();
  expect_v5_part(on_scripted.get(), info, *e, true);
  on_scripted.reset();

  ASSERT_EQ(v5_load(ctx.get(), prefix.get(), f, &loaded, &info), KVSDK_OK) << kvsdk_last_error();
  expect_v5_continuation(loaded.get(), prefix.get(), *e);
}

// Offsets of the PrefixRef of the metadata frame of a v5 file, changed through `change` in a copy
// whose every checksum is re-sealed (snapshot_mutation.h): only the reader's own checks see it.
std::vector<unsigned char> with_changed_prefix_ref(
    const std::vector<unsigned char>& f,
    const std::function<void(const kvsdk::fb::PrefixRef&)>& change, size_t* changed) {
  *changed = 0;
  return rewrite_snapshot(f, [&](MutableFrame& fr) {
    if (fr.kind == kvsdk::format::FrameKind::kMetadata && !fr.journal) {
      const kvsdk::fb::Metadata* m = fr.root()->payload_as_Metadata();
      if (m && m->prefix()) {
        change(*m->prefix());
        ++*changed;
      }
    }
    return true;
  });
}

// A damaged embedded prefix is refused with KVSDK_E_CORRUPT, never loaded wrongly, even when the
// outer file's checksums are valid: damage inside the embedded snapshot (its own container
// checks it), and a content hash that does not match the embedded prefix. In the referencing
// file a changed content hash names another prefix: refused with KVSDK_E_STATE.
TEST(GoldenV5, ADamagedEmbeddedPrefixIsRefusedNeverLoaded) {
  const V5Expected* emb = v5_record("v5_0_prefix_embedded.kvsnap");
  const V5Expected* ref = v5_record("v5_0_prefix_referenced.kvsnap");
  ASSERT_TRUE(emb && ref);
  auto ctx = make_context(0, kGoldenBackend);
  const std::vector<unsigned char> f = file_bytes(golden_path(emb->file));
  const std::vector<unsigned char> prefix_file = file_bytes(golden_path(kV5PrefixFile));
  // Re-sealed unchanged, the file loads as recorded (the harness itself changes nothing).
  size_t changed = 0;
  {
    const std::vector<unsigned char> same =
        with_changed_prefix_ref(f, [](const kvsdk::fb::PrefixRef& r) {
          ASSERT_NE(r.snapshot(), nullptr) << "no embedded prefix";
        }, &changed);
    ASSERT_EQ(changed, 1u);
    CachePtr c;
    kvsdk_load_info info{};
    ASSERT_EQ(v5_load(ctx.get(), nullptr, same, &c, &info), KVSDK_OK) << kvsdk_last_error();
    expect_v5_part(c.get(), info, *emb, true);
  }
  // The embedded snapshot is the prefix file's base, byte for byte (no journal).
  {
    const std::vector<unsigned char> same =
        with_changed_prefix_ref(f, [&](const kvsdk::fb::PrefixRef& r) {
          ASSERT_NE(r.snapshot(), nullptr);
          const std::vector<unsigned char> inner(r.snapshot()->begin(), r.snapshot()->end());
          EXPECT_EQ(inner.size(), prefix_file.size());
          EXPECT_EQ(std::memcmp(inner.data(), "KVSDKSNP", 8), 0);
          EXPECT_EQ(layout_of(inner).base_end, inner.size()) << "the embedded prefix has a journal";
        }, &changed);
  }
  // Damage inside the embedded snapshot: its header, every frame header and payload, its index,
  // its trailer.
  size_t inner_size = 0;
  with_changed_prefix_ref(f, [&](const kvsdk::fb::PrefixRef& r) { inner_size = r.snapshot()->size(); },
                          &changed);
  ASSERT_GT(inner_size, 64u);
  std::vector<uint64_t> offsets = spread(inner_size, 40, 3);
  for (const uint64_t d : {uint64_t(0), uint64_t(8), uint64_t(9), uint64_t(12), uint64_t(16),
                           uint64_t(31), uint64_t(32), uint64_t(40), uint64_t(45), uint64_t(60),
                           inner_size - 32, inner_size - 24, inner_size - 8, inner_size - 1}) {
    offsets.push_back(d);
  }
  size_t refused = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    const uint64_t at = offsets[i];
    const uint8_t mask = i % 2 ? uint8_t(0xFF) : uint8_t(1u << (i % 8));
    const std::vector<unsigned char> bad =
        with_changed_prefix_ref(f, [&](const kvsdk::fb::PrefixRef& r) {
          mutable_data(r.snapshot())[at] ^= mask;
        }, &changed);
    ASSERT_EQ(changed, 1u);
    CachePtr c;
    kvsdk_load_info info{};
    const kvsdk_status st = v5_load(ctx.get(), nullptr, bad, &c, &info);
    if (st == KVSDK_OK) {
      // Only acceptable when the damage changed nothing the prefix holds (e.g. the writer
      // version string of its metadata): exactly the recorded content.
      SCOPED_TRACE("embedded byte " + std::to_string(at) + " loaded");
      expect_v5_part(c.get(), info, *emb, true);
      continue;
    }
    ++refused;
    EXPECT_EQ(st, KVSDK_E_CORRUPT) << "embedded byte " << at << " ^= " << int(mask) << ": "
                                   << kvsdk_status_str(st) << " " << kvsdk_last_error();
  }
  EXPECT_GE(refused, offsets.size() - 2) << "damage to the embedded prefix was loaded";
  // The content hash no longer matches the embedded prefix.
  for (const int bit : {0, 17, 63}) {
    auto flip_hash = [&](const kvsdk::fb::PrefixRef& r) {
      const uint8_t* p = reinterpret_cast<const flatbuffers::Table&>(r).GetAddressOf(
          kvsdk::fb::PrefixRef::VT_CONTENT_HASH);
      ASSERT_NE(p, nullptr) << "no content hash";
      const_cast<uint8_t*>(p)[bit / 8] ^= uint8_t(1u << (bit % 8));
    };
    CachePtr c;
    kvsdk_load_info info{};
    EXPECT_EQ(v5_load(ctx.get(), nullptr, with_changed_prefix_ref(f, flip_hash, &changed), &c, &info),
              KVSDK_E_CORRUPT)
        << "hash bit " << bit << ": " << kvsdk_last_error();
    // The referencing file with another hash continues another prefix.
    CachePtr prefix = v5_loaded_prefix(ctx.get());
    const std::vector<unsigned char> rf = file_bytes(golden_path(ref->file));
    const std::vector<unsigned char> other = with_changed_prefix_ref(rf, flip_hash, &changed);
    ASSERT_EQ(changed, 1u);
    EXPECT_EQ(v5_load(ctx.get(), prefix.get(), other, &c, &info), KVSDK_E_STATE)
        << "hash bit " << bit << ": " << kvsdk_last_error();
    EXPECT_EQ(v5_load(ctx.get(), nullptr, other, &c, &info), KVSDK_E_STATE);
  }
  EXPECT_EQ(used_bytes(ctx.get()), 0u) << "failed loads left bytes charged";
}

// A 5.0 file whose embedded prefix snapshot claims a format newer than the file itself can only
// be damage (the 5.0 writer embeds the prefix's 4.x/1.x snapshot): it should be refused as
// KVSDK_E_CORRUPT ("a damaged embedded prefix is corrupt"), not as KVSDK_E_VERSION ("upgrade
// kvsdk"), which an application may act on by upgrading or falling back.
TEST(GoldenV5, AnEmbeddedPrefixOfAnotherFormatIsCorrupt) {
  auto ctx = make_context(0, kGoldenBackend);
  const std::vector<unsigned char> f = file_bytes(golden_path("v5_0_prefix_embedded.kvsnap"));
  size_t changed = 0;
  const std::vector<unsigned char> bad =
      with_changed_prefix_ref(f, [](const kvsdk::fb::PrefixRef& r) {
        mutable_data(r.snapshot())[8] = 6;  // embedded snapshot format 6.1 inside a 5.0 file
      }, &changed);
  ASSERT_EQ(changed, 1u);
  CachePtr c;
  kvsdk_load_info info{};
  EXPECT_EQ(v5_load(ctx.get(), nullptr, bad, &c, &info), KVSDK_E_CORRUPT) << kvsdk_last_error();
}

}  // namespace
