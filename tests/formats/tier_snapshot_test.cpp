// Snapshots of caches with compressed tiers (format 2: TierChunk.tiers, journal tier layers):
// every preset that holds a representation resumes bit-identically from a file, a buffer and a
// journal, writes deterministic bytes, and rejects damaged files without crashing.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// Presets with compressed tiers. Small KIVI groups and residual so that a few hundred tokens
// already fill quantized blocks; the other parameters are the presets' defaults.
const char* const kPresets[] = {"kivi",      "kivi+kivi1",      "kivi+kivi4", "kivi+kivi8",
                                "minicache", "minicache+kivi4", "spindlekv", "smallkv",
                                "xkv+kivi2", "snapkv+kivi2",    "h2o+kivi4",  "specache",
                                "specache+kivi1"};

// With SpeCache's backing store, so that a resumed cache fetches the same full-precision rows.
const kvsdk_save_options* with_backing() {
  static kvsdk_save_options o = [] {
    kvsdk_save_options x;
    kvsdk_save_options_init(&x);
    x.include_backing = 1;
    return x;
  }();
  return &o;
}

kvsdk_policy preset(const std::string& spec) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec.c_str()), KVSDK_OK) << kvsdk_last_error();
  p.quant_group = 8;
  p.quant_residual = 16;
  return p;
}

kvsdk_geometry geometry() { return make_geometry(4, 8, 2, 32); }

// Appends `n` tokens to every layer (in layer order, as a model does) and attends 2 queries per
// layer; returns every output byte.
std::vector<unsigned char> step(kvsdk_cache* c, const kvsdk_geometry& g, size_t n, int32_t pos0,
                                uint32_t seed) {
  std::vector<unsigned char> all;
  fill(c, g, n, pos0, seed);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const size_t nq = 2, elems = nq * g.n_q_heads * g.head_dim;
    auto q = random_floats(elems, seed * 7 + l);
    auto qp = iota_positions(nq, pos0 + int32_t(n) - 2);
    std::vector<float> out(elems);
    // Observed queries: window methods (SpindleKV's deep layers, overlays) save their window.
    EXPECT_EQ(kvsdk_cache_observe(c, l, nq, q.data(), qp.data(), elems * 4), KVSDK_OK)
        << kvsdk_last_error();
    EXPECT_EQ(kvsdk_cache_attend(c, l, nq, q.data(), qp.data(), elems * 4, out.data(), elems * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    const auto* b = reinterpret_cast<const unsigned char*>(out.data());
    all.insert(all.end(), b, b + elems * 4);
  }
  return all;
}

class TierSnapshot : public ::testing::TestWithParam<const char*> {
 protected:
  CachePtr filled(kvsdk_context* ctx, size_t tokens) {
    const kvsdk_policy p = preset(GetParam());
    auto c = make_cache(ctx, g_, &p);
    EXPECT_TRUE(c) << kvsdk_last_error();
    if (c) step(c.get(), g_, tokens, 0, 1);
    return c;
  }
  kvsdk_geometry g_ = geometry();
};

TEST_P(TierSnapshot, FileRoundTripResumesBitIdentically) {
  TempDir dir;
  auto ctx = make_context();
  auto a = filled(ctx.get(), 77);
  ASSERT_TRUE(a);
  const std::string path = dir.file("a.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), with_backing()), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g_, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(raw);
  // The typed format 4.1 (5.0 is for conversations on a shared prefix only), or 6.0 for presets
  // that keep some layers as exact rows (MiniCache's first layers, SpindleKV's exact layers),
  // which may be byte-shuffled.
  const std::string name = GetParam();
  const bool exact_layers =
      name == "minicache" || name == "minicache+kivi4" || name == "spindlekv";
  EXPECT_EQ(info.format_major, exact_layers ? 6u : 4u);
  EXPECT_EQ(info.format_minor, exact_layers ? 0u : 1u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  kvsdk_cache_stats sa{}, sb{};
  sa.struct_size = sb.struct_size = sizeof sa;
  ASSERT_EQ(kvsdk_cache_stats_get(a.get(), &sa), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_stats_get(b.get(), &sb), KVSDK_OK);
  for (int t = 0; t < KVSDK_TIER_SLOTS; ++t) EXPECT_EQ(sa.bytes_by_tier[t], sb.bytes_by_tier[t]);
  EXPECT_EQ(sa.backing_bytes, sb.backing_bytes);
  // Both continue with the same bits: further appends, flushes and attention.
  for (int s = 0; s < 4; ++s) {
    const int32_t pos = 77 + s * 13;
    EXPECT_EQ(step(a.get(), g_, 13, pos, 10 + s), step(b.get(), g_, 13, pos, 10 + s));
  }
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST_P(TierSnapshot, EqualCachesGiveByteIdenticalSnapshots) {
  auto ctx = make_context();
  auto a = filled(ctx.get(), 60);
  auto b = filled(ctx.get(), 60);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(save_buffer(a.get(), with_backing()), save_buffer(b.get(), with_backing()));
  step(b.get(), g_, 1, 60, 3);
  EXPECT_NE(save_buffer(a.get(), with_backing()), save_buffer(b.get(), with_backing()));
}

TEST_P(TierSnapshot, JournalDeltasReplayCompressedLayers) {
  TempDir dir;
  auto ctx = make_context();
  auto a = filled(ctx.get(), 40);
  ASSERT_TRUE(a);
  const std::string path = dir.file("j.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), with_backing()), KVSDK_OK) << kvsdk_last_error();
  for (int s = 0; s < 3; ++s) {
    step(a.get(), g_, 11, 40 + s * 11, 20 + s);
    ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), with_backing()), KVSDK_OK)
        << kvsdk_last_error();
  }
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g_, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(raw);
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  EXPECT_GE(info.journal_frames_applied, 3u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  EXPECT_EQ(step(a.get(), g_, 5, 73, 40), step(b.get(), g_, 5, 73, 40));
  // A torn tail (the last delta cut in half) loses only that delta.
  auto bytes = read_file(path);
  write_file(path, std::vector<unsigned char>(bytes.begin(), bytes.end() - 9));
  raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g_, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr c(raw);
  EXPECT_GE(info.journal_frames_dropped, 1u);
}

TEST_P(TierSnapshot, DamagedFilesAreRejectedNotTrusted) {
  auto ctx = make_context();
  auto a = filled(ctx.get(), 50);
  ASSERT_TRUE(a);
  const std::vector<unsigned char> good = save_buffer(a.get(), with_backing());
  std::mt19937 rng(7);
  for (int i = 0; i < 60; ++i) {
    std::vector<unsigned char> bad = good;
    if (i % 2 == 0) {
      bad.resize(std::uniform_int_distribution<size_t>(0, good.size() - 1)(rng));
    } else {
      const size_t at = std::uniform_int_distribution<size_t>(0, good.size() - 1)(rng);
      bad[at] ^= uint8_t(1u << (i % 8));
    }
    kvsdk_status st = KVSDK_OK;
    auto c = load_buffer(ctx.get(), bad, &st);
    EXPECT_NE(st, KVSDK_OK) << "damage " << i << " was accepted";
    EXPECT_FALSE(c);
  }
  // Nothing was charged by the failed loads.
  uint64_t used = 0;
  ASSERT_EQ(kvsdk_context_used_bytes(ctx.get(), &used), KVSDK_OK);
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(kvsdk_cache_stats_get(a.get(), &s), KVSDK_OK);
  EXPECT_EQ(used, s.bytes);
}

TEST_P(TierSnapshot, LoadIntoATooSmallBudgetFailsCleanly) {
  auto ctx = make_context();
  auto a = filled(ctx.get(), 50);
  ASSERT_TRUE(a);
  const std::vector<unsigned char> buf = save_buffer(a.get(), with_backing());
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(kvsdk_cache_stats_get(a.get(), &s), KVSDK_OK);
  auto small = make_context(s.bytes - 1);
  kvsdk_status st = KVSDK_OK;
  auto c = load_buffer(small.get(), buf, &st);
  EXPECT_EQ(st, KVSDK_E_BUDGET);
  uint64_t used = 1;
  ASSERT_EQ(kvsdk_context_used_bytes(small.get(), &used), KVSDK_OK);
  EXPECT_EQ(used, 0u);
}

TEST(TierSnapshotSpeCache, WithoutBackingTheFileIsSmallerAndStillLoads) {
  auto ctx = make_context();
  const kvsdk_geometry g = geometry();
  const kvsdk_policy p = preset("specache");
  auto a = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(a) << kvsdk_last_error();
  step(a.get(), g, 70, 0, 1);
  const std::vector<unsigned char> with = save_buffer(a.get(), with_backing());
  kvsdk_save_options no_backing;
  kvsdk_save_options_init(&no_backing);
  no_backing.include_backing = 0;
  const std::vector<unsigned char> without = save_buffer(a.get(), &no_backing);
  EXPECT_EQ(save_buffer(a.get()), with);  // the default includes it
  EXPECT_LT(without.size(), with.size());
  kvsdk_status st = KVSDK_E_INTERNAL;
  auto b = load_buffer(ctx.get(), without, &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  // Same low-bit rows (read back), backing rebuilt from them (reported, off budget).
  EXPECT_TRUE(dump(a.get()).k == dump(b.get()).k);
  kvsdk_cache_stats sb{};
  sb.struct_size = sizeof sb;
  ASSERT_EQ(kvsdk_cache_stats_get(b.get(), &sb), KVSDK_OK);
  EXPECT_GT(sb.backing_bytes, 0u);
  EXPECT_EQ(step(b.get(), g, 3, 70, 9).size(), step(a.get(), g, 3, 70, 9).size());
}

INSTANTIATE_TEST_SUITE_P(Presets, TierSnapshot, ::testing::ValuesIn(kPresets),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& ch : s) {
                             if (ch == '+') ch = '_';
                           }
                           return s;
                         });

}  // namespace
