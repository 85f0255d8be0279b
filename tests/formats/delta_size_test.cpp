// Journal deltas stay small for every preset (format 3.1: compressed stores field by field,
// sliding observation windows, H2O scores as differences): one token appended to every layer of
// a 320-token cache costs at most 2% of the preset's full snapshot, for every preset (issue 14);
// the same step with one observed query per layer stays within the bound observe_bound() gives;
// a conversation saved as 20 deltas stays within 1.5x a fresh full save (compaction,
// max_journal_percent); and all of them load back to the same cache.
#include <gtest/gtest.h>

#include <cstdio>

#include <string>
#include <vector>

#include "kvsdk.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// Every preset family with its library defaults (KIVI: G = 32, R = 128), budget unlimited.
const char* const kPresets[] = {"full",      "streaming_llm", "h2o",          "snapkv",
                                "pyramidkv", "xkv",           "kivi",         "kivi+kivi4",
                                "xkv+kivi2", "snapkv+kivi2",  "h2o+kivi4",    "spindlekv",
                                "minicache", "minicache+kivi4", "smallkv",    "specache",
                                "specache+kivi1"};

kvsdk_geometry geometry() { return make_geometry(4, 8, 2, 64); }

// Appends `n` tokens to every layer and, with `observe`, observes one query per layer (H2O
// accumulates it into every row's score, window methods keep it).
void step(kvsdk_cache* c, const kvsdk_geometry& g, size_t n, int32_t pos0, uint32_t seed,
          bool observe = true) {
  fill(c, g, n, pos0, seed);
  for (uint32_t l = 0; observe && l < g.n_layers; ++l) {
    const size_t elems = size_t(g.n_q_heads) * g.head_dim;
    auto q = random_floats(elems, seed * 7 + l);
    const int32_t qp = pos0 + int32_t(n) - 1;
    ASSERT_EQ(kvsdk_cache_observe(c, l, 1, q.data(), &qp, elems * 4), KVSDK_OK) << kvsdk_last_error();
  }
}

uint64_t file_size(const std::string& path) { return read_file(path).size(); }

class DeltaSize : public ::testing::TestWithParam<const char*> {
 protected:
  CachePtr filled(kvsdk_context* ctx, size_t tokens) {
    kvsdk_policy p;
    EXPECT_EQ(kvsdk_policy_parse(&p, GetParam()), KVSDK_OK);
    auto c = make_cache(ctx, g_, &p);
    EXPECT_TRUE(c) << kvsdk_last_error();
    for (size_t t = 0; c && t < tokens; t += 16) step(c.get(), g_, 16, int32_t(t), uint32_t(1 + t));
    return c;
  }
  void expect_loads_as(kvsdk_context* ctx, const std::string& path, kvsdk_cache* want) {
    kvsdk_cache* raw = nullptr;
    ASSERT_EQ(kvsdk_cache_load(&raw, ctx, path.c_str(), &g_, nullptr), KVSDK_OK) << kvsdk_last_error();
    CachePtr got(raw);
    EXPECT_TRUE(dump(got.get()) == dump(want));
    EXPECT_EQ(save_buffer(got.get()), save_buffer(want));  // every state, not only the rows
  }

  // Saves the cache of 320 tokens per layer in full, takes one step (one token appended to every
  // layer, with or without one observed query per layer), saves a delta and checks it against
  // `share` of the full snapshot; the file then loads as the cache.
  void expect_one_step_within(bool observe, double share) {
    TempDir dir;
    auto ctx = make_context();
    auto a = filled(ctx.get(), 320);
    ASSERT_TRUE(a);
    const std::string path = dir.file("d.kvsnap");
    ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
    const uint64_t full = file_size(path);
    step(a.get(), g_, 1, 320, 99, observe);
    ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
    const uint64_t delta = file_size(path) - full;
    EXPECT_LE(double(delta), share * double(full))
        << GetParam() << (observe ? " (append + observe)" : " (append)") << ": delta " << delta
        << " bytes, full snapshot " << full;
    // The figures of docs/benchmarks.md ("Journal delta size per preset").
    std::printf("delta size: %-16s %-16s full %8llu delta %6llu (%.2f%%)\n", GetParam(),
                observe ? "append+observe" : "append", static_cast<unsigned long long>(full),
                static_cast<unsigned long long>(delta), 100.0 * double(delta) / double(full));
    expect_loads_as(ctx.get(), path, a.get());
  }
  kvsdk_geometry g_ = geometry();
};

// Issue 14's acceptance, as worded: one appended token per layer costs at most 2% of the full
// snapshot, for every preset, no exceptions.
TEST_P(DeltaSize, OneAppendedTokenCostsAtMostTwoPercentOfAFullSnapshot) {
  expect_one_step_within(false, 0.02);
}

// The same step plus one observed query per layer. Where that stays above 2%, the bytes are new
// data that no lossless encoding removes (measured on this cache, zstd level 3; docs/
// benchmarks.md, 2026-11-24):
//  - snapkv/xkv+kivi2: the window keeps the new f32 query, 4 layers x 8 q-heads x 64 x 4 =
//    8192 bytes of fresh values (7600 bytes after zstd, 7532 with byte-shuffled planes: no format
//    change is worth 1%), next to 2048 bytes of new f16 K/V rows in the KIVI residual; the full
//    snapshot is only 474.7 KB (2-bit codes), so 2% is 9495 bytes: 2.30%.
//  - h2o+kivi4: every observe adds an attention probability to each of the 2568 rows' f32
//    scores; as differences (format 3.1) they take 7594 bytes after zstd instead of 9290, but
//    each still carries ~19 significant bits of new information: 2.86% of a 383.8 KB snapshot.
// Every other preset stays within 2% with the observe too.
double observe_bound(const std::string& preset) {
  if (preset == "xkv+kivi2" || preset == "snapkv+kivi2") return 0.024;
  if (preset == "h2o+kivi4") return 0.030;
  return 0.02;
}

TEST_P(DeltaSize, OneAppendedTokenAndObservedQueryStayWithinTheirBound) {
  expect_one_step_within(true, observe_bound(GetParam()));
}

TEST_P(DeltaSize, TwentyDeltasStayWithinOneAndAHalfFullSaves) {
  TempDir dir;
  auto ctx = make_context();
  auto a = filled(ctx.get(), 64);
  ASSERT_TRUE(a);
  const std::string path = dir.file("c.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  kvsdk_save_options fold;  // as kvsdk-chat saves: the journal is folded past half the base
  kvsdk_save_options_init(&fold);
  fold.max_journal_percent = 50;
  for (int turn = 0; turn < 20; ++turn) {  // a chat turn: a few dozen tokens each
    step(a.get(), g_, 24, int32_t(64 + 24 * turn), uint32_t(500 + turn));
    ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), &fold), KVSDK_OK) << kvsdk_last_error();
  }
  const uint64_t journaled = file_size(path);
  const uint64_t fresh = save_buffer(a.get()).size();
  EXPECT_LE(double(journaled), 1.5 * double(fresh)) << GetParam() << ": file " << journaled
                                                    << " bytes, fresh full save " << fresh;
  expect_loads_as(ctx.get(), path, a.get());
}

INSTANTIATE_TEST_SUITE_P(Presets, DeltaSize, ::testing::ValuesIn(kPresets),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& ch : s) {
                             if (ch == '+') ch = '_';
                           }
                           return s;
                         });

}  // namespace
