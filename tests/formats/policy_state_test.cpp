// Snapshots of every eviction preset: the policy state (H2O scores, observation windows,
// per-cache budget, fixed allocation, profile shares, last allocation) round-trips through full
// snapshots and journal deltas, and a resumed cache continues bit-identically under random
// append/observe/compress/attend sequences. Corrupt policy state is rejected.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/policy.h"
#include "kvsdk.h"
#include "policy_state.h"
#include "snapshot_test_util.h"
#include "test_util.h"
#include "util/error.h"

using namespace kvsdk_test;

namespace {

const char* const kPresets[] = {"full", "streaming_llm", "h2o", "snapkv", "pyramidkv", "xkv"};
const kvsdk_geometry kG = make_geometry(3, 4, 2, 8);

// A reproducible random workload step (seeded per step, so two caches can be driven alike).
// Returns the attend output of the step (empty for other operations).
std::vector<float> step(kvsdk_cache* c, uint32_t seed, std::vector<int32_t>& next_pos,
                        bool allow_compress) {
  std::mt19937 rng(seed);
  const uint32_t layer = rng() % kG.n_layers;
  const int kind = rng() % 4;
  if (kind == 0) {
    const size_t n = 1 + rng() % 12;
    auto k = random_floats(n * 16, rng()), v = random_floats(n * 16, rng());
    auto pos = iota_positions(n, next_pos[layer]);
    EXPECT_EQ(kvsdk_cache_append(c, layer, n, k.data(), v.data(), pos.data(), n * 64), KVSDK_OK)
        << kvsdk_last_error();
    next_pos[layer] += int32_t(n);
  } else if (kind == 1) {
    const size_t n = 1 + rng() % 4;
    auto q = random_floats(n * 32, rng(), 2.0f);
    auto qp = iota_positions(n, std::max(0, next_pos[layer] - int32_t(n)));
    EXPECT_EQ(kvsdk_cache_observe(c, layer, n, q.data(), qp.data(), n * 128), KVSDK_OK)
        << kvsdk_last_error();
  } else if (kind == 2 && allow_compress) {
    EXPECT_EQ(kvsdk_cache_compress(c), KVSDK_OK) << kvsdk_last_error();
  } else {
    auto q = random_floats(2 * 32, rng());
    std::vector<float> out(2 * 32);
    EXPECT_EQ(kvsdk_cache_attend(c, layer, 2, q.data(), nullptr, 256, out.data(), 256), KVSDK_OK);
    return out;
  }
  return {};
}

std::vector<uint64_t> allocation(kvsdk_cache* c) {
  std::vector<uint64_t> a(kG.n_layers);
  EXPECT_EQ(kvsdk_cache_allocation(c, a.data(), kG.n_layers), KVSDK_OK);
  return a;
}

// Builds a cache of `preset` with some history, a per-cache budget and, for some presets, a
// fixed allocation or a profile, so that every piece of policy state is non-trivial.
CachePtr make_busy_cache(kvsdk_context* ctx, const char* preset, std::vector<int32_t>& next_pos) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, preset), KVSDK_OK);
  p.obs_window = 6;
  CachePtr c = make_cache(ctx, kG, &p);
  EXPECT_TRUE(c);
  for (uint32_t s = 0; s < 40; ++s) step(c.get(), 1000 + s, next_pos, std::string(preset) != "full");
  if (std::string(preset) != "full") {
    kvsdk_cache_stats st;
    st.struct_size = sizeof(st);
    kvsdk_cache_stats_get(c.get(), &st);
    EXPECT_EQ(kvsdk_cache_set_budget(c.get(), st.bytes * 3 / 4), KVSDK_OK) << kvsdk_last_error();
  }
  if (std::string(preset) == "pyramidkv") {
    kvsdk_profile* prof = nullptr;
    kvsdk_profile_create(&prof, kG.n_layers);
    const uint64_t sample[3] = {5, 3, 2};
    kvsdk_profile_record(prof, sample, 3);
    EXPECT_EQ(kvsdk_cache_apply_profile(c.get(), prof), KVSDK_OK) << kvsdk_last_error();
    kvsdk_profile_destroy(prof);
  }
  if (std::string(preset) == "xkv") {
    std::vector<uint64_t> a = allocation(c.get());
    a[0] = a[0] > 2 ? a[0] - 2 : 0;
    EXPECT_EQ(kvsdk_cache_set_allocation(c.get(), a.data(), kG.n_layers), KVSDK_OK)
        << kvsdk_last_error();
  }
  return c;
}

void expect_same(kvsdk_cache* a, kvsdk_cache* b) {
  ASSERT_TRUE(dump(a) == dump(b));
  EXPECT_EQ(allocation(a), allocation(b));
  uint64_t ca = 0, cb = 0, ua = 0, ub = 0;
  kvsdk_cache_token_capacity(a, &ca, &ua);
  kvsdk_cache_token_capacity(b, &cb, &ub);
  EXPECT_EQ(ca, cb);
  EXPECT_EQ(ua, ub);
}

// Drives both caches with the same steps; every output and the whole content stay identical.
void continue_alike(kvsdk_cache* a, kvsdk_cache* b, std::vector<int32_t> pos) {
  std::vector<int32_t> pos_b = pos;
  for (uint32_t s = 0; s < 60; ++s) {
    const auto oa = step(a, 5000 + s, pos, true);
    const auto ob = step(b, 5000 + s, pos_b, true);
    ASSERT_EQ(oa, ob) << "step " << s;  // bit-identical attention
    ASSERT_NO_FATAL_FAILURE(expect_same(a, b));
  }
}

TEST(PolicyStateSnapshot, EveryPresetResumesBitIdentically) {
  for (const char* preset : kPresets) {
    SCOPED_TRACE(preset);
    auto ctx = make_context(0);
    std::vector<int32_t> pos(kG.n_layers, 0);
    CachePtr a = make_busy_cache(ctx.get(), preset, pos);
    const auto buf = save_buffer(a.get());
    kvsdk_status st = KVSDK_OK;
    CachePtr b = load_buffer(ctx.get(), buf, &st);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    ASSERT_NO_FATAL_FAILURE(expect_same(a.get(), b.get()));
    continue_alike(a.get(), b.get(), pos);
  }
}

TEST(PolicyStateSnapshot, JournalDeltasCarryThePolicyState) {
  for (const char* preset : kPresets) {
    SCOPED_TRACE(preset);
    TempDir dir;
    const std::string path = dir.file("cache.kvsnap");
    auto ctx = make_context(0);
    std::vector<int32_t> pos(kG.n_layers, 0);
    CachePtr a = make_busy_cache(ctx.get(), preset, pos);
    ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
    for (int d = 0; d < 3; ++d) {
      for (uint32_t s = 0; s < 15; ++s) step(a.get(), 9000 + 100 * d + s, pos, true);
      ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
          << kvsdk_last_error();
    }
    kvsdk_cache* raw = nullptr;
    ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), nullptr, nullptr), KVSDK_OK)
        << kvsdk_last_error();
    CachePtr b(raw);
    ASSERT_NO_FATAL_FAILURE(expect_same(a.get(), b.get()));
    continue_alike(a.get(), b.get(), pos);
  }
}

// h2o+kiviN files are format 3.1: their deltas give H2O scores as differences against the scores
// of the same rows before (rows evicted in between, new rows against 0); every delta replays to
// the same scores, bit for bit (a full save holds them: equal buffers), and the resumed cache
// continues alike.
TEST(PolicyStateSnapshot, ScoreDifferencesReplayThroughEviction) {
  TempDir dir;
  const std::string path = dir.file("h2o.kvsnap");
  auto ctx = make_context(0);
  std::vector<int32_t> pos(kG.n_layers, 0);
  CachePtr a = make_busy_cache(ctx.get(), "h2o+kivi4", pos);
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  uint64_t appended = 0;
  for (int d = 0; d < 4; ++d) {
    for (uint32_t s = 0; s < 15; ++s) step(a.get(), 7000 + 100 * d + s, pos, true);
    ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
  }
  for (int32_t p : pos) appended += uint64_t(p) * kG.n_kv_heads;
  kvsdk_cache_stats st;
  st.struct_size = sizeof st;
  ASSERT_EQ(kvsdk_cache_stats_get(a.get(), &st), KVSDK_OK);
  EXPECT_LT(st.tokens, appended);  // rows were evicted between the deltas
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info;
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), nullptr, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(raw);
  EXPECT_EQ(info.format_major, 4u);  // score differences in deltas: 3.1 and every later format
  EXPECT_EQ(info.format_minor, 1u);
  EXPECT_EQ(info.journal_frames_applied, 4u);
  EXPECT_EQ(save_buffer(a.get()), save_buffer(b.get()));  // every score, bit for bit
  continue_alike(a.get(), b.get(), pos);
}

TEST(PolicyStateSnapshot, LoadedCacheIsChargedItsPolicyBytes) {
  auto ctx = make_context(0);
  std::vector<int32_t> pos(kG.n_layers, 0);
  CachePtr a = make_busy_cache(ctx.get(), "h2o", pos);
  const auto buf = save_buffer(a.get());
  auto ctx2 = make_context(0);
  CachePtr b = load_buffer(ctx2.get(), buf);
  ASSERT_TRUE(b);
  kvsdk_cache_stats sa, sb;
  sa.struct_size = sb.struct_size = sizeof(sa);
  kvsdk_cache_stats_get(a.get(), &sa);
  kvsdk_cache_stats_get(b.get(), &sb);
  EXPECT_EQ(sa.bytes_by_tier[KVSDK_TIER_METADATA], sb.bytes_by_tier[KVSDK_TIER_METADATA]);
  uint64_t used = 0;
  kvsdk_context_used_bytes(ctx2.get(), &used);
  EXPECT_EQ(used, sb.bytes);
}

// Inconsistent policy state (forged with valid checksums) is rejected as corrupt.
TEST(PolicyStateSnapshot, InconsistentStateIsCorrupt) {
  const kvsdk::Geometry g = kvsdk::Geometry::from_c(&kG);
  const std::vector<std::vector<uint64_t>> rows(3, std::vector<uint64_t>(2, 4));
  auto expect_corrupt = [&](kvsdk_method method, auto build) {
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(build(fbb));
    const auto* st = flatbuffers::GetRoot<kvsdk::fb::PolicyState>(fbb.GetBufferPointer());
    std::vector<kvsdk::LayerState> layers(3);
    kvsdk::PolicyRuntime rt;
    try {
      kvsdk::format::read_policy_state(st, g, kvsdk::policy_defaults(method), rows, layers, rt);
      ADD_FAILURE() << "accepted";
    } catch (const kvsdk::Error& e) {
      EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << e.what();
    }
  };
  namespace fb = kvsdk::fb;
  auto layer_with_scores = [](flatbuffers::FlatBufferBuilder& fbb, size_t n) {
    std::vector<flatbuffers::Offset<fb::HeadScores>> hs;
    for (int h = 0; h < 2; ++h) hs.push_back(fb::CreateHeadScores(fbb, fbb.CreateVector(std::vector<float>(n, 1.0f))));
    return fb::CreateLayerPolicyState(fbb, fbb.CreateVector(hs));
  };
  // Score count differs from the rows.
  expect_corrupt(KVSDK_METHOD_H2O, [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls;
    for (int l = 0; l < 3; ++l) ls.push_back(layer_with_scores(fbb, l == 1 ? 3 : 4));
    return fb::CreatePolicyState(fbb, 0, 0, 0, 0, fbb.CreateVector(ls));
  });
  // Scores for a policy that has none.
  expect_corrupt(KVSDK_METHOD_SNAPKV, [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls;
    for (int l = 0; l < 3; ++l) ls.push_back(layer_with_scores(fbb, 4));
    return fb::CreatePolicyState(fbb, 0, 0, 0, 0, fbb.CreateVector(ls));
  });
  // A window larger than obs_window, and a wrong layer count.
  expect_corrupt(KVSDK_METHOD_SNAPKV, [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls;
    for (int l = 0; l < 3; ++l) {
      ls.push_back(fb::CreateLayerPolicyState(fbb, 0, fbb.CreateVector(std::vector<float>(33 * 32)),
                                              fbb.CreateVector(std::vector<int32_t>(33))));
    }
    return fb::CreatePolicyState(fbb, 0, 0, 0, 0, fbb.CreateVector(ls));
  });
  expect_corrupt(KVSDK_METHOD_XKV, [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls(2, fb::CreateLayerPolicyState(fbb));
    return fb::CreatePolicyState(fbb, 0, fbb.CreateVector(std::vector<uint64_t>(3, 1)), 0, 0,
                                 fbb.CreateVector(ls));
  });
  // Negative or NaN scores, a profile share that is NaN.
  expect_corrupt(KVSDK_METHOD_H2O, [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls;
    for (int l = 0; l < 3; ++l) {
      std::vector<flatbuffers::Offset<fb::HeadScores>> hs;
      for (int h = 0; h < 2; ++h) {
        hs.push_back(fb::CreateHeadScores(fbb, fbb.CreateVector(std::vector<float>{1, -1, 0, 0})));
      }
      ls.push_back(fb::CreateLayerPolicyState(fbb, fbb.CreateVector(hs)));
    }
    return fb::CreatePolicyState(fbb, 0, 0, 0, 0, fbb.CreateVector(ls));
  });
  expect_corrupt(KVSDK_METHOD_XKV, [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls(3, fb::CreateLayerPolicyState(fbb));
    return fb::CreatePolicyState(fbb, 0, 0, fbb.CreateVector(std::vector<double>{0.5, NAN, 0.5}),
                                 0, fbb.CreateVector(ls));
  });
}

// Scores given as differences (format 3.1 journal deltas) decode against the scores before, and
// are refused outside such deltas, against rows the scores before did not have, or sized unlike
// the rows.
TEST(PolicyStateSnapshot, ScoreDifferencesAreCheckedAgainstTheScoresBefore) {
  namespace fb = kvsdk::fb;
  const kvsdk::Geometry g = kvsdk::Geometry::from_c(&kG);
  const std::vector<std::vector<uint64_t>> rows(3, std::vector<uint64_t>(2, 3));
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  };
  // Every head: row 0 continues old row 1, row 1 old row 2, row 2 is new.
  auto build = [&](flatbuffers::FlatBufferBuilder& fbb, uint64_t copy_from, size_t diff_rows) {
    const std::vector<fb::Segment> segs = {fb::Segment(copy_from, 2), fb::Segment(~0ull, 1)};
    const uint32_t d[3] = {bits(2.5f) - bits(2.0f), bits(3.25f) - bits(3.0f), bits(0.75f)};
    std::vector<uint8_t> planes(4 * diff_rows);
    for (size_t i = 0; i < diff_rows && i < 3; ++i) {
      for (size_t p = 0; p < 4; ++p) planes[p * diff_rows + i] = uint8_t(d[i] >> (8 * p));
    }
    std::vector<flatbuffers::Offset<fb::LayerPolicyState>> ls;
    for (int l = 0; l < 3; ++l) {
      std::vector<flatbuffers::Offset<fb::HeadScores>> hs;
      for (int h = 0; h < 2; ++h) {
        hs.push_back(fb::CreateHeadScores(fbb, 0, fbb.CreateVectorOfStructs(segs),
                                          fbb.CreateVector(planes)));
      }
      ls.push_back(fb::CreateLayerPolicyState(fbb, fbb.CreateVector(hs)));
    }
    fbb.Finish(fb::CreatePolicyState(fbb, 0, 0, 0, 0, fbb.CreateVector(ls)));
    return flatbuffers::GetRoot<fb::PolicyState>(fbb.GetBufferPointer());
  };
  auto read = [&](const fb::PolicyState* st, bool allowed, std::vector<kvsdk::LayerState>& layers) {
    kvsdk::PolicyRuntime rt;
    kvsdk::format::read_policy_state(st, g, kvsdk::policy_defaults(KVSDK_METHOD_H2O), rows,
                                     layers, rt, allowed);
  };
  auto before = [] {
    std::vector<kvsdk::LayerState> layers(3);
    for (auto& L : layers) L.scores.assign(2, std::vector<float>{1.0f, 2.0f, 3.0f});
    return layers;
  };
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<kvsdk::LayerState> layers = before();
    read(build(fbb, 1, 3), true, layers);
    for (const auto& L : layers) {
      for (const auto& h : L.scores) EXPECT_EQ(h, (std::vector<float>{2.5f, 3.25f, 0.75f}));
    }
  }
  auto expect_corrupt = [&](uint64_t copy_from, size_t diff_rows, bool allowed) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<kvsdk::LayerState> layers = before();
    try {
      read(build(fbb, copy_from, diff_rows), allowed, layers);
      ADD_FAILURE() << "accepted: copy from " << copy_from << ", " << diff_rows << " rows";
    } catch (const kvsdk::Error& e) {
      EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << e.what();
    }
  };
  expect_corrupt(1, 3, false);  // in a full snapshot or a format 3.0 delta
  expect_corrupt(2, 3, true);   // copies old rows 2..3 of 3
  expect_corrupt(1, 4, true);   // differences for 4 rows, the head holds 3
}

}  // namespace
