// Policy 'specache' on a CUDA context (the device SpeCache store, src/repr/device_specache.h),
// against the same calls on the CPU reference backend (the oracle, src/repr/specache_repr.h):
// SpeCache's decode steps (append, attend the output and the speculative token together,
// prefetch with the speculative token) must fetch the same tokens, so rows as kvsdk_cache_read
// shows them (the low-bit copy with the fetched f16 rows substituted) are the CPU's bit for bit,
// attention is within the decode kernel's tolerance (2e-4 absolute), bytes per tier, budget
// charges, backing bytes and the fetch hit rate are equal, snapshots are byte-identical and load
// on the other backend, truncation drops the same rows and fetches, and a budget refusal changes
// nothing.
//
// Built twice, like device_kivi_test.cpp: with CUDA (cuda_backend_test; skipped with the driver's
// reason without a GPU) and against the host execution shim (cuda_host_cache_test), where every
// call runs the CUDA backend's own code and kernels on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "device_cache_util.h"
#include "../../api/preset_util.h"
#include "../../formats/snapshot_test_util.h"
#include "kvsdk.h"
#include "test_util.h"

namespace {

using kvsdk_test::CachePtr;
using kvsdk_test::ContextPtr;
using namespace kvsdk_device_test;

// 'specache' with KIVI blocks of G tokens after a residual window of R, fetching `fetch` rows.
kvsdk_policy specache_policy(uint32_t bits, int32_t group, int32_t residual, int32_t fetch) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, bits == 1 ? "specache+kivi1" : "specache"), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_EQ(p.quant_bits, int32_t(bits));
  p.quant_group = group;
  p.quant_residual = residual;
  p.fetch_tokens = fetch;
  return p;
}

void expect_close(const std::vector<float>& x, const std::vector<float>& y, const char* what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4) << what << " element " << i;
}

// Stats per tier, backing bytes, the context charges and the hit rate.
void expect_same_accounting(kvsdk_cache* a, kvsdk_cache* b, kvsdk_context* gpu,
                            kvsdk_context* cpu) {
  const kvsdk_cache_stats sa = stats(a), sb = stats(b);
  EXPECT_EQ(sa.tokens, sb.tokens);
  EXPECT_EQ(sa.bytes, sb.bytes);
  for (int t = 0; t < KVSDK_TIER_SLOTS; ++t) {
    EXPECT_EQ(sa.bytes_by_tier[t], sb.bytes_by_tier[t]) << "tier " << t;
  }
  EXPECT_EQ(sa.backing_bytes, sb.backing_bytes);
  EXPECT_GE(sa.device_reserved_bytes, sa.bytes);
  EXPECT_LE(sa.device_reserved_bytes, sa.device_arena_bytes);
  EXPECT_EQ(kvsdk_test::used(gpu), kvsdk_test::used(cpu));
  double ra = 0, rb = 0;
  uint64_t na = 0, nb = 0;
  ASSERT_EQ(kvsdk_cache_fetch_stats(a, &ra, &na), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_fetch_stats(b, &rb, &nb), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(na, nb);
  EXPECT_NEAR(ra, rb, 1e-6) << "hit rate";
}

// One SpeCache decode step on layer `l` of every cache: append the token at `pos`, attend its
// query and the speculative token's (pos + 1) in one call, prefetch with the speculative one.
// Returns each cache's attention output.
std::vector<std::vector<float>> decode_step(const std::vector<kvsdk_cache*>& caches,
                                            const kvsdk_geometry& g, uint32_t l, int32_t pos,
                                            uint32_t seed) {
  const size_t q_elems = size_t(g.n_q_heads) * g.head_dim;
  const auto q = kvsdk_test::random_floats(2 * q_elems, seed + 7);
  const std::vector<int32_t> qpos{pos, pos + 1};
  const std::vector<float> spec(q.begin() + ptrdiff_t(q_elems), q.end());
  std::vector<std::vector<float>> out;
  for (kvsdk_cache* c : caches) {
    EXPECT_EQ(append_at(c, g, l, {pos}, seed), KVSDK_OK) << kvsdk_last_error();
    out.push_back(attend(c, g, l, q, qpos));
    const int32_t sp = pos + 1;
    EXPECT_EQ(kvsdk_cache_prefetch(c, l, 1, spec.data(), &sp, spec.size() * sizeof(float)),
              KVSDK_OK)
        << kvsdk_last_error();
  }
  return out;
}

struct SpeCase {
  uint32_t dim, q_per_kv, kv_heads, bits;
};

class DeviceSpeCache : public ::testing::TestWithParam<SpeCase> {};

// A prefill chunk (several KIVI flushes), then decode steps across flushes, fetching from the
// quantized blocks and the residual window; after each step the rows (with the fetched rows
// substituted), the accounting and the hit rate; the snapshots at the end.
TEST_P(DeviceSpeCache, DecodeStepsMatchTheCpuReference) {
  const SpeCase s = GetParam();
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, s.q_per_kv * s.kv_heads, s.kv_heads, s.dim);
  const kvsdk_policy p = specache_policy(s.bits, 16, 8, 12);
  CUDA_CONTEXT_OR_SKIP(gpu, 16u << 20);
  ContextPtr cpu = kvsdk_test::make_context(16u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << "specache on CUDA: " << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, 70, 10 + l);
    append(b.get(), g, l, 0, 70, 10 + l);
  }
  int32_t pos = 70;
  for (uint32_t step = 0; step < 24; ++step, ++pos) {
    SCOPED_TRACE("decode step " + std::to_string(step));
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const auto out = decode_step({a.get(), b.get()}, g, l, pos, 100 + 10 * step + l);
      expect_close(out[0], out[1], "attention");
      ASSERT_FALSE(HasFatalFailure());
    }
    if (step % 6 == 5) {
      expect_same_rows(a.get(), b.get(), g);
      ASSERT_FALSE(HasFatalFailure());
    }
    expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  }
  EXPECT_GT(stats(a.get()).bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);
  uint64_t samples = 0;
  double rate = 0;
  ASSERT_EQ(kvsdk_cache_fetch_stats(a.get(), &rate, &samples), KVSDK_OK);
  EXPECT_EQ(samples, uint64_t(23) * g.n_layers * g.n_kv_heads) << "every attend after a prefetch";
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == kvsdk_test::snapshot(b.get()));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DeviceSpeCache,
    ::testing::Values(SpeCase{64, 4, 2, 2}, SpeCase{128, 2, 2, 1}, SpeCase{256, 1, 1, 2}),
    [](const ::testing::TestParamInfo<SpeCase>& info) {
      const SpeCase& s = info.param;
      return "dim" + std::to_string(s.dim) + "_gqa" + std::to_string(s.q_per_kv) + "_kv" +
             std::to_string(s.kv_heads) + "_bits" + std::to_string(s.bits);
    });

// Snapshots (with and without the backing rows), loads across backends, truncation and a backing
// file: the CPU's bytes and behaviour.
TEST(DeviceSpeCacheSnapshot, SavesLoadsAndTruncatesLikeTheCpu) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy p = specache_policy(2, 16, 8, 6);
  CUDA_CONTEXT_OR_SKIP(gpu, 8u << 20);
  ContextPtr cpu = kvsdk_test::make_context(8u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  kvsdk_test::TempDir dir;
  const std::string backing = dir.file("gpu.backing");
  ASSERT_EQ(kvsdk_cache_set_backing_file(a.get(), backing.c_str()), KVSDK_OK)
      << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, 40, 20 + l);
    append(b.get(), g, l, 0, 40, 20 + l);
  }
  EXPECT_EQ(kvsdk_cache_set_backing_file(a.get(), backing.c_str()), KVSDK_E_STATE);
  int32_t pos = 40;
  for (uint32_t step = 0; step < 3; ++step, ++pos) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const auto out = decode_step({a.get(), b.get()}, g, l, pos, 300 + 10 * step + l);
      expect_close(out[0], out[1], "attention");
    }
  }
  expect_same_rows(a.get(), b.get(), g);
  expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  ASSERT_FALSE(HasFatalFailure());

  // With and without the backing rows: the same bytes from either backend, loadable on both.
  for (int backing_rows : {1, 0}) {
    SCOPED_TRACE(backing_rows ? "with backing" : "without backing");
    kvsdk_save_options opt;
    kvsdk_save_options_init(&opt);
    opt.include_backing = backing_rows;
    const auto x = kvsdk_test::save_buffer(a.get(), &opt);
    const auto y = kvsdk_test::save_buffer(b.get(), &opt);
    ASSERT_FALSE(x.empty());
    EXPECT_TRUE(x == y) << "snapshot bytes";
    kvsdk_cache* loaded = nullptr;
    ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, gpu.get(), y.data(), y.size(), &g, nullptr),
              KVSDK_OK)
        << kvsdk_last_error();
    CachePtr on_gpu(loaded);
    ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, cpu.get(), x.data(), x.size(), &g, nullptr),
              KVSDK_OK)
        << kvsdk_last_error();
    CachePtr on_cpu(loaded);
    expect_same_rows(on_gpu.get(), b.get(), g);
    expect_same_rows(on_cpu.get(), b.get(), g);
    ASSERT_FALSE(HasFatalFailure());
    // Both continue alike (a prefetch after a load without backing fetches low-bit rows).
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const auto out = decode_step({on_gpu.get(), on_cpu.get()}, g, l, pos, 400 + l);
      expect_close(out[0], out[1], "attention after the load");
    }
    expect_same_rows(on_gpu.get(), on_cpu.get(), g);
    EXPECT_TRUE(kvsdk_test::snapshot(on_gpu.get()) == kvsdk_test::snapshot(on_cpu.get()));
  }

  // Truncation: refused below the last flush on both, allowed for the newest residual rows (the
  // layer's fetch dropped on both).
  EXPECT_EQ(kvsdk_cache_truncate(a.get(), 2), KVSDK_E_STATE);
  EXPECT_EQ(kvsdk_cache_truncate(b.get(), 2), KVSDK_E_STATE);
  ASSERT_EQ(kvsdk_cache_truncate(a.get(), pos - 2), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_truncate(b.get(), pos - 2), KVSDK_OK) << kvsdk_last_error();
  expect_same_rows(a.get(), b.get(), g);
  expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == kvsdk_test::snapshot(b.get()));
  pos -= 2;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const auto out = decode_step({a.get(), b.get()}, g, l, pos, 500 + l);
    expect_close(out[0], out[1], "attention after the truncation");
  }
  expect_same_rows(a.get(), b.get(), g);
}

// The other calls on a specache cache, bad input included: whatever the CPU answers, CUDA answers,
// to the same effect; forks continue alike.
TEST(DeviceSpeCacheApi, EveryCallMatchesTheCpuReference) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy p = specache_policy(2, 16, 8, 4);
  CUDA_CONTEXT_OR_SKIP(gpu, 4u << 20);
  ContextPtr cpu = kvsdk_test::make_context(4u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(a.get(), g, l, 0, 30, 40 + l);
    append(b.get(), g, l, 0, 30, 40 + l);
  }
  const auto same = [&](const std::string& what, auto call) {
    const kvsdk_status x = call(a.get());
    const std::string why = kvsdk_last_error();
    const kvsdk_status y = call(b.get());
    EXPECT_EQ(x, y) << what << ": " << why << " / " << kvsdk_last_error();
  };
  const size_t q_elems = size_t(g.n_q_heads) * g.head_dim;
  const auto q2 = kvsdk_test::random_floats(2 * q_elems, 5);
  const int32_t q_pos[2] = {30, 31};
  const auto before = kvsdk_test::snapshot(b.get());
  same("prefetch: two queries", [&](kvsdk_cache* c) {
    return kvsdk_cache_prefetch(c, 0, 2, q2.data(), q_pos, q2.size() * sizeof(float));
  });
  same("prefetch: layer out of range", [&](kvsdk_cache* c) {
    return kvsdk_cache_prefetch(c, 2, 1, q2.data(), q_pos, q_elems * sizeof(float));
  });
  same("prefetch: NULL q", [&](kvsdk_cache* c) {
    return kvsdk_cache_prefetch(c, 0, 1, nullptr, q_pos, q_elems * sizeof(float));
  });
  same("prefetch: wrong size", [&](kvsdk_cache* c) {
    return kvsdk_cache_prefetch(c, 0, 1, q2.data(), q_pos, q_elems * sizeof(float) - 4);
  });
  same("prefetch: bad position", [&](kvsdk_cache* c) {
    const int32_t bad = -5;
    return kvsdk_cache_prefetch(c, 0, 1, q2.data(), &bad, q_elems * sizeof(float));
  });
  same("set_backing_file after appends", [&](kvsdk_cache* c) {
    return kvsdk_cache_set_backing_file(c, "/nonexistent/dir/backing");
  });
  same("observe", [&](kvsdk_cache* c) {
    return kvsdk_cache_observe(c, 0, 1, q2.data(), q_pos, q_elems * sizeof(float));
  });
  same("compress", [](kvsdk_cache* c) { return kvsdk_cache_compress(c); });
  same("truncate: into a quantized block",
       [](kvsdk_cache* c) { return kvsdk_cache_truncate(c, 3); });
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == before) << "the failed calls changed nothing";
  // Prefetch with NULL positions (the query sees every token), then attend and fork.
  same("prefetch: NULL positions", [&](kvsdk_cache* c) {
    return kvsdk_cache_prefetch(c, 1, 1, q2.data(), nullptr, q_elems * sizeof(float));
  });
  expect_same_rows(a.get(), b.get(), g);
  expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  kvsdk_cache* fa = nullptr;
  kvsdk_cache* fb = nullptr;
  ASSERT_EQ(kvsdk_cache_fork(&fa, a.get()), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_fork(&fb, b.get()), KVSDK_OK) << kvsdk_last_error();
  CachePtr fork_a(fa), fork_b(fb);
  expect_same_rows(fork_a.get(), b.get(), g);
  for (int32_t pos = 30; pos < 34; ++pos) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const auto out = decode_step({fork_a.get(), fork_b.get(), a.get(), b.get()}, g, l, pos,
                                   700 + 10 * uint32_t(pos) + l);
      expect_close(out[0], out[1], "fork attention");
      expect_close(out[2], out[3], "attention");
      expect_close(out[0], out[2], "a fork attends as its parent");
    }
  }
  expect_same_rows(fork_a.get(), fork_b.get(), g);
  expect_same_rows(a.get(), b.get(), g);
  expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  EXPECT_TRUE(kvsdk_test::snapshot(fork_a.get()) == kvsdk_test::snapshot(fork_b.get()));
}

// A budget that the low-bit copy fills: the append that does not fit fails on both backends at
// the same token and changes nothing; the arena never holds more than the budget.
TEST(DeviceSpeCacheBudget, AFullBudgetRefusesLikeTheCpu) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(2, 4, 2, 64);
  const kvsdk_policy p = specache_policy(2, 16, 8, 4);
  const uint64_t budget = 48 * 1024;
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  CachePtr a = kvsdk_test::make_cache(gpu.get(), g, &p);
  ASSERT_TRUE(a) << kvsdk_last_error();
  CachePtr b = kvsdk_test::make_cache(cpu.get(), g, &p);
  ASSERT_TRUE(b) << kvsdk_last_error();
  int32_t pos = 0;
  for (; pos < 4000; ++pos) {
    const kvsdk_status sa = append_at(a.get(), g, pos % 2, {pos / 2}, 7 + pos);
    const kvsdk_status sb = append_at(b.get(), g, pos % 2, {pos / 2}, 7 + pos);
    ASSERT_EQ(sa, sb) << "token " << pos;
    if (sa != KVSDK_OK) break;
    EXPECT_LE(stats(a.get()).device_reserved_bytes, budget);
  }
  ASSERT_LT(pos, 4000) << "the budget filled";
  expect_same_rows(a.get(), b.get(), g);
  expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  // A full budget has no room for fetched rows either: refused on both, nothing fetched.
  const auto spec = kvsdk_test::random_floats(size_t(g.n_q_heads) * g.head_dim, 99);
  const int32_t sp = pos / 2 + 1;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const kvsdk_status sa =
        kvsdk_cache_prefetch(a.get(), l, 1, spec.data(), &sp, spec.size() * sizeof(float));
    const kvsdk_status sb =
        kvsdk_cache_prefetch(b.get(), l, 1, spec.data(), &sp, spec.size() * sizeof(float));
    EXPECT_EQ(sa, KVSDK_E_BUDGET) << kvsdk_last_error();
    EXPECT_EQ(sa, sb);
  }
  expect_same_rows(a.get(), b.get(), g);
  expect_same_accounting(a.get(), b.get(), gpu.get(), cpu.get());
  EXPECT_TRUE(kvsdk_test::snapshot(a.get()) == kvsdk_test::snapshot(b.get()));
}

}  // namespace
