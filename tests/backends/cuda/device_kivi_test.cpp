// Policy 'kivi' on a CUDA context (the device KIVI store, src/repr/device_kivi.h), against the same
// calls on the CPU reference backend (the oracle, backends/cpu/kivi_store.h): the device store
// quantizes the same blocks at the same appends, so rows (dequantized codes and the exact f16
// residual window) must be the CPU's bit for bit, attention within the decode kernel's tolerance
// (2e-4 absolute: f32 sums in another order), stats bytes per tier and the context's budget
// charges equal, snapshots and journal deltas byte-identical and loadable on the other backend,
// truncation allowed and refused exactly where the CPU allows and refuses it, a budget refusal
// changing nothing, and bad input failing with the CPU's status.
//
// Why step by step: KIVI's state changes shape at every flush (the residual window reaching
// R + G rows quantizes its oldest G), so the tests use small G and R (flushes after a few dozen
// tokens) and compare after the appends that flush, with prefill chunks that cross several
// flushes in one call and decode steps that cross them one token at a time, at every head_dim
// the device runs (64, 128, 256), GQA groups of 1 to 4 query heads per KV head, and every width
// (1, 2, 4, 8 bits).
//
// Built twice, like device_cache_test.cpp: with CUDA (cuda_backend_test; skipped with the
// driver's reason when no GPU is present) and without it against the host execution shim
// (cuda_host_cache_test), where every call runs the CUDA backend's own code and kernels on the
// CPU. Token counts stay in the hundreds so that the shim runs each test in seconds.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend_ops.h"
#include "cuda_ops.h"
#include "cuda_test_util.h"
#include "device_cache_util.h"
#include "../../api/preset_util.h"
#include "../../formats/snapshot_test_util.h"
#include "kvsdk.h"
#include "test_util.h"

namespace {

using kvsdk_test::CachePtr;
using kvsdk_test::ContextPtr;
using namespace kvsdk_device_test;

// --- Helpers (device_cache_util.h, plus KIVI's) --------------------------------------------

// A kivi policy from its spec ("kivi" is 2 bits, "kivi+kiviN" N bits) with KIVI group G and
// residual window R small enough that a few dozen tokens flush a block.
kvsdk_policy kivi_policy(uint32_t bits, int32_t group, int32_t residual) {
  const std::string spec = bits == 2 ? "kivi" : "kivi+kivi" + std::to_string(bits);
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec.c_str()), KVSDK_OK) << spec << ": " << kvsdk_last_error();
  EXPECT_EQ(p.method, KVSDK_METHOD_KIVI) << spec;
  EXPECT_EQ(p.quant_bits, int32_t(bits)) << spec;
  p.quant_group = group;
  p.quant_residual = residual;
  return p;
}

// Everything the API reports about a cache but its rows: the stats (bytes per tier, tokens, the
// context's charges) and every layer's, and the budget planning numbers.
void expect_same_accounting(kvsdk_cache* a, kvsdk_cache* b, const kvsdk_geometry& g) {
  const kvsdk_cache_stats sa = stats(a), sb = stats(b);
  EXPECT_EQ(sa.tokens, sb.tokens);
  EXPECT_EQ(sa.appended_tokens, sb.appended_tokens);
  EXPECT_EQ(sa.bytes, sb.bytes);
  for (int t = 0; t < KVSDK_TIER_SLOTS; ++t) {
    EXPECT_EQ(sa.bytes_by_tier[t], sb.bytes_by_tier[t]) << "tier " << t;
  }
  EXPECT_EQ(sa.full_bytes, sb.full_bytes);
  EXPECT_EQ(sa.budget_bytes, sb.budget_bytes);
  EXPECT_EQ(sa.context_used_bytes, sb.context_used_bytes);
  // The arena: the budget, of which this cache's layers cover at least its rows (codes, scales,
  // residual window and positions all live on the device).
  EXPECT_EQ(sa.device_arena_bytes, sa.budget_bytes);
  EXPECT_GE(sa.device_reserved_bytes, sa.bytes_by_tier[KVSDK_TIER_QUANTIZED] +
                                          sa.bytes_by_tier[KVSDK_TIER_EXACT] +
                                          sa.bytes_by_tier[KVSDK_TIER_METADATA]);
  EXPECT_LE(sa.device_reserved_bytes, sa.device_arena_bytes);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    kvsdk_layer_stats x, y;
    kvsdk_layer_stats_init(&x);
    kvsdk_layer_stats_init(&y);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(a, l, &x), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(b, l, &y), KVSDK_OK);
    EXPECT_EQ(0, std::memcmp(&x, &y, sizeof(x))) << "layer stats " << l;
  }
  uint64_t ta = 0, tb = 0, ba = 0, bb = 0;
  ASSERT_EQ(kvsdk_cache_token_capacity(a, &ta, &ba), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_token_capacity(b, &tb, &bb), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(ba, bb);
}

// Rows, stats and the two contexts' charges.
void expect_same_state(kvsdk_cache* a, kvsdk_cache* b, const kvsdk_geometry& g,
                       kvsdk_context* gpu, kvsdk_context* cpu) {
  expect_same_rows(a, b, g);
  if (::testing::Test::HasFatalFailure()) return;
  expect_same_accounting(a, b, g);
  EXPECT_EQ(kvsdk_test::used(gpu), kvsdk_test::used(cpu));
}

// Query positions that see everything (the newest, INT32_MAX) and that mask part of the cache:
// the newest rows of the residual window, half of it (inside a quantized block once there are
// some), and all but the first token.
std::vector<int32_t> query_positions(int32_t first, int32_t newest) {
  return {newest, INT32_MAX, std::max(first, newest - 2), first + (newest - first) / 2, first};
}

// --- A conversation per shape --------------------------------------------------------------

struct KiviCase {
  uint32_t dim, q_per_kv, kv_heads, bits;
  int32_t group, residual;  // G, R (KVSDK_QUANT_RESIDUAL_AUTO: resolved by the cache)
};

class DeviceKivi : public ::testing::TestWithParam<KiviCase> {};

// Prefill chunks of 1, 7, 100 and 300 tokens (the last ones flush several blocks in one call),
// then decode steps of one token per layer across at least two more flushes. Layer 0 holds
// positions 0, 1, 2, ...; layer 1 positions 5, 7, 9, ... (causal masks by position, not index).
// After every append: the stats per tier and the context charges. After every prefill chunk and
// on the decode steps where the store changes shape (the step that flushes a block, the one after
// it) and every 8th: the layer's rows bit for bit, and attention of queries that see all of the
// cache or whose position masks its newest rows, part of the residual window or part of the
// quantized blocks. (Time: the shim runs the attention kernel on the CPU at about 0.15 ms per
// cached token and query, and the debug build dequantizes 4- and 8-bit rows at about 20 ms per
// 400-token head; checking all of it after every decode step would take minutes per shape.)
TEST_P(DeviceKivi, ConversationMatchesTheCpuReference) {
  const KiviCase s = GetParam();
  const uint32_t layers = 2;
  const kvsdk_geometry g =
      kvsdk_test::make_geometry(layers, s.q_per_kv * s.kv_heads, s.kv_heads, s.dim);
  const kvsdk_policy p = kivi_policy(s.bits, s.group, s.residual);
  CUDA_CONTEXT_OR_SKIP(gpu, 64u << 20);
  ContextPtr cpu = kvsdk_test::make_context(64u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  // The same policy, its residual window resolved the same way.
  kvsdk_policy pa, pb;
  kvsdk_policy_init(&pa, 0), kvsdk_policy_init(&pb, 0);
  ASSERT_EQ(kvsdk_cache_policy(a.get(), &pa), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_policy(b.get(), &pb), KVSDK_OK);
  EXPECT_EQ(0, std::memcmp(&pa, &pb, sizeof(pa)));
  ASSERT_GE(pa.quant_residual, 0);
  const int32_t G = pa.quant_group, R = pa.quant_residual;

  const auto position = [](uint32_t layer, int32_t i) { return layer == 0 ? i : 5 + 2 * i; };
  std::vector<int32_t> count(layers, 0);     // tokens appended per layer
  std::vector<int32_t> residual(layers, 0);  // the residual window, by KIVI's rule
  uint32_t seed = 1000;
  // Appends `n` tokens to layer `l` of both caches and compares them; returns whether the append
  // flushed a block. `attend_queries` of query_positions() are attended (0: none); with `rows`
  // the layer's rows are compared.
  const auto step = [&](uint32_t l, size_t n, size_t attend_queries, bool rows,
                        const char* what) {
    SCOPED_TRACE(std::string(what) + ": layer " + std::to_string(l) + ", " +
                 std::to_string(n) + " tokens after " + std::to_string(count[l]));
    std::vector<int32_t> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = position(l, count[l] + int32_t(i));
    EXPECT_EQ(append_at(a.get(), g, l, pos, seed), KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(append_at(b.get(), g, l, pos, seed), KVSDK_OK) << kvsdk_last_error();
    count[l] += int32_t(n);
    bool flushed = false;
    for (residual[l] += int32_t(n); residual[l] >= R + G; residual[l] -= G) flushed = true;
    if (rows) expect_same_layer_rows(a.get(), b.get(), g, l);
    expect_same_accounting(a.get(), b.get(), g);
    EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));
    if (attend_queries > 0) {
      std::vector<int32_t> qpos = query_positions(position(l, 0), position(l, count[l] - 1));
      // (Rotated, so that single queries take every kind in turn.)
      std::rotate(qpos.begin(), qpos.begin() + (seed / 10) % qpos.size(), qpos.end());
      qpos.resize(std::min(attend_queries, qpos.size()));
      expect_same_attention(a.get(), b.get(), g, l, qpos, seed + 2);
    }
    seed += 10;
    return flushed;
  };
  for (size_t n : {1, 7, 100, 300}) {
    for (uint32_t l = 0; l < layers; ++l) {
      step(l, n, n == 300 ? 3 : 5, true, "prefill");
      ASSERT_FALSE(HasFailure());
    }
  }
  EXPECT_GT(stats(a.get()).bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u) << "prefill quantized";
  const int32_t decode = 2 * G + G / 2 + 1;
  int flushes = 0;
  bool after_flush = false;
  for (int32_t t = 0; t < decode; ++t) {
    // The layers hold the same number of tokens: they flush on the same step.
    const bool flushing = residual[0] + 1 >= R + G;
    bool flushed = false;
    for (uint32_t l = 0; l < layers; ++l) {
      const bool periodic = t % 8 == 0 && l == uint32_t(t / 8) % layers;
      const size_t queries = flushing ? 2 : (after_flush && l == 0) || periodic ? 1 : 0;
      flushed = step(l, 1, queries, queries > 0, "decode") || flushed;
      ASSERT_FALSE(HasFailure());
    }
    EXPECT_EQ(flushed, flushing);
    flushes += flushed;
    after_flush = flushed;
  }
  EXPECT_GE(flushes, 2) << "the decode steps crossed flushes";
  for (uint32_t l = 0; l < layers; ++l) {
    // The newest position, and one that masks the newest quantized block.
    const int32_t masked = position(l, count[l] - residual[l] - G / 2);
    expect_same_attention(a.get(), b.get(), g, l, {position(l, count[l] - 1), masked}, 7 + l);
  }
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
  const kvsdk_cache_stats sa = stats(a.get());
  EXPECT_EQ(sa.tokens, uint64_t(count[0] + count[1]) * g.n_kv_heads) << "kivi never evicts";
  EXPECT_EQ(sa.bytes_by_tier[KVSDK_TIER_EXACT],
            uint64_t(residual[0] + residual[1]) * g.n_kv_heads * g.head_dim * 4)
      << "the residual windows (f16 keys and values) by KIVI's rule";
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == kvsdk_test::snapshot(b.get()));
}

// Every head_dim, every width and GQA groups 1 to 4 at least once (the shim runs the kernels on
// the CPU, so each shape costs seconds: not every combination); G 32 with R 32 or 64, and the
// corners: R 0 (the window is only the unflushed rows), R resolved by the cache
// (KVSDK_QUANT_RESIDUAL_AUTO: 16 at head_dim 128 and 2 bits), G 64, and G 24 (value groups that
// do not divide head_dim: the last of 64 channels is a group of 16).
INSTANTIATE_TEST_SUITE_P(
    Shapes, DeviceKivi,
    ::testing::Values(KiviCase{64, 4, 2, 1, 32, 64}, KiviCase{64, 2, 2, 2, 24, 32},
                      KiviCase{64, 3, 1, 8, 32, 32}, KiviCase{128, 1, 2, 4, 32, 32},
                      KiviCase{128, 2, 2, 2, 32, KVSDK_QUANT_RESIDUAL_AUTO},
                      KiviCase{256, 2, 2, 1, 32, 0}, KiviCase{256, 3, 1, 2, 64, 32}),
    [](const ::testing::TestParamInfo<KiviCase>& info) {
      const KiviCase& s = info.param;
      const std::string r =
          s.residual == KVSDK_QUANT_RESIDUAL_AUTO ? "auto" : std::to_string(s.residual);
      return "dim" + std::to_string(s.dim) + "_q" + std::to_string(s.q_per_kv * s.kv_heads) +
             "_kv" + std::to_string(s.kv_heads) + "_bits" + std::to_string(s.bits) + "_g" +
             std::to_string(s.group) + "_r" + r;
    });

// --- Snapshots across backends ------------------------------------------------------------

class DeviceKiviSnapshot : public ::testing::TestWithParam<uint32_t> {};

// A CUDA kivi cache saves the bytes of the CPU cache fed the same calls (buffers, files,
// targeted saves, journal deltas across a flush and a truncation); each backend loads the
// other's file with its journal, and the loaded caches continue (appends across flushes,
// attention) exactly as the caches that were saved.
TEST_P(DeviceKiviSnapshot, SavesAndLoadsAcrossBackends) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 128);
  const kvsdk_policy p = kivi_policy(GetParam(), 32, 32);
  CUDA_CONTEXT_OR_SKIP(gpu, 16u << 20);
  // (The same budget: snapshots record the context budget they were saved under.)
  ContextPtr cpu = kvsdk_test::make_context(16u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  int32_t pos = 0;
  const auto feed = [&](const std::vector<kvsdk_cache*>& caches, size_t n, uint32_t seed) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (kvsdk_cache* c : caches) append(c, g, l, pos, n, seed + l);
    }
    pos += int32_t(n);
  };
  feed({a.get(), b.get()}, 70, 10);  // one flush (at 64 rows)
  feed({a.get(), b.get()}, 30, 20);  // another
  for (uint32_t i = 0; i < 5; ++i) feed({a.get(), b.get()}, 1, 30 + 2 * i);
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
  ASSERT_FALSE(HasFailure());

  const auto from_gpu = kvsdk_test::snapshot(a.get()), from_cpu = kvsdk_test::snapshot(b.get());
  EXPECT_TRUE(from_gpu == from_cpu) << "the same rows (and budget) make the same snapshot";
  // Targeted saves convert the dequantized rows on the host: the CPU's bytes.
  for (const char* spec : {"full", "snapkv", "kivi+kivi8"}) {
    kvsdk_save_options opt;
    kvsdk_save_options_init(&opt);
    kvsdk_policy target;
    ASSERT_EQ(kvsdk_policy_parse(&target, spec), KVSDK_OK);
    opt.target_policy = &target;
    opt.target_budget_bytes = std::string(spec) == "snapkv" ? 64 * 1024 : 0;
    const auto x = kvsdk_test::save_buffer(a.get(), &opt), y = kvsdk_test::save_buffer(b.get(), &opt);
    EXPECT_FALSE(x.empty()) << spec;
    EXPECT_TRUE(x == y) << "targeted save to " << spec;
  }

  // Files, then journal deltas: one across a flush and a truncation of the rows appended after
  // it, one of a few more tokens.
  kvsdk_test::TempDir dir;
  const std::string fa = dir.file("gpu.kvsnap"), fb = dir.file("cpu.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), fa.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save(b.get(), fb.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(file_bytes(fa) == file_bytes(fb)) << "snapshot files";
  feed({a.get(), b.get()}, 30, 40);  // 135 tokens: the residual flushed its fourth block
  ASSERT_EQ(kvsdk_cache_truncate(a.get(), pos - 2), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_truncate(b.get(), pos - 2), KVSDK_OK) << kvsdk_last_error();
  pos -= 2;
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), fa.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save_delta(b.get(), fb.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(file_bytes(fa) == file_bytes(fb)) << "journal delta (flush, truncation)";
  feed({a.get(), b.get()}, 3, 50);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), fa.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save_delta(b.get(), fb.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(file_bytes(fa) == file_bytes(fb)) << "journal delta (appends)";
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());

  // Each backend loads the other's file with its journal, and the other's buffer.
  kvsdk_load_info ia, ib;
  kvsdk_load_info_init(&ia), kvsdk_load_info_init(&ib);
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&loaded, gpu.get(), fb.c_str(), &g, &ia), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_gpu(loaded);
  ASSERT_EQ(kvsdk_cache_load(&loaded, cpu.get(), fa.c_str(), &g, &ib), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_cpu(loaded);
  EXPECT_EQ(ia.journal_frames_applied, ib.journal_frames_applied);
  EXPECT_GT(ia.journal_frames_applied, 0u);
  const auto now_gpu = kvsdk_test::snapshot(a.get()), now_cpu = kvsdk_test::snapshot(b.get());
  EXPECT_TRUE(now_gpu == now_cpu);
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, gpu.get(), now_cpu.data(), now_cpu.size(), &g,
                                         nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr buffer_on_gpu(loaded);
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, cpu.get(), now_gpu.data(), now_gpu.size(), &g,
                                         nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr buffer_on_cpu(loaded);
  // Pairs of equivalent caches, the CUDA one first; each context holds one of every pair.
  const std::vector<std::pair<kvsdk_cache*, kvsdk_cache*>> pairs{
      {a.get(), b.get()}, {on_gpu.get(), on_cpu.get()}, {buffer_on_gpu.get(), buffer_on_cpu.get()}};
  const auto all_same = [&](const char* what) {
    SCOPED_TRACE(what);
    for (const auto& [x, y] : pairs) {
      expect_same_rows(x, b.get(), g);
      expect_same_rows(y, b.get(), g);
      ASSERT_FALSE(HasFatalFailure());
      expect_same_accounting(x, y, g);
      EXPECT_TRUE(kvsdk_test::snapshot(x) == now_cpu) << "the same snapshot";
      EXPECT_TRUE(kvsdk_test::snapshot(y) == now_cpu) << "the same snapshot";
    }
    EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));
  };
  for (const auto& [x, y] : pairs) {
    kvsdk_policy px, pb;
    kvsdk_policy_init(&px, 0), kvsdk_policy_init(&pb, 0);
    ASSERT_EQ(kvsdk_cache_policy(x, &px), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_policy(b.get(), &pb), KVSDK_OK);
    EXPECT_EQ(0, std::memcmp(&px, &pb, sizeof(px))) << "the loaded cache's policy";
  }
  all_same("loaded");
  // Continuing: every cache appends the same tokens (64: two more flushes) and attends.
  std::vector<kvsdk_cache*> all;
  for (const auto& [x, y] : pairs) all.push_back(x), all.push_back(y);
  const size_t chunks[] = {1, 2, 3, 5, 8, 13, 1, 2, 3, 5, 8, 13};
  for (uint32_t i = 0; i < std::size(chunks); ++i) {
    feed(all, chunks[i], 100 + 3 * i);
    if (i % 3 != 2) continue;  // (attention in the shim is slow)
    const uint32_t l = i / 3 % g.n_layers;
    const std::vector<int32_t> qpos{pos - 1, pos - 1 - int32_t(i)};
    for (const auto& [x, y] : pairs) {
      expect_same_attention(x, b.get(), g, l, qpos, 500 + i);
      ASSERT_FALSE(HasFatalFailure()) << "after " << pos << " tokens";
    }
  }
  const auto final_cpu = kvsdk_test::snapshot(b.get());
  for (const auto& [x, y] : pairs) {
    expect_same_rows(x, b.get(), g);
    expect_same_rows(y, b.get(), g);
    ASSERT_FALSE(HasFatalFailure());
    expect_same_accounting(x, y, g);
    EXPECT_TRUE(kvsdk_test::snapshot(x) == final_cpu) << "after continuing";
  }
  EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));
}

INSTANTIATE_TEST_SUITE_P(Bits, DeviceKiviSnapshot, ::testing::Values(2u, 4u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return "bits" + std::to_string(info.param);
                         });

// --- Truncation ----------------------------------------------------------------------------

// kvsdk_cache_truncate on kivi removes only rows whose removal leaves exactly the store that
// never held them: any row before the first flush, and after one only the rows appended since
// (index >= quantized + R). Both backends allow and refuse the same calls with the same status;
// a refused call (even one that only some layers refuse) changes nothing.
TEST(DeviceKiviTruncate, RemovesOnlyRowsSinceTheLastFlush) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 64);
  const kvsdk_policy p = kivi_policy(2, 32, 32);  // flushes at 64 residual rows
  CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
  ContextPtr cpu = kvsdk_test::make_context(8u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  const auto both_append = [&](uint32_t l, int32_t first, size_t n, uint32_t seed) {
    append(a.get(), g, l, first, n, seed);
    append(b.get(), g, l, first, n, seed);
  };
  // Both sides answer alike; returns the GPU's status.
  const auto truncate = [&](int32_t position) {
    const kvsdk_status x = kvsdk_cache_truncate(a.get(), position);
    const std::string why = kvsdk_last_error();
    const kvsdk_status y = kvsdk_cache_truncate(b.get(), position);
    EXPECT_EQ(x, y) << "truncate(" << position << "): " << why << " / " << kvsdk_last_error();
    return x;
  };
  const auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      expect_same_attention(a.get(), b.get(), g, l, {INT32_MAX, 30, 61, 70}, 77 + l);
    }
  };

  // Before any flush every row can go.
  for (uint32_t l = 0; l < g.n_layers; ++l) both_append(l, 0, 50, 10 + l);
  ASSERT_EQ(truncate(20), KVSDK_OK) << kvsdk_last_error();
  check("before the first flush");
  EXPECT_EQ(read_rows(a.get(), 0, 1, g.head_dim).pos, kvsdk_test::iota_positions(20));
  // Layer 0: 50 rows, no flush; layer 1: 70 rows, one flush (32 quantized, 38 exact), so only
  // its rows at index >= 64 (positions 64..69) were appended since the flush.
  both_append(0, 20, 30, 30);
  both_append(1, 20, 50, 31);
  check("appended again");
  const std::vector<uint8_t> before = kvsdk_test::snapshot(a.get());
  const kvsdk_cache_stats stats_before = stats(a.get());
  const uint64_t used_before = kvsdk_test::used(gpu.get());
  for (int32_t refused : {63, 60, 40, 0}) {
    EXPECT_EQ(truncate(refused), KVSDK_E_STATE) << "layer 1's quantized block held " << refused;
    EXPECT_FALSE(std::string(kvsdk_last_error()).empty());
    EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == before) << "a refusal changes nothing";
    EXPECT_EQ(stats(a.get()).bytes, stats_before.bytes);
    EXPECT_EQ(kvsdk_test::used(gpu.get()), used_before);
  }
  check("after the refusals");
  // Out of range: the same status on both (an invalid argument), nothing changed.
  EXPECT_EQ(truncate(-1), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_truncate(nullptr, 5), KVSDK_E_INVALID_ARG);
  // Past every row: a no-op.
  EXPECT_EQ(truncate(1000), KVSDK_OK);
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == before);
  // The rows since layer 1's flush (and layer 0's unflushed rows from there) can go.
  ASSERT_EQ(truncate(66), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(read_rows(a.get(), 1, 0, g.head_dim).pos, kvsdk_test::iota_positions(66));
  EXPECT_EQ(read_rows(a.get(), 0, 0, g.head_dim).pos, kvsdk_test::iota_positions(50));
  EXPECT_LT(kvsdk_test::used(gpu.get()), used_before) << "the bytes went back to the budget";
  check("since the flush");
  ASSERT_EQ(truncate(64), KVSDK_OK) << kvsdk_last_error();
  check("back to the flush");
  // Appending again: the same state on both, flushes included. Layer 0 (50 exact rows) takes 60
  // and flushes twice in the call; layer 1 (32 quantized, 32 exact) takes 46 and flushes once.
  // Both then hold positions 0..63 quantized and 64..109 exact, of which 96.. came after the
  // last flush.
  both_append(0, 50, 60, 40);
  both_append(1, 64, 46, 41);
  check("re-appended");
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == kvsdk_test::snapshot(b.get()));
  const std::vector<uint8_t> after = kvsdk_test::snapshot(a.get());
  EXPECT_EQ(truncate(95), KVSDK_E_STATE) << "position 95 was in the window when 0..63 flushed";
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == after);
  check("refused after the re-append");
  ASSERT_EQ(truncate(109), KVSDK_OK) << kvsdk_last_error();
  check("the newest row");
  ASSERT_EQ(truncate(96), KVSDK_OK) << kvsdk_last_error();
  check("every row since the flush");
  EXPECT_EQ(read_rows(a.get(), 0, 1, g.head_dim).pos, kvsdk_test::iota_positions(96));
}

// --- Budget -------------------------------------------------------------------------------

// One-token appends in a filling arena re-lay it a few times (each head given a share of the room
// left, in key blocks), not at every block flush once growth by half no longer fits.
TEST(DeviceKiviBudget, OneTokenAppendsNearTheBudgetRarelyReLayTheArena) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy p = kivi_policy(2, 32, 32);
  CUDA_CONTEXT_OR_SKIP(gpu, 256 * 1024);
  ContextPtr cpu = kvsdk_test::make_context(256 * 1024, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(a && b) << kvsdk_last_error();
  std::vector<int32_t> relaid;  // the appends that changed the reserved bytes
  uint64_t reserved = stats(a.get()).device_reserved_bytes;
  int32_t t = 0;
  for (;; ++t) {
    const kvsdk_status x = append_at(a.get(), g, uint32_t(t % 2), {t / 2}, 40 + uint32_t(t));
    ASSERT_EQ(x, append_at(b.get(), g, uint32_t(t % 2), {t / 2}, 40 + uint32_t(t)));
    if (x != KVSDK_OK) break;
    const uint64_t now = stats(a.get()).device_reserved_bytes;
    if (now != reserved) relaid.push_back(t);
    reserved = now;
  }
  ASSERT_GT(t, 1000) << "the arena holds a thousand tokens and more";
  // Growth by half re-lays it about log1.5(tokens) times per layer and part; the last tenth of the
  // appends, where that no longer fits, a few times (laid out to the needs: at nearly each).
  const auto late = std::count_if(relaid.begin(), relaid.end(),
                                  [&](int32_t at) { return at >= t - t / 10; });
  EXPECT_LE(late, 6) << "of the last " << t / 10 << " appends";
  EXPECT_LE(relaid.size(), 2 * 30u) << "per layer: residual windows and key blocks";
  expect_same_rows(a.get(), b.get(), g);
}

// A CUDA context whose budget holds a few hundred kivi rows: appends fill it exactly as the CPU's
// do (the same charges, so the same appends fit); one that does not fit is KVSDK_E_BUDGET on
// both and changes nothing; the charges never exceed the budget and the device memory is the
// arena made with the context (plus attention's scratch).
TEST(DeviceKiviBudget, AnAppendThatDoesNotFitChangesNothing) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy p = kivi_policy(2, 32, 32);
  const uint64_t budget = 64 * 1024;
  KVSDK_REQUIRE_CUDA_DEVICE();  // (before measuring the device's memory)
  const uint64_t before = device_bytes_in_use();
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  const uint64_t arena = device_bytes_in_use() - before;
  EXPECT_GE(arena, budget);
  EXPECT_LE(arena, allocation_bound(budget)) << "one allocation of the budget";
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  std::vector<int32_t> next(g.n_layers, 0);
  int refusals = 0, accepted = 0;
  for (uint32_t round = 0; round < 400 && refusals < 12; ++round) {
    const uint32_t l = round % g.n_layers;
    // Mostly decode steps, with chunks that cross a flush (and, once full, one that never fits).
    const size_t n = round % 17 == 16 ? 40 : 1 + round % 3;
    const std::vector<uint8_t> snap = refusals < 3 ? kvsdk_test::snapshot(a.get())
                                                   : std::vector<uint8_t>();
    const kvsdk_cache_stats sb_before = stats(a.get());
    const auto pos = kvsdk_test::iota_positions(n, next[l]);
    const kvsdk_status x = append_at(a.get(), g, l, pos, 900 + round);
    const std::string why = kvsdk_last_error();
    const kvsdk_status y = append_at(b.get(), g, l, pos, 900 + round);
    ASSERT_EQ(x, y) << "round " << round << ", layer " << l << ", " << n << " tokens at "
                    << next[l] << ": " << why;
    if (x == KVSDK_OK) {
      next[l] += int32_t(n);
      ++accepted;
    } else {
      ASSERT_EQ(x, KVSDK_E_BUDGET) << why;
      ++refusals;
      // Nothing changed: the same bytes, and (the first times) the same snapshot.
      const kvsdk_cache_stats sa = stats(a.get());
      EXPECT_EQ(sa.bytes, sb_before.bytes);
      EXPECT_EQ(sa.tokens, sb_before.tokens);
      EXPECT_EQ(sa.appended_tokens, sb_before.appended_tokens);
      if (!snap.empty()) EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == snap) << "round " << round;
    }
    EXPECT_LE(kvsdk_test::used(gpu.get()), budget);
    EXPECT_LE(stats(a.get()).device_reserved_bytes, budget);
    EXPECT_LE(device_bytes_in_use() - before, arena + (64u << 10))
        << "the arena and attention scratch only";
    if (round % 5 == 0) {
      expect_same_attention(a.get(), b.get(), g, l, query_positions(0, std::max(next[l] - 1, 0)),
                            round);
      ASSERT_FALSE(HasFatalFailure()) << "round " << round;
    }
  }
  EXPECT_GT(accepted, 50);
  EXPECT_GE(refusals, 3) << "the budget was reached";
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    expect_same_attention(a.get(), b.get(), g, l, query_positions(0, next[l] - 1), 5 + l);
  }
  // The budget freed by destroying the cache is all there again.
  a.reset();
  EXPECT_EQ(kvsdk_test::used(gpu.get()), 0u);
  EXPECT_LE(device_bytes_in_use() - before, arena + (64u << 10));
}

// Caches of other policies share the arena with kivi caches: regions that must grow move the
// kivi stores on the device (codes, scales, residual window), and the rows stay the CPU's.
TEST(DeviceKiviBudget, SharesTheArenaWithOtherConversations) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy kivi = kivi_policy(4, 32, 32);
  const uint64_t budget = 512 * 1024;
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  std::vector<CachePtr> on_gpu, on_cpu;
  for (int i = 0; i < 3; ++i) {
    const kvsdk_policy* p = i == 1 ? nullptr : &kivi;  // kivi, full, kivi
    on_gpu.push_back(kvsdk_test::make_cache(gpu.get(), g, p));
    ASSERT_TRUE(on_gpu.back()) << kvsdk_last_error();
    on_cpu.push_back(kvsdk_test::make_cache(cpu.get(), g, p));
    ASSERT_TRUE(on_cpu.back()) << kvsdk_last_error();
  }
  const size_t steps[3] = {5, 2, 3};
  std::vector<int32_t> next(3, 0);
  for (uint32_t round = 0; round < 90; ++round) {
    const uint32_t i = round % 3;
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      append(on_gpu[i].get(), g, l, next[i], steps[i], 3000 + round * 4 + l);
      append(on_cpu[i].get(), g, l, next[i], steps[i], 3000 + round * 4 + l);
    }
    next[i] += int32_t(steps[i]);
    if (round % 9 == 0) {
      expect_same_attention(on_gpu[i].get(), on_cpu[i].get(), g, 1,
                            query_positions(0, next[i] - 1), round);
      ASSERT_FALSE(HasFatalFailure());
    }
  }
  EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));
  uint64_t reserved = 0;
  for (int i = 0; i < 3; ++i) {
    expect_same_rows(on_gpu[i].get(), on_cpu[i].get(), g);
    expect_same_accounting(on_gpu[i].get(), on_cpu[i].get(), g);
    reserved += stats(on_gpu[i].get()).device_reserved_bytes;
  }
  EXPECT_LE(reserved, budget);
  // A destroyed conversation's region goes to the others.
  on_gpu[1].reset();
  on_cpu[1].reset();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(on_gpu[0].get(), g, l, next[0], 100, 77 + l);
    append(on_cpu[0].get(), g, l, next[0], 100, 77 + l);
  }
  expect_same_rows(on_gpu[0].get(), on_cpu[0].get(), g);
  expect_same_rows(on_gpu[2].get(), on_cpu[2].get(), g);
  expect_same_attention(on_gpu[0].get(), on_cpu[0].get(), g, 0,
                        query_positions(0, next[0] + 99), 9);
}

// --- Forks and shared prefixes ---------------------------------------------------------------

// A fork copies the kivi stores (a region of its own in the arena) and continues on its own; a
// frozen kivi cache is the prefix of conversations of policy kivi. Same statuses and rows as on
// the CPU, and the original never changes.
TEST(DeviceKiviFork, ForksAndPrefixesMatchTheCpu) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 64);
  const kvsdk_policy p = kivi_policy(2, 32, 32);
  CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
  ContextPtr cpu = kvsdk_test::make_context(8u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, 80, 10 + l);
    append(b.get(), g, l, 0, 80, 10 + l);
  }
  const auto original = kvsdk_test::snapshot(b.get());
  kvsdk_cache* x = nullptr;
  kvsdk_cache* y = nullptr;
  ASSERT_EQ(kvsdk_cache_fork(&x, a.get()), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_fork(&y, b.get()), KVSDK_OK) << kvsdk_last_error();
  CachePtr fork_a(x), fork_b(y);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(fork_a.get(), g, l, 80, 40, 20 + l);  // a flush in the fork only
    append(fork_b.get(), g, l, 80, 40, 20 + l);
    expect_same_attention(fork_a.get(), fork_b.get(), g, l, {119, 50}, 30 + l);
  }
  expect_same_state(fork_a.get(), fork_b.get(), g, gpu.get(), cpu.get());
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == original) << "the original did not change";
  expect_same_rows(a.get(), b.get(), g);
  ASSERT_EQ(kvsdk_cache_freeze(a.get()), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_freeze(b.get()), KVSDK_OK) << kvsdk_last_error();
  append(a.get(), g, 0, 80, 1, 1, KVSDK_E_STATE);
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&x, a.get(), &p), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&y, b.get(), &p), KVSDK_OK) << kvsdk_last_error();
  CachePtr on_prefix_a(x), on_prefix_b(y);
  // Its own blocks: 70 tokens after the prefix's 80, flushing once (at 64 of its own rows).
  for (int32_t t = 80; t < 150; t += 7) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      append(on_prefix_a.get(), g, l, t, 7, 40 + uint32_t(t) + l);
      append(on_prefix_b.get(), g, l, t, 7, 40 + uint32_t(t) + l);
      if ((t - 80) % 21 != 0 && t + 7 < 150) continue;  // (attention in the shim is slow)
      // The newest position, one inside the prefix, one inside the conversation's own rows.
      expect_same_attention(on_prefix_a.get(), on_prefix_b.get(), g, l, {t + 6, 40, t - 10},
                            50 + uint32_t(t) + l);
      ASSERT_FALSE(HasFatalFailure()) << "on the prefix, position " << t;
    }
  }
  expect_same_rows(on_prefix_a.get(), on_prefix_b.get(), g);
  expect_same_accounting(on_prefix_a.get(), on_prefix_b.get(), g);
  EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));
}

// --- Host dtypes ----------------------------------------------------------------------------

// Hosts that speak f16 or bf16: rows come out in the host's dtype bit for bit as on the CPU
// (quantized rows dequantized, then rounded once; a NaN with a payload in the exact window comes
// back as it was given to f16 hosts), attention within one step of the host format's rounding.
TEST(DeviceKiviDtypes, HalfAndBfloatHostsMatchTheCpu) {
  for (kvsdk_dtype dtype : {KVSDK_DTYPE_F16, KVSDK_DTYPE_BF16}) {
    SCOPED_TRACE(dtype == KVSDK_DTYPE_F16 ? "f16" : "bf16");
    const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 128, dtype);
    const kvsdk_policy p = kivi_policy(4, 32, 32);
    CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
    ContextPtr cpu = kvsdk_test::make_context(8u << 20, KVSDK_BACKEND_CPU_REFERENCE);
    CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
    ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
    CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
    ASSERT_TRUE(b) << kvsdk_last_error();
    std::mt19937 rng(7);
    int32_t next = 0;
    const auto feed = [&](size_t n, bool nan_in_last) {
      const size_t elems = n * g.n_kv_heads * g.head_dim;
      std::vector<uint16_t> k(elems), v(elems);
      for (size_t i = 0; i < elems; ++i) {
        k[i] = uint16_t(rng() & 0x3fff), v[i] = uint16_t(rng() & 0x3fff);
      }
      const auto pos = kvsdk_test::iota_positions(n, next);
      for (uint32_t l = 0; l < g.n_layers; ++l) {
        // Layer 0's newest token (which stays in the exact window) holds a NaN with a payload;
        // layer 1, which the queries attend, only finite values.
        std::vector<uint16_t> kl = k;
        if (l == 0 && nan_in_last) kl[elems - 3] = 0x7e01;
        for (kvsdk_cache* c : {a.get(), b.get()}) {
          ASSERT_EQ(kvsdk_cache_append(c, l, n, kl.data(), v.data(), pos.data(), elems * 2),
                    KVSDK_OK)
              << kvsdk_last_error();
        }
      }
      next += int32_t(n);
    };
    feed(70, false);  // a flush in the chunk
    for (int i = 0; i < 30; ++i) feed(1, i == 29);  // another one token at a time
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
        const size_t n = size_t(next);
        std::vector<uint16_t> ka(n * g.head_dim), kb(ka.size()), va(ka.size()), vb(ka.size());
        size_t na = 0, nb = 0;
        ASSERT_EQ(kvsdk_cache_read(a.get(), l, h, ka.data(), va.data(), nullptr, n, &na),
                  KVSDK_OK)
            << kvsdk_last_error();
        ASSERT_EQ(kvsdk_cache_read(b.get(), l, h, kb.data(), vb.data(), nullptr, n, &nb),
                  KVSDK_OK);
        ASSERT_EQ(na, nb);
        EXPECT_EQ(ka, kb) << "keys, layer " << l << " head " << h;
        EXPECT_EQ(va, vb) << "values, layer " << l << " head " << h;
      }
    }
    std::vector<uint16_t> q(2 * size_t(g.n_q_heads) * g.head_dim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = uint16_t(rng() & 0x3bff);
    const int32_t qpos[2] = {next - 1, 40};  // everything, and a mask inside the quantized rows
    std::vector<uint16_t> oa(q.size()), ob(q.size());
    ASSERT_EQ(kvsdk_cache_attend(a.get(), 1, 2, q.data(), qpos, q.size() * 2, oa.data(),
                                 oa.size() * 2),
              KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_attend(b.get(), 1, 2, q.data(), qpos, q.size() * 2, ob.data(),
                                 ob.size() * 2),
              KVSDK_OK);
    for (size_t i = 0; i < oa.size(); ++i) {
      // Within one step of the host format's rounding (2e-4 before it).
      EXPECT_LE(std::abs(int(oa[i]) - int(ob[i])), 1) << "element " << i;
    }
    expect_same_accounting(a.get(), b.get(), g);
    EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == kvsdk_test::snapshot(b.get()));
  }
}

// --- Bad input ------------------------------------------------------------------------------

// Calls with bad arguments fail on a CUDA kivi cache with the CPU's status (never OK), leave the
// output buffers and the cache as they were, and the cache works on afterwards.
TEST(DeviceKiviBadInput, FailsLikeTheCpu) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy p = kivi_policy(2, 32, 32);
  CUDA_CONTEXT_OR_SKIP(gpu, 4u << 20);
  ContextPtr cpu = kvsdk_test::make_context(4u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  // Policies kivi refuses: the same status on a CUDA context.
  for (int variant = 0; variant < 4; ++variant) {
    kvsdk_policy bad = p;
    if (variant == 0) bad.quant_bits = 0;
    if (variant == 1) bad.quant_bits = 3;
    if (variant == 2) bad.quant_group = 0;
    if (variant == 3) bad.quant_residual = -2;
    kvsdk_cache* x = nullptr;
    kvsdk_cache* y = nullptr;
    const kvsdk_status sx = kvsdk_cache_create(&x, gpu.get(), &g, &bad);
    const kvsdk_status sy = kvsdk_cache_create(&y, cpu.get(), &g, &bad);
    EXPECT_EQ(sx, sy) << "policy variant " << variant << ": " << kvsdk_last_error();
    EXPECT_NE(sx, KVSDK_OK) << "policy variant " << variant;
    EXPECT_EQ(x, nullptr);
    kvsdk_cache_destroy(x);
    kvsdk_cache_destroy(y);
  }
  EXPECT_EQ(kvsdk_test::used(gpu.get()), 0u);

  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "kivi on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, 70, 10 + l);  // a flush: quantized blocks and a residual window
    append(b.get(), g, l, 0, 70, 10 + l);
  }
  const auto before = kvsdk_test::snapshot(a.get());
  // Runs `call` on both caches: the same status, not OK.
  const auto both = [&](const std::string& what, auto call) {
    const kvsdk_status x = call(a.get());
    const std::string why = kvsdk_last_error();
    const kvsdk_status y = call(b.get());
    EXPECT_EQ(x, y) << what << ": " << why << " / " << kvsdk_last_error();
    EXPECT_NE(x, KVSDK_OK) << what;
  };
  const size_t n = 3, elems = n * g.n_kv_heads * g.head_dim, bytes = elems * sizeof(float);
  const auto k = kvsdk_test::random_floats(elems, 1), v = kvsdk_test::random_floats(elems, 2);
  const auto pos = kvsdk_test::iota_positions(n, 70);
  // Appends.
  both("append: layer out of range", [&](kvsdk_cache* c) {
    return kvsdk_cache_append(c, g.n_layers, n, k.data(), v.data(), pos.data(), bytes);
  });
  both("append: NULL keys", [&](kvsdk_cache* c) {
    return kvsdk_cache_append(c, 0, n, nullptr, v.data(), pos.data(), bytes);
  });
  both("append: NULL values", [&](kvsdk_cache* c) {
    return kvsdk_cache_append(c, 0, n, k.data(), nullptr, pos.data(), bytes);
  });
  both("append: NULL positions", [&](kvsdk_cache* c) {
    return kvsdk_cache_append(c, 0, n, k.data(), v.data(), nullptr, bytes);
  });
  both("append: no tokens", [&](kvsdk_cache* c) {
    return kvsdk_cache_append(c, 0, 0, k.data(), v.data(), pos.data(), 0);
  });
  for (size_t wrong : {bytes - 4, bytes + 4, bytes / 2}) {
    both("append: kv_bytes " + std::to_string(wrong), [&](kvsdk_cache* c) {
      return kvsdk_cache_append(c, 1, n, k.data(), v.data(), pos.data(), wrong);
    });
  }
  for (int32_t bad : {-1, INT32_MAX}) {
    std::vector<int32_t> bad_pos = pos;
    bad_pos[1] = bad;
    both("append: position " + std::to_string(bad), [&](kvsdk_cache* c) {
      return kvsdk_cache_append(c, 0, n, k.data(), v.data(), bad_pos.data(), bytes);
    });
  }
  both("append: NULL cache", [&](kvsdk_cache*) {
    return kvsdk_cache_append(nullptr, 0, n, k.data(), v.data(), pos.data(), bytes);
  });
  // Attention: the output stays untouched.
  const size_t q_elems = 2 * size_t(g.n_q_heads) * g.head_dim, q_bytes = q_elems * sizeof(float);
  const auto q = kvsdk_test::random_floats(q_elems, 3);
  const std::vector<int32_t> qpos{69, 20};
  std::vector<float> out(q_elems, 42.0f);
  const auto attend_bad = [&](const std::string& what, uint32_t layer, size_t nq, const void* qp,
                              const int32_t* pp, size_t qb, void* op, size_t ob) {
    both("attend: " + what, [&](kvsdk_cache* c) {
      return kvsdk_cache_attend(c, layer, nq, qp, pp, qb, op, ob);
    });
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 42.0f; }))
        << "attend: " << what << " wrote its output";
  };
  attend_bad("layer out of range", g.n_layers, 2, q.data(), qpos.data(), q_bytes, out.data(),
             q_bytes);
  attend_bad("NULL queries", 0, 2, nullptr, qpos.data(), q_bytes, out.data(), q_bytes);
  attend_bad("NULL output", 0, 2, q.data(), qpos.data(), q_bytes, nullptr, q_bytes);
  attend_bad("no queries", 0, 0, q.data(), qpos.data(), 0, out.data(), 0);
  attend_bad("q_bytes short", 0, 2, q.data(), qpos.data(), q_bytes - 4, out.data(), q_bytes);
  attend_bad("out_bytes short", 0, 2, q.data(), qpos.data(), q_bytes, out.data(), q_bytes - 4);
  attend_bad("out_bytes long", 1, 2, q.data(), qpos.data(), q_bytes, out.data(), q_bytes + 4);
  const std::vector<int32_t> bad_qpos{69, -5};
  attend_bad("query position -5", 1, 2, q.data(), bad_qpos.data(), q_bytes, out.data(), q_bytes);
  // Reads.
  std::vector<float> rk(70 * g.head_dim), rv(rk.size());
  std::vector<int32_t> rp(70);
  size_t got = 0;
  both("read: layer out of range", [&](kvsdk_cache* c) {
    return kvsdk_cache_read(c, g.n_layers, 0, rk.data(), rv.data(), rp.data(), 70, &got);
  });
  both("read: KV head out of range", [&](kvsdk_cache* c) {
    return kvsdk_cache_read(c, 0, g.n_kv_heads, rk.data(), rv.data(), rp.data(), 70, &got);
  });
  both("read: NULL count", [&](kvsdk_cache* c) {
    return kvsdk_cache_read(c, 0, 0, rk.data(), rv.data(), rp.data(), 70, nullptr);
  });
  both("read: capacity too small", [&](kvsdk_cache* c) {
    return kvsdk_cache_read(c, 1, 1, rk.data(), rv.data(), rp.data(), 69, &got);
  });
  both("layer_stats: layer out of range", [&](kvsdk_cache* c) {
    kvsdk_layer_stats s;
    kvsdk_layer_stats_init(&s);
    return kvsdk_cache_layer_stats_get(c, g.n_layers, &s);
  });
  both("stats: NULL", [&](kvsdk_cache* c) { return kvsdk_cache_stats_get(c, nullptr); });
  both("save_to_buffer: too small", [&](kvsdk_cache* c) {
    std::vector<uint8_t> small(16);
    size_t size = 0;
    return kvsdk_cache_save_to_buffer(c, nullptr, small.data(), small.size(), &size);
  });
  both("save_delta: never saved", [&](kvsdk_cache* c) {
    kvsdk_test::TempDir dir;
    return kvsdk_cache_save_delta(c, dir.file("none.kvsnap").c_str(), nullptr);
  });
  both("truncate: position -3", [&](kvsdk_cache* c) { return kvsdk_cache_truncate(c, -3); });
  both("truncate: into a quantized block", [&](kvsdk_cache* c) {
    return kvsdk_cache_truncate(c, 10);
  });
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == before) << "the failed calls changed nothing";
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
  // The calls of other policies' stages (observation, compression, budgets, allocations,
  // prefetch): whatever kivi answers on the CPU, it answers on CUDA, to the same effect.
  const auto same = [&](const std::string& what, auto call) {
    const kvsdk_status x = call(a.get());
    const std::string why = kvsdk_last_error();
    const kvsdk_status y = call(b.get());
    EXPECT_EQ(x, y) << what << ": " << why << " / " << kvsdk_last_error();
  };
  const auto q1 = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 4);
  const int32_t q1_pos = 69;
  same("observe", [&](kvsdk_cache* c) {
    return kvsdk_cache_observe(c, 0, 1, q1.data(), &q1_pos, q1.size() * sizeof(float));
  });
  same("compress", [](kvsdk_cache* c) { return kvsdk_cache_compress(c); });
  same("set_budget (below the rows)", [](kvsdk_cache* c) { return kvsdk_cache_set_budget(c, 4096); });
  same("set_budget (none)", [](kvsdk_cache* c) { return kvsdk_cache_set_budget(c, 0); });
  const std::vector<uint64_t> alloc{40, 40};
  same("set_allocation", [&](kvsdk_cache* c) {
    return kvsdk_cache_set_allocation(c, alloc.data(), uint32_t(alloc.size()));
  });
  same("prefetch", [&](kvsdk_cache* c) {
    return kvsdk_cache_prefetch(c, 0, 1, q1.data(), &q1_pos, q1.size() * sizeof(float));
  });
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
  // The cache goes on.
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 70, 30, 50 + l);
    append(b.get(), g, l, 70, 30, 50 + l);
    expect_same_attention(a.get(), b.get(), g, l, query_positions(0, 99), 60 + l);
  }
  expect_same_state(a.get(), b.get(), g, gpu.get(), cpu.get());
}

}  // namespace
