// Golden snapshots: files written by an earlier kvsdk (tests/golden/*.kvsnap, made once by
// make_golden.cpp) must load with exactly the rows they were saved with, forever.
//   v1_0_*: exact caches (format 1.0), checked row by row against golden_content.h's formulas.
//   v2_0_*: caches with compressed tiers (format 2.0), checked against what the generator
//           measured when it wrote them (v2_0_expected.h), continued next to a cache rebuilt by
//           the same script, and damaged (a flipped byte in every frame, cuts inside the base).
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/half.h"
#include "golden_content.h"
#include "kvsdk.h"
#include "test_util.h"
#include "v2_0_expected.h"

using namespace kvsdk_golden;
using namespace kvsdk_test;

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
    auto ctx = make_context();
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

const V2Case* case_of(const V2Expected& e) {
  size_t n = 0;
  const V2Case* cases = v2_cases(&n);
  for (size_t i = 0; i < n; ++i) {
    if (std::string(cases[i].file) == e.file) return &cases[i];
  }
  return nullptr;
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
  DIR* d = opendir(KVSDK_GOLDEN_DIR);
  ASSERT_NE(d, nullptr);
  for (dirent* ent; (ent = readdir(d)) != nullptr;) {
    const std::string name = ent->d_name;
    if (name.rfind("v2_0_", 0) == 0 && name.size() > 7 && name.substr(name.size() - 7) == ".kvsnap") {
      EXPECT_NE(std::find(recorded.begin(), recorded.end(), name), recorded.end())
          << name << " has no record in v2_0_expected.h";
    }
  }
  closedir(d);
}

// Every v2_0 file loads as format 2.0 with its journal, its policy, and exactly the rows and
// attention recorded when it was written.
TEST(GoldenV2, EveryFileLoadsWithItsRecordedContent) {
  for (const V2Expected& e : v2_expected()) {
    SCOPED_TRACE(e.file);
    const V2Case* cs = case_of(e);
    ASSERT_NE(cs, nullptr);
    auto ctx = make_context();
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

    kvsdk_policy p;
    kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
    ASSERT_EQ(kvsdk_cache_policy(c.get(), &p), KVSDK_OK);
    const V2Policy& w = e.policy;
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
    // The preset spec names the same method and KIVI bits.
    kvsdk_policy parsed;
    ASSERT_EQ(kvsdk_policy_parse(&parsed, e.preset), KVSDK_OK);
    EXPECT_EQ(p.method, parsed.method);
    EXPECT_EQ(p.quant_bits, parsed.quant_bits);

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
    auto ctx = make_context();
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
    auto ctx = make_context();
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
    auto ctx = make_context();
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

}  // namespace
