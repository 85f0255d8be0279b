// Caches on a CUDA context through the C API, against the same calls on the CPU reference
// backend (the oracle): rows bit for bit, attention within the decode kernel's tolerance (2e-4
// absolute, f32 sums in another order), bytes and budget charges equal, snapshots interchangeable.
//
// Built twice: with CUDA (cuda_backend_test; skipped with the driver's reason when no GPU is
// present, after checking that the context reports KVSDK_E_BACKEND), and without it against the
// host execution shim (cuda_host_cache_test), where every call below runs the CUDA backend's own
// code and kernels on the CPU, with device memory that the host never reads directly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "cuda_ops.h"
#include "cuda_queue.h"
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

uint64_t stats_bytes(kvsdk_cache* c) { return stats(c).bytes; }

struct Shape {
  uint32_t layers, q_heads, kv_heads, dim;
};

class DeviceCache : public ::testing::TestWithParam<Shape> {};

// A conversation: a prefill chunk attended causally, then decode steps (append one token to every
// layer, attend), with layers growing in turn so the arena re-plans and moves rows between them.
TEST_P(DeviceCache, ConversationMatchesTheCpuReference) {
  const Shape s = GetParam();
  const kvsdk_geometry g = kvsdk_test::make_geometry(s.layers, s.q_heads, s.kv_heads, s.dim);
  CUDA_CONTEXT_OR_SKIP(gpu, 64u << 20);
  ContextPtr cpu = kvsdk_test::make_context(64u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g), b = kvsdk_test::make_cache(cpu.get(), g);
  ASSERT_TRUE(a && b) << kvsdk_last_error();
  const size_t q_elems = size_t(s.q_heads) * s.dim;
  const size_t prefill = 37;
  for (uint32_t l = 0; l < s.layers; ++l) {
    append(a.get(), g, l, 0, prefill, 100 + l);
    append(b.get(), g, l, 0, prefill, 100 + l);
    // The chunk's own queries, causal: query i sees positions 0..i (and one sees everything).
    std::vector<int32_t> qpos = kvsdk_test::iota_positions(prefill);
    qpos[5] = INT32_MAX;
    const auto q = kvsdk_test::random_floats(prefill * q_elems, 200 + l);
    const auto x = attend(a.get(), g, l, q, qpos), y = attend(b.get(), g, l, q, qpos);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4) << "prefill layer " << l;
  }
  for (int32_t step = 0; step < 24; ++step) {
    const int32_t pos = int32_t(prefill) + step;
    for (uint32_t l = 0; l < s.layers; ++l) {
      // Layer 0 takes two tokens a step, so it outgrows the others and the arena re-plans.
      const size_t n = l == 0 ? 2 : 1;
      append(a.get(), g, l, pos * 2, n, 300 + uint32_t(step) * 7 + l);
      append(b.get(), g, l, pos * 2, n, 300 + uint32_t(step) * 7 + l);
      const auto q = kvsdk_test::random_floats(q_elems, 900 + uint32_t(step) + l);
      const std::vector<int32_t> qpos{pos * 2 + 1};
      const auto x = attend(a.get(), g, l, q, qpos), y = attend(b.get(), g, l, q, qpos);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4) << "step " << step;
    }
  }
  expect_same_rows(a.get(), b.get(), g);
  const kvsdk_cache_stats sa = stats(a.get()), sb = stats(b.get());
  EXPECT_EQ(sa.bytes, sb.bytes);
  EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));
  // The arena in the stats: the budget, of which the layers' capacities cover at least the rows.
  EXPECT_EQ(sa.device_arena_bytes, 64u << 20);
  EXPECT_GE(sa.device_reserved_bytes, sa.bytes_by_tier[KVSDK_TIER_EXACT] +
                                           sa.bytes_by_tier[KVSDK_TIER_METADATA]);
  EXPECT_LE(sa.device_reserved_bytes, sa.device_arena_bytes);
  EXPECT_EQ(sb.device_arena_bytes, 0u);
  EXPECT_EQ(sb.device_reserved_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeviceCache,
                         ::testing::Values(Shape{3, 8, 2, 64}, Shape{2, 4, 4, 128},
                                           Shape{2, 16, 2, 256}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "q" + std::to_string(s.q_heads) + "_kv" +
                                  std::to_string(s.kv_heads) + "_dim" + std::to_string(s.dim);
                         });

// The eviction presets that run on CUDA, under a context budget that makes them evict every few
// steps: the selection stage scores on the host from keys copied out of the arena and the kept
// rows are compacted on the device, so the rows must be the CPU's bit for bit (the same
// selection), attention within tolerance, and the arena never more than the budget.
// `group`: KIVI's G under a '+kiviN' overlay (small, so that evictions leave ragged key blocks).
void evicting_conversation(const char* spec, int32_t group) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(3, 8, 2, 64);
  const uint64_t budget = 48 * 1024;  // ~48 exact tokens of 3 layers: evictions every few steps
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  const kvsdk_policy p = kvsdk_test::small_policy(spec, group);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p), b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(a && b) << kvsdk_last_error();
  const size_t q_elems = size_t(g.n_q_heads) * g.head_dim;
  const auto step = [&](kvsdk_cache* c, uint32_t layer, int32_t pos, size_t n, uint32_t seed,
                        std::vector<float>* out) {
    append(c, g, layer, pos, n, seed);
    const auto q = kvsdk_test::random_floats(q_elems, seed + 7);
    const std::vector<int32_t> qpos{pos + int32_t(n) - 1};
    ASSERT_EQ(kvsdk_cache_observe(c, layer, 1, q.data(), qpos.data(), q.size() * sizeof(float)),
              KVSDK_OK)
        << kvsdk_last_error();
    *out = attend(c, g, layer, q, qpos);
  };
  int32_t pos = 0;
  kvsdk_test::TempDir dir;
  const std::string fa = dir.file("gpu.kvsnap"), fb = dir.file("cpu.kvsnap");
  for (int round = 0; round < 40; ++round) {
    const size_t n = round == 0 ? 20 : 1 + size_t(round % 3);  // a prefill, then short steps
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      std::vector<float> x, y;
      step(a.get(), l, pos, n, 1000 + uint32_t(round) * 10 + l, &x);
      step(b.get(), l, pos, n, 1000 + uint32_t(round) * 10 + l, &y);
      ASSERT_EQ(x.size(), y.size());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(x[i], y[i], 2e-4) << "round " << round << " layer " << l;
      }
    }
    pos += int32_t(n);
    // Files along the way, then journal deltas over the evictions between them.
    if (round == 20 || round == 30 || round == 39) {
      for (auto [c, f] : {std::pair{a.get(), fa}, std::pair{b.get(), fb}}) {
        ASSERT_EQ(round == 20 ? kvsdk_cache_save(c, f.c_str(), nullptr)
                              : kvsdk_cache_save_delta(c, f.c_str(), nullptr),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
      EXPECT_TRUE(file_bytes(fa) == file_bytes(fb)) << "the files after round " << round;
    }
  }
  expect_same_rows(a.get(), b.get(), g);
  const kvsdk_cache_stats sa = stats(a.get()), sb = stats(b.get());
  EXPECT_EQ(sa.bytes, sb.bytes);
  EXPECT_LT(sa.tokens, uint64_t(pos) * g.n_layers * g.n_kv_heads) << "it evicted";
  EXPECT_LE(sa.device_reserved_bytes, budget);
  EXPECT_LE(sa.bytes, budget);
  if (p.quant_bits != 0) {
    EXPECT_GT(sa.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u) << "it quantized";
  }
  // The policy's own state (h2o's accumulated scores, the observation windows) and the stores
  // (ragged KIVI blocks included) save alike, and each snapshot loads on the other backend.
  const auto from_gpu = kvsdk_test::snapshot(a.get()), from_cpu = kvsdk_test::snapshot(b.get());
  EXPECT_TRUE(from_gpu == from_cpu);
  a.reset();  // (the budget holds one cache)
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, gpu.get(), from_cpu.data(), from_cpu.size(), &g,
                                         nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_gpu(loaded);
  expect_same_rows(on_gpu.get(), b.get(), g);
  // The loaded cache continues like the CPU one: appends, attention, evictions.
  for (int round = 0; round < 6; ++round) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      std::vector<float> x, y;
      step(on_gpu.get(), l, pos, 1, 5000 + uint32_t(round) * 10 + l, &x);
      step(b.get(), l, pos, 1, 5000 + uint32_t(round) * 10 + l, &y);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4) << "after the load";
    }
    pos += 1;
  }
  expect_same_rows(on_gpu.get(), b.get(), g);
}

class DeviceEviction : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceEviction, ConversationMatchesTheCpuReference) {
  evicting_conversation(GetParam(), 32);
}

// The arena is partitioned by the allocation: after a global plan (here a host-set allocation,
// as a planner or an XKV re-plan gives), each layer's slices hold exactly its cap of rows, and
// they stay so while the layers evict within their shares.
TEST(DeviceAllocation, TheArenaFollowsThePerLayerAllocation) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(3, 8, 2, 64);
  const uint64_t row = uint64_t(g.n_kv_heads) * (g.head_dim * 4 + 4);  // a layer-token's bytes
  CUDA_CONTEXT_OR_SKIP(gpu, 256 * 1024);
  const kvsdk_policy p = kvsdk_test::small_policy("xkv", 32);
  CachePtr c = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 0, 40, 60 + l);
  const std::vector<uint64_t> alloc{12, 30, 7};
  ASSERT_EQ(kvsdk_cache_set_allocation(c.get(), alloc.data(), alloc.size()), KVSDK_OK)
      << kvsdk_last_error();
  const uint64_t planned = (12 + 30 + 7) * row;
  EXPECT_EQ(stats(c.get()).device_reserved_bytes, planned);
  for (int32_t t = 40; t < 100; ++t) {
    for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, t, 1, 900 + uint32_t(t) + l);
  }
  std::vector<uint64_t> now(g.n_layers);
  ASSERT_EQ(kvsdk_cache_allocation(c.get(), now.data(), now.size()), KVSDK_OK);
  for (uint32_t l = 0; l < g.n_layers; ++l) EXPECT_LE(now[l], alloc[l]) << "layer " << l;
  EXPECT_EQ(stats(c.get()).device_reserved_bytes, planned);
}

INSTANTIATE_TEST_SUITE_P(Presets, DeviceEviction,
                         ::testing::Values("streaming_llm", "h2o", "snapkv", "pyramidkv", "xkv"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// The '+kiviN' overlays: eviction over KIVI stores (ragged key blocks, heads holding different
// tokens), with G = 8 so that blocks are quantized and then cut by evictions within the run.
class DeviceKiviEviction : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceKiviEviction, ConversationMatchesTheCpuReference) {
  evicting_conversation(GetParam(), 8);
}

INSTANTIATE_TEST_SUITE_P(Overlays, DeviceKiviEviction,
                         ::testing::Values("streaming_llm+kivi2", "h2o+kivi4", "snapkv+kivi2",
                                           "pyramidkv+kivi8", "xkv+kivi1"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name(info.param);
                           std::replace(name.begin(), name.end(), '+', '_');
                           return name;
                         });

// The arena is one allocation of exactly the budget, made with the context; appends allocate no
// other device memory, and rows fill the budget to the last byte (the re-plan to exact sizes).
// An append beyond it is KVSDK_E_BUDGET and changes nothing.
TEST(DeviceCacheBudget, RowsFillTheArenaAndNeverExceedIt) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(3, 4, 2, 64);
  const uint64_t row = uint64_t(g.n_kv_heads) * (g.head_dim * 4 + 4);  // a layer-token's bytes
  const uint64_t budget = 40 * row * g.n_layers;
  KVSDK_REQUIRE_CUDA_DEVICE();  // (before measuring the device's memory)
  const uint64_t before = device_bytes_in_use();
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  const uint64_t arena = device_bytes_in_use() - before;
  EXPECT_GE(arena, budget);
  EXPECT_LE(arena, allocation_bound(budget)) << "one allocation of the budget";
  CachePtr c = kvsdk_test::make_cache(gpu.get(), g);
  ASSERT_TRUE(c) << kvsdk_last_error();
  // Uneven growth: layer 2 first grows by half, then the others need the room it reserved.
  for (int32_t t = 0; t < 40; t += 4) append(c.get(), g, 2, t, 4, 10 + uint32_t(t));
  for (int32_t t = 0; t < 40; ++t) {
    append(c.get(), g, 0, t, 1, 500 + uint32_t(t));
    append(c.get(), g, 1, t, 1, 700 + uint32_t(t));
  }
  EXPECT_EQ(device_bytes_in_use() - before, arena) << "appends allocate no device memory";
  EXPECT_EQ(kvsdk_test::used(gpu.get()), budget);
  EXPECT_EQ(stats(c.get()).device_reserved_bytes, budget) << "laid out to the last byte";
  const auto rows_before = read_rows(c.get(), 1, 1, g.head_dim);
  append(c.get(), g, 1, 40, 1, 9, KVSDK_E_BUDGET);
  EXPECT_EQ(kvsdk_test::used(gpu.get()), budget);
  const auto rows_after = read_rows(c.get(), 1, 1, g.head_dim);
  EXPECT_EQ(rows_before.pos, rows_after.pos);
  EXPECT_EQ(rows_before.k, rows_after.k);
  // The same rows as a CPU cache given the same appends.
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr r = kvsdk_test::make_cache(cpu.get(), g);
  for (int32_t t = 0; t < 40; t += 4) append(r.get(), g, 2, t, 4, 10 + uint32_t(t));
  for (int32_t t = 0; t < 40; ++t) {
    append(r.get(), g, 0, t, 1, 500 + uint32_t(t));
    append(r.get(), g, 1, t, 1, 700 + uint32_t(t));
  }
  expect_same_rows(c.get(), r.get(), g);
}

// One-token appends once growth by half no longer fits: the arena is re-laid a few times (each
// layer given a share of the room left), not on every append. Laid out to exactly the needed
// rows, every append re-laid it, moving every slice behind the growing layer's by a row in
// overlapping row-sized chunks (a GPU run's 32k-token decode-step benchmark never finished).
TEST(DeviceCacheBudget, OneTokenAppendsNearTheBudgetRarelyReLayTheArena) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(3, 4, 2, 64);
  const uint64_t row = uint64_t(g.n_kv_heads) * (g.head_dim * 4 + 4);
  const uint64_t budget = 200 * row * g.n_layers;
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  CachePtr c = kvsdk_test::make_cache(gpu.get(), g);
  ASSERT_TRUE(c) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 0, 120, 3 + l);
  int relayouts = 0;
  uint64_t reserved = stats(c.get()).device_reserved_bytes;
  for (int32_t t = 120; t < 200; ++t) {
    for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, t, 1, 100 + uint32_t(t));
    const uint64_t now = stats(c.get()).device_reserved_bytes;
    relayouts += now != reserved;
    reserved = now;
  }
  EXPECT_LE(relayouts, 12) << "of 240 one-token appends";
  EXPECT_EQ(kvsdk_test::used(gpu.get()), budget);
  append(c.get(), g, 0, 200, 1, 9, KVSDK_E_BUDGET);
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr r = kvsdk_test::make_cache(cpu.get(), g);
  for (uint32_t l = 0; l < g.n_layers; ++l) append(r.get(), g, l, 0, 120, 3 + l);
  for (int32_t t = 120; t < 200; ++t) {
    for (uint32_t l = 0; l < g.n_layers; ++l) append(r.get(), g, l, t, 1, 100 + uint32_t(t));
  }
  expect_same_rows(c.get(), r.get(), g);
}

// Snapshots: a CUDA cache saves the same bytes as a CPU cache of the same rows, and each loads
// into the other backend with the same rows and attention.
TEST(DeviceCacheSnapshot, SavesAndLoadsAcrossBackends) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 128);
  CUDA_CONTEXT_OR_SKIP(gpu, 16u << 20);
  // (The same budget: snapshots record the context budget they were saved under.)
  ContextPtr cpu = kvsdk_test::make_context(16u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g), b = kvsdk_test::make_cache(cpu.get(), g);
  ASSERT_TRUE(a && b);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, 50, 40 + l);
    append(b.get(), g, l, 0, 50, 40 + l);
  }
  const auto from_gpu = kvsdk_test::snapshot(a.get()), from_cpu = kvsdk_test::snapshot(b.get());
  EXPECT_TRUE(from_gpu == from_cpu) << "the same rows (and budget) make the same file";
  // A targeted save converts on the host: the same file as from the CPU cache.
  for (const char* spec : {"kivi", "h2o"}) {
    kvsdk_save_options opt;
    kvsdk_save_options_init(&opt);
    kvsdk_policy target;
    ASSERT_EQ(kvsdk_policy_parse(&target, spec), KVSDK_OK);
    opt.target_policy = &target;
    opt.target_budget_bytes = std::string(spec) == "h2o" ? 40 * 1024 : 0;  // kivi: as it is
    std::vector<uint8_t> x(1 << 20), y(1 << 20);
    size_t nx = 0, ny = 0;
    ASSERT_EQ(kvsdk_cache_save_to_buffer(a.get(), &opt, x.data(), x.size(), &nx), KVSDK_OK)
        << spec << ": " << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_save_to_buffer(b.get(), &opt, y.data(), y.size(), &ny), KVSDK_OK)
        << spec << ": " << kvsdk_last_error();
    x.resize(nx), y.resize(ny);
    EXPECT_TRUE(x == y) << spec;
  }
  a.reset();  // the CUDA context holds one cache at a time
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, gpu.get(), from_cpu.data(), from_cpu.size(),
                                         &g, nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_gpu(loaded);
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, cpu.get(), from_gpu.data(), from_gpu.size(),
                                         &g, nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_cpu(loaded);
  expect_same_rows(on_gpu.get(), b.get(), g);
  expect_same_rows(on_cpu.get(), b.get(), g);
  const auto q = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 5);
  const std::vector<int32_t> qpos{50};
  const auto x = attend(on_gpu.get(), g, 1, q, qpos), y = attend(b.get(), g, 1, q, qpos);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4);
  // Continuing after the load: the loaded CUDA cache appends and truncates like the CPU one.
  append(on_gpu.get(), g, 0, 50, 3, 77);
  append(b.get(), g, 0, 50, 3, 77);
  ASSERT_EQ(kvsdk_cache_truncate(on_gpu.get(), 48), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_truncate(b.get(), 48), KVSDK_OK) << kvsdk_last_error();
  expect_same_rows(on_gpu.get(), b.get(), g);
  EXPECT_EQ(stats_bytes(on_gpu.get()), stats_bytes(b.get()));
}

// A batch of host -> device copies (Ops::to_backend_many: a DeviceRows append) lands byte for
// byte: empty, tiny and odd pieces sharing a staging half, and pieces larger than a half.
TEST(DeviceQueueCopies, ABatchLandsLikeTheCopiesOneByOne) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const size_t half = kvsdk::cuda::kStagingHalfBytes;
  const std::vector<size_t> sizes{0, 3, half - 1, 5, 2 * half + half / 2, 17, half, 1};
  size_t total = 0;
  for (size_t n : sizes) total += n;
  std::vector<uint8_t> host(total);
  std::mt19937 rng(7);
  for (uint8_t& b : host) b = uint8_t(rng());
  kvsdk::cuda::test::DeviceBuffer<uint8_t> dst(total);
  ASSERT_TRUE(dst.get());
  std::vector<kvsdk::backend::HostCopy> copies;
  size_t at = 0;
  for (size_t i = sizes.size(); i-- > 0;) {  // in reverse: destinations need not be in order
    size_t off = 0;
    for (size_t j = 0; j < i; ++j) off += sizes[j];
    copies.push_back({dst.get() + off, host.data() + off, sizes[i]});
    at += sizes[i];
  }
  ASSERT_EQ(at, total);
  kvsdk::backend::DeviceQueue* queue = kvsdk::cuda::queue_create();
  kvsdk::cuda::bind_queue(queue);
  kvsdk::cuda::copy_many_to_device(copies.data(), copies.size());
  kvsdk::cuda::bind_queue(nullptr);
  kvsdk::cuda::queue_destroy(queue);
  EXPECT_TRUE(dst.download() == host);
}

#ifdef KVSDK_CUDA_HOST_SHIM
// Every transfer of a device cache goes through its context's pinned staging buffers (the shim
// counts copies by whether their host side was pinned), in pieces of the staging halves when it
// is larger, with the same rows as the CPU; and the context's queue is bound to the calling
// thread only for the duration of a call.
TEST(DeviceCacheStaging, EveryTransferGoesThroughPinnedStaging) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 128);
  ContextPtr cpu = kvsdk_test::make_context(64u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CUDA_CONTEXT_OR_SKIP(gpu, 64u << 20);
  const kvsdk::cuda_host::TransferBytes before = kvsdk::cuda_host::transfer_bytes();
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g), b = kvsdk_test::make_cache(cpu.get(), g);
  ASSERT_TRUE(a && b);
  // 3000 rows a head: 750 KiB of keys (and of values) per head and layer, so one append moves
  // 1.5 MiB of keys through the 1 MiB halves in two pieces.
  const size_t n = 3000;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, n, 60 + l);
    append(b.get(), g, l, 0, n, 60 + l);
  }
  EXPECT_EQ(kvsdk::cuda::bound_queue(), nullptr) << "the binding ends with the call";
  const auto q = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 9);
  const std::vector<int32_t> qpos{int32_t(n)};
  const auto x = attend(a.get(), g, 1, q, qpos), y = attend(b.get(), g, 1, q, qpos);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4);
  const auto saved = kvsdk_test::snapshot(a.get());
  EXPECT_TRUE(saved == kvsdk_test::snapshot(b.get()));
  a.reset();
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, gpu.get(), saved.data(), saved.size(), &g,
                                         nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr again(loaded);
  expect_same_rows(again.get(), b.get(), g);
  const kvsdk::cuda_host::TransferBytes after = kvsdk::cuda_host::transfer_bytes();
  EXPECT_EQ(after.to_device_pageable, before.to_device_pageable);
  EXPECT_EQ(after.to_host_pageable, before.to_host_pageable);
  // Rows in twice (append, load) and out at least twice (save, read), keys and values.
  const unsigned long long rows = 2ull * g.n_layers * g.n_kv_heads * n * g.head_dim * 2;
  EXPECT_GE(after.to_device_pinned - before.to_device_pinned, 2 * rows);
  EXPECT_GE(after.to_host_pinned - before.to_host_pinned, 2 * rows);
}

// A decode step (append one token, attend one query, per layer) makes the host wait for the
// device the same number of times whatever the number of KV heads: the heads' rows go in one
// batch and their queries and outputs in one transfer each (a GPU round trip is tens of
// microseconds; per head, they are the likely bulk of the 660 us step measured on the H200).
TEST(DeviceCacheStaging, ADecodeStepWaitsForTheDeviceAsOftenWhateverTheHeads) {
  for (const char* spec : {"full", "kivi"}) {
    unsigned long long waits[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const uint32_t kv = i == 0 ? 2 : 8;
      SCOPED_TRACE(std::string(spec) + ", " + std::to_string(kv) + " KV heads");
      const kvsdk_geometry g = kvsdk_test::make_geometry(2, 2 * kv, kv, 64);
      CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
      kvsdk_policy p;
      ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
      CachePtr c = kvsdk_test::make_cache(gpu.get(), g, &p);
      ASSERT_TRUE(c) << kvsdk_last_error();
      for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 0, 40, 5 + l);
      const auto q = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 6);
      // Step 40 grows the layers' capacity (a re-layout, amortized); step 41 is the steady state.
      unsigned long long before = 0;
      for (int32_t t = 40; t < 42; ++t) {
        before = kvsdk::cuda_host::host_waits();
        for (uint32_t l = 0; l < g.n_layers; ++l) {  // (no KIVI flush at these tokens)
          append(c.get(), g, l, t, 1, 7 + l);
          attend(c.get(), g, l, q, {t});
        }
      }
      waits[i] = kvsdk::cuda_host::host_waits() - before;
    }
    EXPECT_EQ(waits[0], waits[1]) << spec << ": 2 and 8 KV heads";
    EXPECT_LE(waits[1], 2u * 8u) << spec << ": waits in a step of 2 layers";
  }
}

// The same for a 'smallkv' cache's attention with marginal rows (SmallKV's Eq. 6): its layer's
// full rows are attended for every head in one round trip and its marginal rows in another (the
// weights, outputs and positions up in one batch), whatever the number of KV heads (the proxy,
// on the CPU, weights the rows in between).
TEST(DeviceCacheStaging, ASmallKvAttendWaitsForTheDeviceAsOftenWhateverTheHeads) {
  unsigned long long waits[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const uint32_t kv = i == 0 ? 2 : 8;
    SCOPED_TRACE(std::to_string(kv) + " KV heads");
    const kvsdk_geometry g = kvsdk_test::make_geometry(2, 2 * kv, kv, 64);
    const kvsdk_geometry pg = kvsdk_test::make_geometry(2, 2, 1, 64);
    CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
    ContextPtr cpu = kvsdk_test::make_context(1u << 20, KVSDK_BACKEND_CPU_REFERENCE);
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, "smallkv"), KVSDK_OK);
    p.match_tokens = 8;
    CachePtr c = kvsdk_test::make_cache(gpu.get(), g, &p);
    CachePtr proxy = kvsdk_test::make_cache(cpu.get(), pg);
    ASSERT_TRUE(c && proxy) << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_set_proxy(c.get(), proxy.get()), KVSDK_OK) << kvsdk_last_error();
    // A budget of 24 tokens' full rows: 40 tokens evict into marginal rows (and match every head).
    ASSERT_EQ(kvsdk_cache_set_budget(c.get(), 2ull * kv * 24 * (64 * 4 + 8) + 4096), KVSDK_OK)
        << kvsdk_last_error();
    const auto q = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 6);
    const auto pq = kvsdk_test::random_floats(size_t(pg.n_q_heads) * pg.head_dim, 7);
    for (int32_t t = 0; t < 42; ++t) {
      for (uint32_t l = 0; l < g.n_layers; ++l) {
        append(proxy.get(), pg, l, t, 1, 30 + l);
        attend(proxy.get(), pg, l, pq, {t});
        append(c.get(), g, l, t, 1, 5 + l);
        if (t < 41) {
          attend(c.get(), g, l, q, {t});
          continue;
        }
        const unsigned long long before = kvsdk::cuda_host::host_waits();
        attend(c.get(), g, l, q, {t});
        waits[i] += kvsdk::cuda_host::host_waits() - before;
      }
    }
    kvsdk_layer_stats ls;
    kvsdk_layer_stats_init(&ls);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(c.get(), 0, &ls), KVSDK_OK);
    EXPECT_GT(ls.bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u) << "no marginal rows to attend";
  }
  EXPECT_EQ(waits[0], waits[1]) << "2 and 8 KV heads";
  // Per layer: the queries up and the outputs down (the full rows), one batch up and the outputs
  // down (the marginal rows); the shim counts a copy up as two waits (the compute stream's work
  // before it, then the copy).
  EXPECT_LE(waits[1], 2u * 8u) << "waits in the attention of 2 layers";
}

// The shim holds copies to the device's memory rules: a device side outside every cudaMalloc
// block, or a host side inside one, is refused as a GPU would fault.
TEST(DeviceCacheStaging, TheShimRefusesCopiesThatBreakTheMemoryRules) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  std::vector<unsigned char> host(64, 1);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue)
      << "past the end of the block";
  EXPECT_EQ(cudaMemcpy(host.data(), d, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue)
      << "host and device swapped";
  EXPECT_EQ(cudaMemcpy(host.data(), d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, d, 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue)
      << "a host side inside a device block";
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 32, cudaHostAllocDefault), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(static_cast<char*>(pinned) + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// The eviction presets score where the rows are: an h2o observe and a snapkv selection pass
// send the queries (and an append's incoming keys) to the device and bring back one f32 score
// per row and KV head, never the keys (64x fewer bytes than f16 keys at head_dim 64; a KIVI
// overlay's observe no longer copies its heads out either). The rows are still the CPU's:
// DeviceEviction and DeviceKiviEviction check that.
TEST(DeviceCacheScoring, KeysStayOnTheDevice) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 64);
  const size_t n = 2000;
  const unsigned long long cols = g.n_kv_heads * n * sizeof(float);  // one layer's scores
  for (const char* spec : {"h2o", "h2o+kivi4", "snapkv"}) {
    SCOPED_TRACE(spec);
    CUDA_CONTEXT_OR_SKIP(gpu, 16u << 20);
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
    CachePtr c = kvsdk_test::make_cache(gpu.get(), g, &p);
    ASSERT_TRUE(c) << kvsdk_last_error();
    for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 0, n, 30 + l);
    const auto q = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 31);
    const int32_t qpos = int32_t(n) - 1;
    const auto out_bytes = [] {
      const kvsdk::cuda_host::TransferBytes t = kvsdk::cuda_host::transfer_bytes();
      return t.to_host_pinned + t.to_host_pageable;
    };
    unsigned long long before = out_bytes();
    ASSERT_EQ(kvsdk_cache_observe(c.get(), 1, 1, q.data(), &qpos, q.size() * sizeof(float)),
              KVSDK_OK)
        << kvsdk_last_error();
    const unsigned long long observed = out_bytes() - before;
    if (std::string(spec) != "snapkv") {
      EXPECT_EQ(observed, cols) << "the observe's scores, not the layer's keys";
    } else {
      EXPECT_EQ(observed, 0u) << "snapkv keeps the window until it selects";
      // Half the rows go: one selection pass per layer.
      const kvsdk_cache_stats s = stats(c.get());
      before = out_bytes();
      ASSERT_EQ(kvsdk_cache_set_budget(c.get(), s.bytes / 2), KVSDK_OK) << kvsdk_last_error();
      ASSERT_EQ(kvsdk_cache_compress(c.get()), KVSDK_OK) << kvsdk_last_error();
      EXPECT_LE(out_bytes() - before, g.n_layers * cols) << "scores, not keys";
      EXPECT_LT(stats(c.get()).tokens, uint64_t(n) * g.n_layers * g.n_kv_heads) << "it evicted";
    }
  }
}
#endif

// What does not run on CUDA yet is refused with KVSDK_E_UNSUPPORTED and a message, and a refused
// call leaves everything as it was. (Policy kivi runs on CUDA: device_kivi_test.cpp; minicache:
// device_minicache_test.cpp; the eviction presets and their '+kiviN' overlays above; the other
// methods do not.)
TEST(DeviceCacheRefusals, UnsupportedCallsSayWhy) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  CUDA_CONTEXT_OR_SKIP(gpu, 4u << 20);
  for (const char* spec : {"minicache+kivi4", "spindlekv"}) {
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
    kvsdk_cache* c = nullptr;
    EXPECT_EQ(kvsdk_cache_create(&c, gpu.get(), &g, &p), KVSDK_E_UNSUPPORTED) << spec;
    EXPECT_NE(std::string(kvsdk_last_error()).find("does not run on cuda"), std::string::npos)
        << kvsdk_last_error();
  }
  const kvsdk_geometry odd = kvsdk_test::make_geometry(2, 4, 2, 96);
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&c, gpu.get(), &odd, nullptr), KVSDK_E_UNSUPPORTED);
  CachePtr one = kvsdk_test::make_cache(gpu.get(), g);
  ASSERT_TRUE(one) << kvsdk_last_error();
  append(one.get(), g, 0, 0, 3, 1);
  EXPECT_EQ(kvsdk_test::used(gpu.get()), stats_bytes(one.get()));
  // Out-of-order positions cannot be cut on the device: refused, rows kept.
  const std::vector<int32_t> back{1};
  const auto k = kvsdk_test::random_floats(g.n_kv_heads * g.head_dim, 3);
  ASSERT_EQ(kvsdk_cache_append(one.get(), 0, 1, k.data(), k.data(), back.data(),
                               k.size() * sizeof(float)),
            KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_truncate(one.get(), 2), KVSDK_E_STATE);
  EXPECT_EQ(read_rows(one.get(), 0, 0, g.head_dim).pos, (std::vector<int32_t>{0, 1, 2, 1}));
}

// Hosts that speak f16 or bf16: rows go in and come out in the host's dtype, bit for bit as on
// the CPU (f16 bits are kept, NaN payloads included; bf16 is rounded once), and attention
// answers in the host's dtype within the same tolerance after rounding to it.
TEST(DeviceCacheDtypes, HalfAndBfloatHostsMatchTheCpu) {
  for (kvsdk_dtype dtype : {KVSDK_DTYPE_F16, KVSDK_DTYPE_BF16}) {
    SCOPED_TRACE(dtype == KVSDK_DTYPE_F16 ? "f16" : "bf16");
    const kvsdk_geometry g = kvsdk_test::make_geometry(2, 8, 2, 128, dtype);
    CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
    ContextPtr cpu = kvsdk_test::make_context(8u << 20, KVSDK_BACKEND_CPU_REFERENCE);
    CachePtr a = kvsdk_test::make_cache(gpu.get(), g), b = kvsdk_test::make_cache(cpu.get(), g);
    ASSERT_TRUE(a && b) << kvsdk_last_error();
    const size_t n = 40, elems = n * g.n_kv_heads * g.head_dim;
    std::vector<uint16_t> k(elems), v(elems);
    std::mt19937 rng(7);
    for (size_t i = 0; i < elems; ++i) k[i] = uint16_t(rng() & 0x3fff), v[i] = uint16_t(rng() & 0x3fff);
    // Layer 0 also holds a NaN with a payload (f16 hosts get it back as they gave it); layer 1,
    // which the queries attend, only finite values.
    std::vector<uint16_t> k0 = k;
    k0[5] = 0x7e01;
    const auto pos = kvsdk_test::iota_positions(n);
    for (kvsdk_cache* c : {a.get(), b.get()}) {
      for (uint32_t l = 0; l < g.n_layers; ++l) {
        const uint16_t* kl = l == 0 ? k0.data() : k.data();
        ASSERT_EQ(kvsdk_cache_append(c, l, n, kl, v.data(), pos.data(), elems * 2), KVSDK_OK)
            << kvsdk_last_error();
      }
    }
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
        std::vector<uint16_t> ka(n * g.head_dim), kb(ka.size()), va(ka.size()), vb(ka.size());
        size_t na = 0, nb = 0;
        ASSERT_EQ(kvsdk_cache_read(a.get(), l, h, ka.data(), va.data(), nullptr, n, &na), KVSDK_OK);
        ASSERT_EQ(kvsdk_cache_read(b.get(), l, h, kb.data(), vb.data(), nullptr, n, &nb), KVSDK_OK);
        ASSERT_EQ(na, nb);
        EXPECT_EQ(ka, kb);
        EXPECT_EQ(va, vb);
      }
      // Queries from the rows themselves (finite values), last token's position.
      std::vector<uint16_t> q(size_t(g.n_q_heads) * g.head_dim);
      for (size_t i = 0; i < q.size(); ++i) q[i] = uint16_t(rng() & 0x3bff);
      const int32_t qpos = int32_t(n) - 1;
      std::vector<uint16_t> oa(q.size()), ob(q.size());
      ASSERT_EQ(kvsdk_cache_attend(a.get(), 1, 1, q.data(), &qpos, q.size() * 2, oa.data(),
                                   oa.size() * 2),
                KVSDK_OK)
          << kvsdk_last_error();
      ASSERT_EQ(kvsdk_cache_attend(b.get(), 1, 1, q.data(), &qpos, q.size() * 2, ob.data(),
                                   ob.size() * 2),
                KVSDK_OK);
      for (size_t i = 0; i < oa.size(); ++i) {
        // Within one step of the host format's rounding (2e-4 before it).
        EXPECT_LE(std::abs(int(oa[i]) - int(ob[i])), 1) << "element " << i;
      }
    }
  }
}

TEST(DeviceCacheContext, ADeviceOrdinalNotPresentIsAnInvalidArgument) {
  CUDA_CONTEXT_OR_SKIP(ok, 1 << 20);  // (device 0 is present)
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.backend = KVSDK_BACKEND_CUDA;
  o.budget_bytes = 1 << 20;
  for (int32_t device : {-1, 4096}) {
    o.device = device;
    kvsdk_context* c = nullptr;
    EXPECT_EQ(kvsdk_context_create(&c, &o), KVSDK_E_INVALID_ARG) << device;
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::string(kvsdk_last_error()).find("options.device"), std::string::npos);
  }
}

TEST(DeviceCacheContext, NeedsABudget) {
  ContextPtr ctx;
  EXPECT_EQ(cuda_context(0, ctx), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()).find("budget"), std::string::npos);
}

// Every call of the C API on an evicting cache of a CUDA context, side by side with the same
// call on the CPU reference backend: the same status, the same results (rows, stats,
// allocations, snapshot files, journal deltas), and the arena never beyond the budget.

TEST(DeviceCacheApi, EveryCallMatchesTheCpuReference) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(3, 8, 2, 64);
  const uint64_t budget = 96 * 1024;
  KVSDK_REQUIRE_CUDA_DEVICE();  // (before measuring the device's memory)
  const uint64_t before = device_bytes_in_use();
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  const uint64_t arena = device_bytes_in_use() - before;
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  const kvsdk_policy p = kvsdk_test::small_policy("snapkv", 32);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p), b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(a && b) << kvsdk_last_error();
  kvsdk_cache* const caches[2] = {a.get(), b.get()};
  // Runs `call` on both caches: the same status, and the arena within the budget.
  const auto both = [&](const char* what, auto call) {
    const kvsdk_status x = call(a.get()), y = call(b.get());
    EXPECT_EQ(x, y) << what << ": " << kvsdk_last_error();
    EXPECT_LE(stats(a.get()).device_reserved_bytes, budget) << what;
    EXPECT_LE(device_bytes_in_use() - before, arena + (64u << 10)) << what << ": the arena and "
                                                                       "attention scratch only";
    return x;
  };
  const auto same_state = [&](const char* what) {
    SCOPED_TRACE(what);
    expect_same_rows(a.get(), b.get(), g);
    const kvsdk_cache_stats sa = stats(a.get()), sb = stats(b.get());
    EXPECT_EQ(sa.bytes, sb.bytes);
    EXPECT_EQ(sa.tokens, sb.tokens);
    EXPECT_EQ(sa.context_used_bytes, sb.context_used_bytes);
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      kvsdk_layer_stats x, y;
      kvsdk_layer_stats_init(&x);
      kvsdk_layer_stats_init(&y);
      ASSERT_EQ(kvsdk_cache_layer_stats_get(a.get(), l, &x), KVSDK_OK);
      ASSERT_EQ(kvsdk_cache_layer_stats_get(b.get(), l, &y), KVSDK_OK);
      EXPECT_EQ(0, std::memcmp(&x, &y, sizeof(x))) << "layer " << l;
    }
    std::vector<uint64_t> ax(g.n_layers), bx(g.n_layers);
    ASSERT_EQ(kvsdk_cache_allocation(a.get(), ax.data(), g.n_layers), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_allocation(b.get(), bx.data(), g.n_layers), KVSDK_OK);
    EXPECT_EQ(ax, bx);
    uint64_t ta = 0, tb = 0, ba = 0, bb = 0;
    ASSERT_EQ(kvsdk_cache_token_capacity(a.get(), &ta, &ba), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_token_capacity(b.get(), &tb, &bb), KVSDK_OK);
    EXPECT_EQ(ta, tb);
    EXPECT_EQ(ba, bb);
  };
  const size_t q_elems = size_t(g.n_q_heads) * g.head_dim;
  int32_t pos = 0;
  const auto turn = [&](size_t n, uint32_t seed) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (kvsdk_cache* c : caches) append(c, g, l, pos, n, seed + l);
      const auto q = kvsdk_test::random_floats(q_elems, seed + 50 + l);
      const std::vector<int32_t> qpos{pos + int32_t(n) - 1};
      both("observe", [&](kvsdk_cache* c) {
        return kvsdk_cache_observe(c, l, 1, q.data(), qpos.data(), q.size() * sizeof(float));
      });
      const auto x = attend(a.get(), g, l, q, qpos), y = attend(b.get(), g, l, q, qpos);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4);
    }
    pos += int32_t(n);
  };
  turn(24, 10);
  for (uint32_t i = 0; i < 6; ++i) turn(1 + i % 2, 100 + 10 * i);
  same_state("appends");
  kvsdk_geometry ga, gb;
  kvsdk_geometry_init(&ga), kvsdk_geometry_init(&gb);
  ASSERT_EQ(kvsdk_cache_geometry(a.get(), &ga), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_geometry(b.get(), &gb), KVSDK_OK);
  EXPECT_EQ(0, std::memcmp(&ga, &gb, sizeof(ga)));
  kvsdk_policy pa, pb;
  kvsdk_policy_init(&pa, 0), kvsdk_policy_init(&pb, 0);
  ASSERT_EQ(kvsdk_cache_policy(a.get(), &pa), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_policy(b.get(), &pb), KVSDK_OK);
  EXPECT_EQ(0, std::memcmp(&pa, &pb, sizeof(pa)));

  both("set_budget", [](kvsdk_cache* c) { return kvsdk_cache_set_budget(c, 40 * 1024); });
  same_state("set_budget");
  both("compress", [](kvsdk_cache* c) { return kvsdk_cache_compress(c); });
  turn(2, 300);
  same_state("compress");
  const std::vector<uint64_t> alloc{9, 14, 6};
  both("set_allocation", [&](kvsdk_cache* c) {
    return kvsdk_cache_set_allocation(c, alloc.data(), alloc.size());
  });
  turn(1, 400);
  same_state("set_allocation");
  kvsdk_profile* profile = nullptr;
  ASSERT_EQ(kvsdk_profile_create(&profile, g.n_layers), KVSDK_OK);
  const std::vector<uint64_t> sample{3, 5, 2};
  ASSERT_EQ(kvsdk_profile_record(profile, sample.data(), g.n_layers), KVSDK_OK);
  both("set_allocation(none)", [](kvsdk_cache* c) { return kvsdk_cache_set_allocation(c, nullptr, 0); });
  both("apply_profile", [&](kvsdk_cache* c) { return kvsdk_cache_apply_profile(c, profile); });
  kvsdk_profile_destroy(profile);
  turn(2, 500);
  same_state("apply_profile");

  // Files and journal deltas: byte for byte the same on both backends.
  kvsdk_test::TempDir dir;
  const std::string fa = dir.file("gpu.kvsnap"), fb = dir.file("cpu.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), fa.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save(b.get(), fb.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(file_bytes(fa) == file_bytes(fb));
  turn(1, 600);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), fa.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_save_delta(b.get(), fb.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(file_bytes(fa) == file_bytes(fb)) << "journal deltas";

  both("prefetch", [&](kvsdk_cache* c) {
    const auto q = kvsdk_test::random_floats(q_elems, 1);
    return kvsdk_cache_prefetch(c, 0, 1, q.data(), nullptr, q.size() * sizeof(float));
  });
  both("fetch_stats", [](kvsdk_cache* c) {
    double rate = 0;
    uint64_t n = 0;
    return kvsdk_cache_fetch_stats(c, &rate, &n);
  });
  both("set_backing_file", [&](kvsdk_cache* c) {
    return kvsdk_cache_set_backing_file(c, dir.file("backing").c_str());
  });
  both("truncate", [&](kvsdk_cache* c) { return kvsdk_cache_truncate(c, pos - 1); });
  same_state("truncate");
  uint64_t ua = 0, ub = 0, budget_a = 0;
  ASSERT_EQ(kvsdk_context_used_bytes(gpu.get(), &ua), KVSDK_OK);
  ASSERT_EQ(kvsdk_context_used_bytes(cpu.get(), &ub), KVSDK_OK);
  EXPECT_EQ(ua, ub);
  ASSERT_EQ(kvsdk_context_budget_bytes(gpu.get(), &budget_a), KVSDK_OK);
  EXPECT_EQ(budget_a, budget);

  // Forks and conversations on a shared prefix: more caches in the same arena.
  kvsdk_cache* fa_raw = nullptr;
  kvsdk_cache* fb_raw = nullptr;
  ASSERT_EQ(kvsdk_cache_fork(&fa_raw, a.get()), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_fork(&fb_raw, b.get()), KVSDK_OK) << kvsdk_last_error();
  CachePtr fork_a(fa_raw), fork_b(fb_raw);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(fork_a.get(), g, l, pos, 2, 700 + l);
    append(fork_b.get(), g, l, pos, 2, 700 + l);
  }
  expect_same_rows(fork_a.get(), fork_b.get(), g);
  expect_same_rows(a.get(), b.get(), g);  // the originals did not change
  both("freeze", [](kvsdk_cache* c) { return kvsdk_cache_freeze(c); });
  kvsdk_cache* pa_raw = nullptr;
  kvsdk_cache* pb_raw = nullptr;
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&pa_raw, a.get(), &p), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&pb_raw, b.get(), &p), KVSDK_OK) << kvsdk_last_error();
  CachePtr on_prefix_a(pa_raw), on_prefix_b(pb_raw);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(on_prefix_a.get(), g, l, pos, 3, 800 + l);
    append(on_prefix_b.get(), g, l, pos, 3, 800 + l);
    const auto q = kvsdk_test::random_floats(q_elems, 810 + l);
    const std::vector<int32_t> qpos{pos + 2};
    const auto x = attend(on_prefix_a.get(), g, l, q, qpos);
    const auto y = attend(on_prefix_b.get(), g, l, q, qpos);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4) << "on the prefix";
  }
  EXPECT_EQ(kvsdk_cache_set_proxy(a.get(), b.get()), kvsdk_cache_set_proxy(b.get(), a.get()));
  EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));

  // The CPU's file with its delta loads onto the CUDA context, and the reverse.
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&loaded, gpu.get(), fb.c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_gpu(loaded);
  ASSERT_EQ(kvsdk_cache_load(&loaded, cpu.get(), fa.c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_cpu(loaded);
  expect_same_rows(on_gpu.get(), on_cpu.get(), g);
  EXPECT_LE(stats(on_gpu.get()).device_reserved_bytes, budget);
}

// Several conversations share one arena: growing one past its neighbour moves the others, and
// when the arena is full the others give back their spare capacity, so the caches fill the
// budget to the last byte together, with the same rows as on the CPU.
TEST(DeviceCacheRegions, ConversationsShareTheArenaToTheLastByte) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const uint64_t row = uint64_t(g.n_kv_heads) * (g.head_dim * 4 + 4);  // a layer-token's bytes
  const uint64_t budget = 3 * 2 * 50 * row;  // three caches of two layers, 50 tokens each
  KVSDK_REQUIRE_CUDA_DEVICE();  // (before measuring the device's memory)
  const uint64_t before = device_bytes_in_use();
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  const uint64_t arena = device_bytes_in_use() - before;
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  std::vector<CachePtr> on_gpu, on_cpu;
  for (int i = 0; i < 3; ++i) {
    on_gpu.push_back(kvsdk_test::make_cache(gpu.get(), g));
    on_cpu.push_back(kvsdk_test::make_cache(cpu.get(), g));
    ASSERT_TRUE(on_gpu.back() && on_cpu.back()) << kvsdk_last_error();
  }
  // Round-robin growth in uneven steps: every cache outgrows its region in turn.
  const size_t steps[3] = {3, 1, 2};
  std::vector<int32_t> next(3, 0);
  for (int round = 0; round < 200; ++round) {
    const int i = round % 3;
    const size_t n = std::min<size_t>(steps[i], 50 - size_t(next[i]));
    if (n == 0) continue;
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      append(on_gpu[i].get(), g, l, next[i], n, 3000 + uint32_t(round) * 4 + l);
      append(on_cpu[i].get(), g, l, next[i], n, 3000 + uint32_t(round) * 4 + l);
    }
    next[i] += int32_t(n);
    ASSERT_LE(device_bytes_in_use() - before, arena) << "appends allocate no device memory";
  }
  EXPECT_EQ(kvsdk_test::used(gpu.get()), budget) << "filled to the last byte";
  uint64_t reserved = 0;
  for (int i = 0; i < 3; ++i) {
    expect_same_rows(on_gpu[i].get(), on_cpu[i].get(), g);
    reserved += stats(on_gpu[i].get()).device_reserved_bytes;
  }
  EXPECT_EQ(reserved, budget);
  append(on_gpu[1].get(), g, 0, 50, 1, 1, KVSDK_E_BUDGET);
  expect_same_rows(on_gpu[1].get(), on_cpu[1].get(), g);
  // A destroyed conversation's region is reused by the others.
  on_gpu[0].reset();
  on_cpu[0].reset();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(on_gpu[2].get(), g, l, 50, 40, 77 + l);
    append(on_cpu[2].get(), g, l, 50, 40, 77 + l);
  }
  expect_same_rows(on_gpu[2].get(), on_cpu[2].get(), g);
  expect_same_rows(on_gpu[1].get(), on_cpu[1].get(), g);
}

#ifdef KVSDK_CUDA_HOST_SHIM
// Without a CUDA backend in the build (the shim uninstalled), a CUDA context says so.
TEST(DeviceCacheContext, WithoutCudaInTheBuildIsUnsupported) {
  kvsdk::backend::install_cuda_backend(nullptr);
  ContextPtr ctx;
  EXPECT_EQ(cuda_context(1 << 20, ctx), KVSDK_E_UNSUPPORTED);
  EXPECT_NE(std::string(kvsdk_last_error()).find("without CUDA"), std::string::npos);
  kvsdk::backend::install_cuda_backend(&kvsdk::cuda::device_backend());
}
#endif

}  // namespace
