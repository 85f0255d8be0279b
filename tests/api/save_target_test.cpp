// Save-time compression (issue 19, kvsdk_save_options.target_policy; include/kvsdk.h "Targeted
// saves"): for every target preset, a `full` cache saved with a target leaves the live cache as
// it was, the file loads as a cache of the target policy within the target budget and continues,
// the buffer save gives the file's bytes, and `kvsdk recompress` of a plain save of the same cache
// writes the same bytes. Refused conversions and bad options change nothing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../formats/snapshot_test_util.h"
#include "kvsdk.h"
#include "preset_util.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16;
// More than KIVI's default residual window (128) and group (32), so that a KIVI target
// quantizes with the parameters `kvsdk recompress` parses from a preset name.
constexpr size_t kTokens = 320;
constexpr int kZstd = 1;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

kvsdk_save_options target_options(const kvsdk_policy* policy, uint64_t budget) {
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.zstd_level = kZstd;
  o.target_policy = policy;
  o.target_budget_bytes = budget;
  return o;
}

// Appends kTokens random tokens to every layer of `c`, in chunks of 40.
void fill(kvsdk_cache* c, const kvsdk_geometry& g, uint32_t seed) {
  const size_t kv = size_t(g.n_kv_heads) * g.head_dim;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    for (size_t t0 = 0; t0 < kTokens; t0 += 40) {
      const std::vector<float> k = random_floats(40 * kv, seed + l * 1000 + uint32_t(t0));
      const std::vector<float> v = random_floats(40 * kv, seed + l * 1000 + uint32_t(t0) + 7);
      const std::vector<int32_t> pos = iota_positions(40, int32_t(t0));
      ASSERT_EQ(kvsdk_cache_append(c, l, 40, k.data(), v.data(), pos.data(), 40 * kv * 4),
                KVSDK_OK)
          << kvsdk_last_error();
    }
  }
}

kvsdk_cache_stats stats(const kvsdk_cache* c) {
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s;
}

// Every row of every head, as kvsdk_cache_read returns them (positions, then keys and values).
std::vector<float> rows(const kvsdk_cache* c, const kvsdk_geometry& g) {
  std::vector<float> out;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      size_t n = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      std::vector<float> k(n * g.head_dim), v(n * g.head_dim);
      std::vector<int32_t> p(n);
      EXPECT_EQ(kvsdk_cache_read(c, l, h, k.data(), v.data(), p.data(), n, &n), KVSDK_OK);
      for (int32_t x : p) out.push_back(float(x));
      out.insert(out.end(), k.begin(), k.end());
      out.insert(out.end(), v.begin(), v.end());
    }
  }
  return out;
}

// `kvsdk recompress IN OUT --policy SPEC --budget BYTES`; its exit status (-1: died).
int run_recompress(const std::string& in, const std::string& out, const std::string& spec,
                   uint64_t budget, std::string* err, const std::string& extra = "") {
#ifdef KVSDK_CLI
  const std::string log = out + ".log";
  const std::string cmd = std::string("'") + KVSDK_CLI + "' recompress '" + in + "' '" + out +
                          "' --policy '" + spec + "' --budget " + std::to_string(budget) +
                          " --zstd-level " + std::to_string(kZstd) + " " + extra + " >'" +
                          log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::vector<uint8_t> text = read_file(log);
  *err = std::string(text.begin(), text.end());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
#else
  (void)in, (void)out, (void)spec, (void)budget, (void)err, (void)extra;
  return -2;
#endif
}

class SaveTarget : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    g = make_geometry(kLayers, kQ, kKv, kDim);
    ctx = make_context();
    ASSERT_TRUE(ctx);
    src = make_cache(ctx.get(), g);
    ASSERT_TRUE(src);
    fill(src.get(), g, 11);
    ASSERT_EQ(kvsdk_policy_parse(&target, GetParam()), KVSDK_OK);
    // Eviction targets keep half the rows; the others get a budget that holds every row and
    // room to continue, which they meet by their own compression.
    const uint64_t full_bytes = stats(src.get()).bytes;
    budget = evicts(GetParam()) ? full_bytes / 2 : full_bytes + full_bytes / 4;
  }

  kvsdk_geometry g;
  ContextPtr ctx;
  CachePtr src;
  kvsdk_policy target;
  uint64_t budget = 0;
  TempDir dir;
};

TEST_P(SaveTarget, FileHoldsTheTargetAndTheLiveCacheStays) {
  const std::vector<uint8_t> before = snapshot(src.get());
  const std::vector<float> rows_before = rows(src.get(), g);
  const uint64_t used_before = used(ctx.get());
  const std::string path = dir.file("target.kvsnap");
  const kvsdk_save_options o = target_options(&target, budget);
  const kvsdk_status st = kvsdk_cache_save(src.get(), path.c_str(), &o);
  const std::string error = kvsdk_last_error();
  EXPECT_EQ(snapshot(src.get()), before) << "the live cache changed";
  EXPECT_EQ(rows(src.get(), g), rows_before);
  EXPECT_EQ(used(ctx.get()), used_before) << "the temporary cache stayed charged";
  if (target.method == KVSDK_METHOD_SMALLKV) {
    // smallkv needs its proxy cache, which a save does not have: refused, with the reason.
    EXPECT_EQ(st, KVSDK_E_UNSUPPORTED);
    EXPECT_NE(error.find("proxy"), std::string::npos) << error;
    EXPECT_FALSE(exists(path));
    size_t size = 0;
    EXPECT_EQ(kvsdk_cache_save_to_buffer(src.get(), &o, nullptr, 0, &size), KVSDK_E_UNSUPPORTED);
    return;
  }
  ASSERT_EQ(st, KVSDK_OK) << error;
  const std::vector<uint8_t> file = read_file(path);
  ASSERT_FALSE(file.empty());

  // The buffer save gives the file's bytes (size query included).
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(src.get(), &o, nullptr, 0, &size), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_EQ(size, file.size());
  std::vector<uint8_t> buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(src.get(), &o, buf.data(), buf.size(), &size), KVSDK_OK);
  EXPECT_EQ(buf, file);
  EXPECT_EQ(snapshot(src.get()), before);

  // The file loads as a cache of the target policy, within the target budget, and continues.
  ContextPtr ctx2 = make_context();
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx2.get(), path.c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  ASSERT_EQ(kvsdk_cache_policy(loaded.get(), &p), KVSDK_OK);
  // The target policy, with kivi_weight_bits' default resolved as the header says.
  kvsdk_policy want = target;
  if (want.kivi_weight_bits == 0 && want.quant_bits != 0) {
    want.kivi_weight_bits = want.quant_bits <= 2 ? 7 : 14;
  }
  EXPECT_EQ(std::memcmp(&p, &want, sizeof p), 0) << "policy " << kvsdk_method_name(p.method);
  const kvsdk_cache_stats s = stats(loaded.get());
  EXPECT_LE(s.bytes, budget);
  EXPECT_GT(s.tokens, 0u);
  if (evicts(GetParam())) EXPECT_LT(s.tokens, uint64_t(kTokens) * kLayers * kKv);
  std::mt19937 rng(5);
  Chat chat;
  chat.cache = std::move(loaded);
  for (int32_t pos = int32_t(kTokens); pos < int32_t(kTokens) + 3; ++pos) {
    decode_step(chat, g, g, target.method == KVSDK_METHOD_SPECACHE, pos, rng);
  }
  EXPECT_LE(stats(chat.cache.get()).bytes, budget);

  // `kvsdk recompress` of a plain save of the same cache writes the same bytes.
  const std::string plain = dir.file("plain.kvsnap"), re = dir.file("recompressed.kvsnap");
  kvsdk_save_options po;
  kvsdk_save_options_init(&po);
  po.zstd_level = kZstd;
  ASSERT_EQ(kvsdk_cache_save(src.get(), plain.c_str(), &po), KVSDK_OK) << kvsdk_last_error();
  std::string err;
  const int rc = run_recompress(plain, re, GetParam(), budget, &err);
  if (rc == -2) GTEST_SKIP() << "the kvsdk CLI is not built with these tests";
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(read_file(re), file) << "kvsdk recompress wrote other bytes";
}

TEST_P(SaveTarget, DeltaDoesNotContinueATargetedFile) {
  // The cache's own file is the journal's base; a targeted save elsewhere does not move it.
  const std::string own = dir.file("own.kvsnap"), other = dir.file("other.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(src.get(), own.c_str(), nullptr), KVSDK_OK);
  const kvsdk_save_options o = target_options(&target, budget);
  if (target.method == KVSDK_METHOD_SMALLKV) {
    // Refused as a save target (above), and as a delta's: nothing written, the base continues.
    const std::vector<uint8_t> own_bytes = read_file(own);
    EXPECT_EQ(kvsdk_cache_save_delta(src.get(), own.c_str(), &o), KVSDK_E_UNSUPPORTED);
    EXPECT_EQ(read_file(own), own_bytes);
    fill(src.get(), g, 99);
    EXPECT_EQ(kvsdk_cache_save_delta(src.get(), own.c_str(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
    return;
  }
  ASSERT_EQ(kvsdk_cache_save(src.get(), other.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
  const std::vector<uint8_t> other_bytes = read_file(other);
  fill(src.get(), g, 99);  // (positions repeat: a delta records whatever changed)
  EXPECT_EQ(kvsdk_cache_save_delta(src.get(), other.c_str(), nullptr), KVSDK_E_STATE);
  if (target.method != KVSDK_METHOD_FULL) {
    EXPECT_NE(std::string(kvsdk_last_error()).find("another policy"), std::string::npos)
        << kvsdk_last_error();
  }
  EXPECT_EQ(read_file(other), other_bytes);
  // With a target in the options, a delta is refused before anything is read or written.
  const std::vector<uint8_t> own_bytes = read_file(own);
  EXPECT_EQ(kvsdk_cache_save_delta(src.get(), own.c_str(), &o), KVSDK_E_UNSUPPORTED);
  EXPECT_NE(std::string(kvsdk_last_error()).find("target_policy"), std::string::npos);
  EXPECT_EQ(read_file(own), own_bytes);
  // The cache's own file still continues.
  EXPECT_EQ(kvsdk_cache_save_delta(src.get(), own.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
}

INSTANTIATE_TEST_SUITE_P(EveryPreset, SaveTarget, ::testing::ValuesIn(kPresets), preset_name);

// Options and sources: the bad ones are refused with their status and change nothing (the live
// cache, the context's charge, the file at the path).
class SaveTargetOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    g = make_geometry(kLayers, kQ, kKv, kDim);
    ctx = make_context();
    src = make_cache(ctx.get(), g);
    ASSERT_TRUE(src);
    fill(src.get(), g, 3);
    path = dir.file("x.kvsnap");
    ASSERT_EQ(kvsdk_cache_save(src.get(), path.c_str(), nullptr), KVSDK_OK);
    file = read_file(path);
    before = snapshot(src.get());
  }

  // A save with `o` to `path` and to a buffer returns `want`; nothing changed.
  void expect_refused(kvsdk_cache* c, const kvsdk_save_options& o, kvsdk_status want,
                      const char* reason) {
    const std::vector<uint8_t> snap = snapshot(c);
    const uint64_t u = used(ctx.get());
    EXPECT_EQ(kvsdk_cache_save(c, path.c_str(), &o), want) << kvsdk_last_error();
    EXPECT_NE(std::string(kvsdk_last_error()).find(reason), std::string::npos)
        << kvsdk_last_error();
    size_t size = 7;
    EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &o, nullptr, 0, &size), want);
    EXPECT_EQ(size, 7u);
    EXPECT_EQ(snapshot(c), snap);
    EXPECT_EQ(used(ctx.get()), u);
    EXPECT_EQ(read_file(path), file);
  }

  kvsdk_geometry g;
  ContextPtr ctx;
  CachePtr src;
  TempDir dir;
  std::string path;
  std::vector<uint8_t> file, before;
};

TEST_F(SaveTargetOptions, BudgetWithoutPolicy) {
  kvsdk_save_options o = target_options(nullptr, 12345);
  expect_refused(src.get(), o, KVSDK_E_INVALID_ARG, "target_budget_bytes");
}

TEST_F(SaveTargetOptions, InvalidPolicies) {
  kvsdk_policy p;
  std::memset(&p, 0x5a, sizeof p);  // garbage: no struct_size, no method
  kvsdk_save_options o = target_options(&p, 0);
  expect_refused(src.get(), o, KVSDK_E_INVALID_ARG, "");
  ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_KIVI), KVSDK_OK);
  p.quant_bits = 0;  // kivi needs bits
  expect_refused(src.get(), o, KVSDK_E_INVALID_ARG, "");
  ASSERT_EQ(kvsdk_policy_init(&p, KVSDK_METHOD_SPINDLEKV), KVSDK_OK);
  p.boundary_layer = int32_t(kLayers) + 3;  // beyond the geometry
  expect_refused(src.get(), o, KVSDK_E_INVALID_ARG, "");
  ASSERT_EQ(kvsdk_policy_parse(&p, "full+kivi2"), KVSDK_OK);  // parses, not a combination
  expect_refused(src.get(), o, KVSDK_E_UNSUPPORTED, "");
}

TEST_F(SaveTargetOptions, BudgetTooSmall) {
  for (const char* spec : {"snapkv", "kivi", "full"}) {
    SCOPED_TRACE(spec);
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
    expect_refused(src.get(), target_options(&p, 16), KVSDK_E_BUDGET, "");
  }
}

TEST_F(SaveTargetOptions, ContextCannotHoldTheTemporaryCache) {
  // The converted cache is charged to the live cache's context while the save runs: a kivi
  // conversion (about half the f16 bytes here: its residual window stays exact) does not fit
  // beside the live cache in 1.2 times the live cache's bytes. (An eviction target would evict
  // to fit the context, as any cache does.)
  ContextPtr tight = make_context(stats(src.get()).bytes * 6 / 5);
  ASSERT_TRUE(tight);
  CachePtr c = make_cache(tight.get(), g);
  ASSERT_TRUE(c);
  fill(c.get(), g, 3);
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "kivi"), KVSDK_OK);
  const std::vector<uint8_t> snap = snapshot(c.get());
  uint64_t u0 = 0, u1 = 0;
  ASSERT_EQ(kvsdk_context_used_bytes(tight.get(), &u0), KVSDK_OK);
  const kvsdk_save_options o = target_options(&p, 0);
  EXPECT_EQ(kvsdk_cache_save(c.get(), path.c_str(), &o), KVSDK_E_BUDGET) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_context_used_bytes(tight.get(), &u1), KVSDK_OK);
  EXPECT_EQ(u1, u0);
  EXPECT_EQ(snapshot(c.get()), snap);
  EXPECT_EQ(read_file(path), file);
}

TEST_F(SaveTargetOptions, SourceEvictedPerHead) {
  // A snapkv cache compressed after an observation keeps, in each KV head, the rows its own
  // queries attended most: other rows per head.
  kvsdk_policy snap;
  ASSERT_EQ(kvsdk_policy_parse(&snap, "snapkv"), KVSDK_OK);
  CachePtr c = make_cache(ctx.get(), g, &snap);
  ASSERT_TRUE(c);
  fill(c.get(), g, 21);
  const size_t qn = size_t(kQ) * kDim, nq = size_t(snap.obs_window);
  const std::vector<int32_t> qpos = iota_positions(nq, int32_t(kTokens - nq));
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = random_floats(nq * qn, 777 + l);
    ASSERT_EQ(kvsdk_cache_observe(c.get(), l, nq, q.data(), qpos.data(), nq * qn * 4), KVSDK_OK)
        << kvsdk_last_error();
  }
  ASSERT_EQ(kvsdk_cache_set_budget(c.get(), stats(src.get()).bytes / 3), KVSDK_OK)
      << kvsdk_last_error();
  // The precondition: some layer's KV heads hold other positions.
  bool differ = false;
  for (uint32_t l = 0; l < kLayers && !differ; ++l) {
    std::vector<std::vector<int32_t>> pos(kKv);
    for (uint32_t h = 0; h < kKv; ++h) {
      size_t n = 0;
      ASSERT_EQ(kvsdk_cache_read(c.get(), l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      pos[h].resize(n);
      ASSERT_EQ(kvsdk_cache_read(c.get(), l, h, nullptr, nullptr, pos[h].data(), n, &n),
                KVSDK_OK);
    }
    differ = pos[0] != pos[1];
  }
  ASSERT_TRUE(differ) << "snapkv did not evict per KV head here";
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "kivi"), KVSDK_OK);
  expect_refused(c.get(), target_options(&p, 0), KVSDK_E_UNSUPPORTED, "per KV head");
  // The same method keeps the cache as it is: that converts.
  const std::string same = dir.file("same.kvsnap");
  // (a few rows fewer per layer: its observation windows take much of the bytes here)
  const kvsdk_save_options o =
      target_options(&snap, stats(c.get()).bytes - 4 * kLayers * exact_bytes_per_token(g));
  EXPECT_EQ(kvsdk_cache_save(c.get(), same.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
}

TEST_F(SaveTargetOptions, OlderStructGetsNoTarget) {
  // An app built before target_policy passes a smaller struct: the fields past it are not read
  // (whatever bytes follow), and the save is a plain one.
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "kivi"), KVSDK_OK);
  kvsdk_save_options o = target_options(&p, 5);
  o.struct_size = uint32_t(offsetof(kvsdk_save_options, target_policy));
  kvsdk_save_options plain = target_options(nullptr, 0);
  size_t a = 0, b = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(src.get(), &o, nullptr, 0, &a), KVSDK_OK)
      << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save_to_buffer(src.get(), &plain, nullptr, 0, &b), KVSDK_OK);
  std::vector<uint8_t> x(a), y(b);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(src.get(), &o, x.data(), a, &a), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(src.get(), &plain, y.data(), b, &b), KVSDK_OK);
  EXPECT_EQ(x, y);
}

TEST_F(SaveTargetOptions, SameMethodIsTheCacheAsItIs) {
  // A snapkv cache that evicted per KV head, saved with its own policy and budget: exactly the
  // plain save (the same rows and policy state), although another policy refuses it above.
  kvsdk_policy snap;
  ASSERT_EQ(kvsdk_policy_parse(&snap, "snapkv"), KVSDK_OK);
  CachePtr c = make_cache(ctx.get(), g, &snap);
  ASSERT_TRUE(c);
  fill(c.get(), g, 22);
  ASSERT_EQ(kvsdk_cache_set_budget(c.get(), stats(src.get()).bytes / 2), KVSDK_OK);
  const kvsdk_save_options o = target_options(&snap, 0), plain = target_options(nullptr, 0);
  const std::string a = dir.file("a.kvsnap"), b = dir.file("b.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(c.get(), a.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save(c.get(), b.c_str(), &plain), KVSDK_OK);
  EXPECT_EQ(read_file(a), read_file(b));
}

TEST_F(SaveTargetOptions, SpeCacheSource) {
  kvsdk_policy sp;
  ASSERT_EQ(kvsdk_policy_parse(&sp, "specache"), KVSDK_OK);
  CachePtr c = make_cache(ctx.get(), g, &sp);
  ASSERT_TRUE(c);
  fill(c.get(), g, 4);
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "full"), KVSDK_OK);
  expect_refused(c.get(), target_options(&p, 0), KVSDK_E_UNSUPPORTED, "backing store");
}

// A KIVI source under another policy: the file holds its dequantized rows (what
// kvsdk_cache_read returns), exactly.
TEST(SaveTargetSource, KiviGivesItsDequantizedRows) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  ContextPtr ctx = make_context();
  kvsdk_policy kivi, full;
  ASSERT_EQ(kvsdk_policy_parse(&kivi, "kivi"), KVSDK_OK);
  ASSERT_EQ(kvsdk_policy_parse(&full, "full"), KVSDK_OK);
  CachePtr c = make_cache(ctx.get(), g, &kivi);
  ASSERT_TRUE(c);
  fill(c.get(), g, 8);
  size_t size = 0;
  const kvsdk_save_options o = target_options(&full, 0);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(c.get(), &o, nullptr, 0, &size), KVSDK_OK)
      << kvsdk_last_error();
  std::vector<uint8_t> buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(c.get(), &o, buf.data(), size, &size), KVSDK_OK);
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&raw, ctx.get(), buf.data(), size, &g, nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  // The source reads its dequantized rows as f32; `full` stores each as f16 (round to nearest
  // even, util/half.h), which is what the loaded cache reads back.
  const std::vector<float> want = rows(c.get(), g), got = rows(loaded.get(), g);
  ASSERT_EQ(want.size(), got.size());
  size_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    differ += kvsdk::f16_to_f32(kvsdk::f32_to_f16(want[i])) != got[i];
  }
  EXPECT_EQ(differ, 0u);
}

// KVSDK_QUANT_RESIDUAL_AUTO in a target: resolved for the head_dim and width (16 and 2 bits:
// 768 / 16 = 48), the loaded cache carries the resolved value, and `kvsdk recompress --residual
// auto` writes the same bytes.
TEST(SaveTargetAutoResidual, WindowIsResolvedInTheFile) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  ContextPtr ctx = make_context();
  CachePtr c = make_cache(ctx.get(), g);
  ASSERT_TRUE(c);
  fill(c.get(), g, 9);
  kvsdk_policy kivi;
  ASSERT_EQ(kvsdk_policy_parse(&kivi, "kivi"), KVSDK_OK);
  kivi.quant_residual = KVSDK_QUANT_RESIDUAL_AUTO;
  const kvsdk_save_options o = target_options(&kivi, 0);
  TempDir dir;
  const std::string path = dir.file("auto.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(c.get(), path.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  ASSERT_EQ(kvsdk_cache_policy(loaded.get(), &p), KVSDK_OK);
  EXPECT_EQ(p.quant_residual, 48);
  // Exact rows: at most R + G - 1 = 79 of the 320 per layer and head, fewer than the fixed
  // window's 128 or more.
  const kvsdk_cache_stats s = stats(loaded.get());
  EXPECT_LE(s.bytes_by_tier[KVSDK_TIER_EXACT],
            uint64_t(kLayers) * kKv * 79 * kDim * 2 * 2);
  EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);

  const std::string plain = path + ".plain", re = path + ".re";
  kvsdk_save_options po;
  kvsdk_save_options_init(&po);
  po.zstd_level = kZstd;
  ASSERT_EQ(kvsdk_cache_save(c.get(), plain.c_str(), &po), KVSDK_OK) << kvsdk_last_error();
  std::string err;
  const int rc = run_recompress(plain, re, "kivi", 0, &err, "--residual auto");
  if (rc == -2) GTEST_SKIP() << "the kvsdk CLI is not built with these tests";
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(read_file(re), read_file(path)) << "kvsdk recompress wrote other bytes";
  // A window that is neither a count nor 'auto' is a usage error, and writes nothing.
  EXPECT_EQ(run_recompress(plain, path + ".bad", "kivi", 0, &err, "--residual -5"), 2) << err;
  EXPECT_FALSE(exists(path + ".bad"));
}

}  // namespace
