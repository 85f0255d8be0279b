// Policy 'smallkv' on a CUDA context (the device SmallKV store, src/repr/device_smallkv.h),
// against the same calls on the CPU reference backend (the oracle, src/repr/smallkv_repr.h): the
// large cache on CUDA with its proxy (a 'full' cache of a smaller model) on a CPU_REFERENCE
// context, or on the CUDA context itself, is fed the same rows and queries as a smallkv cache on
// CPU_REFERENCE with its own CPU_REFERENCE proxy. The rows kept after every eviction are the
// CPU's bit for bit (kvsdk_cache_read; marginal rows with zero keys), bytes per tier and the
// context's charges are equal, the arena never reserves more than the budget, attention is within
// the decode kernel's tolerance (2e-4 absolute), snapshots (which hold the head mapping and the
// scores) are byte-identical and load on the other backend, forks continue alike, and every
// refusal (truncation, bad input, budgets, a missing proxy) has the CPU's status.
//
// Built twice, like device_specache_test.cpp: with CUDA (cuda_backend_test; skipped with the
// driver's reason without a GPU) and against the host execution shim (cuda_host_cache_test),
// where every call runs the CUDA backend's own code and kernels on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
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

constexpr uint32_t kLayers = 2;
// The proxy: a smaller model of the same depth, 2 query heads over 1 KV head of 64 dims.
constexpr uint32_t kProxyQ = 2, kProxyDim = 64;

kvsdk_policy smallkv_policy(int32_t match_tokens, float slack) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, "smallkv"), KVSDK_OK) << kvsdk_last_error();
  p.match_tokens = match_tokens;
  if (slack >= 0.0f) p.evict_slack = slack;
  return p;
}

kvsdk_geometry proxy_geometry() {
  return kvsdk_test::make_geometry(kLayers, kProxyQ, 1, kProxyDim);
}

// Budgeted bytes of one token in every layer and KV head kept as a full row: f16 keys and values,
// the position and the score.
uint64_t full_token_bytes(const kvsdk_geometry& g) {
  return uint64_t(g.n_layers) * g.n_kv_heads * (uint64_t(g.head_dim) * 4 + 8);
}
// The fixed metadata: the head mapping and the matching statistics of every query head.
uint64_t fixed_bytes(const kvsdk_geometry& g, int32_t match_tokens) {
  return uint64_t(g.n_layers) * g.n_q_heads * (4 + 4 * uint64_t(match_tokens));
}

void expect_close(const std::vector<float>& x, const std::vector<float>& y, const char* what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4) << what << " element " << i;
}

// One large cache and its proxy. `device` marks the side under test (the large cache on CUDA).
struct Side {
  CachePtr large, proxy;
  kvsdk_context* lctx = nullptr;  // the large cache's context
  kvsdk_context* pctx = nullptr;  // the proxy's (may be lctx)
};

// Stats per tier (whole cache and per layer), the context charges of both sides, the arena
// reservation within the budget.
void expect_same_accounting(const Side& d, const Side& c) {
  const kvsdk_cache_stats sa = stats(d.large.get()), sb = stats(c.large.get());
  EXPECT_EQ(sa.tokens, sb.tokens);
  EXPECT_EQ(sa.appended_tokens, sb.appended_tokens);
  EXPECT_EQ(sa.bytes, sb.bytes);
  EXPECT_EQ(sa.full_bytes, sb.full_bytes);
  for (int t = 0; t < KVSDK_TIER_SLOTS; ++t) {
    EXPECT_EQ(sa.bytes_by_tier[t], sb.bytes_by_tier[t]) << "tier " << t;
  }
  EXPECT_EQ(sa.budget_bytes, sb.budget_bytes);
  EXPECT_EQ(sa.context_used_bytes, sb.context_used_bytes);
  EXPECT_GE(sa.device_reserved_bytes, sa.bytes_by_tier[KVSDK_TIER_EXACT] +
                                          sa.bytes_by_tier[KVSDK_TIER_VALUE_ONLY]);
  EXPECT_LE(sa.device_reserved_bytes, sa.device_arena_bytes);
  if (sa.budget_bytes) EXPECT_LE(sa.device_reserved_bytes, sa.budget_bytes);
  EXPECT_EQ(sb.device_reserved_bytes, 0u);
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  ASSERT_EQ(kvsdk_cache_geometry(d.large.get(), &g), KVSDK_OK);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    kvsdk_layer_stats la, lb;
    kvsdk_layer_stats_init(&la);
    kvsdk_layer_stats_init(&lb);
    ASSERT_EQ(kvsdk_cache_layer_stats_get(d.large.get(), l, &la), KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_layer_stats_get(c.large.get(), l, &lb), KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(la.tokens, lb.tokens) << "layer " << l;
    EXPECT_EQ(la.bytes, lb.bytes) << "layer " << l;
    for (int t = 0; t < KVSDK_TIER_SLOTS; ++t) {
      EXPECT_EQ(la.bytes_by_tier[t], lb.bytes_by_tier[t]) << "layer " << l << " tier " << t;
    }
  }
  EXPECT_EQ(kvsdk_test::used(d.lctx), kvsdk_test::used(c.lctx));
  if (d.pctx != d.lctx || c.pctx != c.lctx) {
    EXPECT_EQ(kvsdk_test::used(d.pctx), kvsdk_test::used(c.pctx));
  }
}

// Everything observable at once: rows of both caches (large and proxy) bit for bit, accounting,
// snapshots (rows, scores, head mapping) byte for byte.
void expect_same_state(const Side& d, const Side& c, const kvsdk_geometry& g) {
  expect_same_rows(d.large.get(), c.large.get(), g);
  if (::testing::Test::HasFatalFailure()) return;
  if (d.proxy && c.proxy) {
    expect_same_rows(d.proxy.get(), c.proxy.get(), proxy_geometry());
    if (::testing::Test::HasFatalFailure()) return;
  }
  expect_same_accounting(d, c);
  EXPECT_TRUE(kvsdk_test::snapshot(d.large.get()) == kvsdk_test::snapshot(c.large.get()))
      << "snapshot bytes";
}

// One step's input: n tokens at positions pos.., for the proxy and the large model of every
// layer. The large model's heads are built from the proxy's (large KV head g of layer l has the
// proxy keys of layer (l + g) % kLayers tiled to head_dim, plus small noise; its query heads the
// queries of the proxy heads of that layer), so the head matching has a clear answer; values are
// independent.
struct StepInput {
  std::vector<int32_t> pos;
  std::vector<std::vector<float>> pk, pv, pq, k, v, q;
};

StepInput make_step(const kvsdk_geometry& g, int32_t first, size_t n, uint32_t seed) {
  StepInput s;
  s.pos = kvsdk_test::iota_positions(n, first);
  const uint32_t group = g.n_q_heads / g.n_kv_heads;
  for (uint32_t l = 0; l < kLayers; ++l) {
    s.pk.push_back(kvsdk_test::random_floats(n * kProxyDim, seed * 97 + l * 7 + 1));
    s.pv.push_back(kvsdk_test::random_floats(n * kProxyDim, seed * 97 + l * 7 + 2));
    s.pq.push_back(kvsdk_test::random_floats(n * kProxyQ * kProxyDim, seed * 97 + l * 7 + 3, 1.5f));
  }
  for (uint32_t l = 0; l < kLayers; ++l) {
    const auto noise = kvsdk_test::random_floats(n * g.n_kv_heads * g.head_dim,
                                                 seed * 97 + l * 7 + 4, 0.05f);
    std::vector<float> k(noise.size()), q(n * g.n_q_heads * g.head_dim);
    for (size_t t = 0; t < n; ++t) {
      for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
        const uint32_t src = (l + h) % kLayers;
        for (uint32_t x = 0; x < g.head_dim; ++x) {
          const size_t i = (t * g.n_kv_heads + h) * g.head_dim + x;
          k[i] = s.pk[src][t * kProxyDim + x % kProxyDim] + noise[i];
        }
        for (uint32_t j = 0; j < group; ++j) {
          const uint32_t ph = (j + 1) % kProxyQ;
          for (uint32_t x = 0; x < g.head_dim; ++x) {
            q[(t * g.n_q_heads + h * group + j) * g.head_dim + x] =
                s.pq[src][(t * kProxyQ + ph) * kProxyDim + x % kProxyDim];
          }
        }
      }
    }
    s.k.push_back(std::move(k));
    s.v.push_back(kvsdk_test::random_floats(n * g.n_kv_heads * g.head_dim, seed * 97 + l * 7 + 5));
    s.q.push_back(std::move(q));
  }
  return s;
}

// What a step gave: the large cache's attention outputs per layer (empty where the append failed)
// and the first failing status (append or attend), KVSDK_OK otherwise.
struct StepOut {
  std::vector<std::vector<float>> out, proxy_out;
  kvsdk_status status = KVSDK_OK;
};

// The proxy's part of a step: its append and, when `attend`, its attend of every layer.
void run_proxy_step(kvsdk_cache* proxy, const StepInput& in, bool attend, StepOut& r) {
  const size_t n = in.pos.size();
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(kvsdk_cache_append(proxy, l, n, in.pk[l].data(), in.pv[l].data(), in.pos.data(),
                                 in.pk[l].size() * sizeof(float)),
              KVSDK_OK)
        << kvsdk_last_error();
    if (!attend) continue;
    std::vector<float> o(in.pq[l].size());
    EXPECT_EQ(kvsdk_cache_attend(proxy, l, n, in.pq[l].data(), in.pos.data(),
                                 in.pq[l].size() * sizeof(float), o.data(),
                                 o.size() * sizeof(float)),
              KVSDK_OK)
        << kvsdk_last_error();
    r.proxy_out.push_back(std::move(o));
  }
}

// The large cache's part: per layer its append and, when `attend`, its attend (every layer, also
// after a failure, so that a proxy on another thread is never left waiting).
void run_large_step(kvsdk_cache* large, const kvsdk_geometry& g, const StepInput& in, bool attend,
                    StepOut& r) {
  const size_t n = in.pos.size();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    kvsdk_status st = kvsdk_cache_append(large, l, n, in.k[l].data(), in.v[l].data(),
                                         in.pos.data(), in.k[l].size() * sizeof(float));
    std::vector<float> o;
    if (st == KVSDK_OK && attend) {
      o.resize(in.q[l].size());
      st = kvsdk_cache_attend(large, l, n, in.q[l].data(), in.pos.data(),
                              in.q[l].size() * sizeof(float), o.data(), o.size() * sizeof(float));
      if (st != KVSDK_OK) o.clear();
    }
    r.out.push_back(std::move(o));
    if (st != KVSDK_OK && r.status == KVSDK_OK) r.status = st;
  }
}

// The host's step on one side: the proxy's append and attend of every layer (when `attend`;
// with `proxy` only), then per layer the large cache's append and, when `attend`, its attend.
StepOut run_step(Side& s, const kvsdk_geometry& g, const StepInput& in, bool attend = true,
                 bool proxy_step = true, bool proxy_attend = true) {
  StepOut r;
  if (proxy_step && s.proxy) run_proxy_step(s.proxy.get(), in, proxy_attend, r);
  run_large_step(s.large.get(), g, in, attend, r);
  return r;
}

// The same step on both sides: equal statuses, attention within the tolerance (large and proxy).
kvsdk_status both_step(Side& d, Side& c, const kvsdk_geometry& g, const StepInput& in,
                       bool attend = true, bool proxy_step = true, bool proxy_attend = true) {
  const StepOut x = run_step(d, g, in, attend, proxy_step, proxy_attend);
  const std::string why = kvsdk_last_error();
  const StepOut y = run_step(c, g, in, attend, proxy_step, proxy_attend);
  EXPECT_EQ(x.status, y.status) << "device: " << why << " / cpu: " << kvsdk_last_error();
  for (size_t l = 0; l < x.out.size() && l < y.out.size(); ++l) {
    expect_close(x.out[l], y.out[l], ("attention, layer " + std::to_string(l)).c_str());
  }
  for (size_t l = 0; l < x.proxy_out.size() && l < y.proxy_out.size(); ++l) {
    expect_close(x.proxy_out[l], y.proxy_out[l],
                 ("proxy attention, layer " + std::to_string(l)).c_str());
  }
  return x.status;
}

// The pair of sides of a test: the device side (large on `gpu`, proxy on `gpu` or on its own
// CPU_REFERENCE context) and the CPU side (both on CPU_REFERENCE; the proxy shares the large
// cache's context exactly when the device side's does).
struct Rig {
  ContextPtr gpu, cpu, dproxy_ctx, cproxy_ctx;
  Side d, c;
  kvsdk_geometry g{};
  bool ok = false;

  // `gpu` must be a CUDA context already created (CUDA_CONTEXT_OR_SKIP); `cache_budget` > 0 sets
  // a per-cache budget on both large caches.
  void init(ContextPtr gpu_ctx, uint64_t ctx_budget, const kvsdk_geometry& geometry,
            const kvsdk_policy& p, bool proxy_on_device, uint64_t cache_budget = 0) {
    gpu = std::move(gpu_ctx);
    g = geometry;
    cpu = kvsdk_test::make_context(ctx_budget, KVSDK_BACKEND_CPU_REFERENCE);
    ASSERT_TRUE(cpu);
    d.lctx = gpu.get();
    c.lctx = cpu.get();
    if (proxy_on_device) {
      d.pctx = gpu.get();
      c.pctx = cpu.get();
    } else {
      dproxy_ctx = kvsdk_test::make_context(0, KVSDK_BACKEND_CPU_REFERENCE);
      cproxy_ctx = kvsdk_test::make_context(0, KVSDK_BACKEND_CPU_REFERENCE);
      ASSERT_TRUE(dproxy_ctx && cproxy_ctx);
      d.pctx = dproxy_ctx.get();
      c.pctx = cproxy_ctx.get();
    }
    d.large = kvsdk_test::make_cache(d.lctx, g, &p);
    ASSERT_TRUE(d.large) << "smallkv on CUDA: " << kvsdk_last_error();
    c.large = kvsdk_test::make_cache(c.lctx, g, &p);
    ASSERT_TRUE(c.large) << kvsdk_last_error();
    const kvsdk_geometry pg = proxy_geometry();
    d.proxy = kvsdk_test::make_cache(d.pctx, pg);
    ASSERT_TRUE(d.proxy) << kvsdk_last_error();
    c.proxy = kvsdk_test::make_cache(c.pctx, pg);
    ASSERT_TRUE(c.proxy) << kvsdk_last_error();
    if (cache_budget) {
      ASSERT_EQ(kvsdk_cache_set_budget(d.large.get(), cache_budget), KVSDK_OK)
          << kvsdk_last_error();
      ASSERT_EQ(kvsdk_cache_set_budget(c.large.get(), cache_budget), KVSDK_OK)
          << kvsdk_last_error();
    }
    ASSERT_EQ(kvsdk_cache_set_proxy(d.large.get(), d.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_set_proxy(c.large.get(), c.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
    ok = true;
  }
  kvsdk_status step(const StepInput& in, bool attend = true, bool proxy_step = true,
                    bool proxy_attend = true) {
    return both_step(d, c, g, in, attend, proxy_step, proxy_attend);
  }
  // Whatever the CPU answers, CUDA answers.
  template <typename Call>
  kvsdk_status same(const std::string& what, Call call) {
    const kvsdk_status x = call(d);
    const std::string why = kvsdk_last_error();
    const kvsdk_status y = call(c);
    EXPECT_EQ(x, y) << what << ": device: " << why << " / cpu: " << kvsdk_last_error();
    return x;
  }
};

// Prefill in chunks (each chunk's queries attended), then decode steps; every step compared.
// Returns the next position.
int32_t prefill_and_decode(Rig& r, size_t chunks, size_t chunk, size_t steps, uint32_t seed) {
  int32_t pos = 0;
  for (size_t i = 0; i < chunks; ++i) {
    SCOPED_TRACE("prefill chunk " + std::to_string(i));
    EXPECT_EQ(r.step(make_step(r.g, pos, chunk, seed + uint32_t(i))), KVSDK_OK)
        << kvsdk_last_error();
    pos += int32_t(chunk);
    if (::testing::Test::HasFailure()) return pos;
  }
  for (size_t i = 0; i < steps; ++i, ++pos) {
    SCOPED_TRACE("decode at " + std::to_string(pos));
    EXPECT_EQ(r.step(make_step(r.g, pos, 1, seed + 1000 + uint32_t(pos))), KVSDK_OK)
        << kvsdk_last_error();
    if (::testing::Test::HasFailure()) return pos;
  }
  return pos;
}

struct SmallKvCase {
  uint32_t dim, q_per_kv;
  float slack;  // < 0: the policy's default
  int32_t match_tokens;  // > the tokens run: eviction forces the matching early
  bool proxy_on_device;
};

std::string case_name(const SmallKvCase& s) {
  return "dim" + std::to_string(s.dim) + "_gqa" + std::to_string(s.q_per_kv) +
         (s.slack < 0 ? std::string("_slackdefault") : std::string("_slack0")) + "_match" +
         std::to_string(s.match_tokens) + (s.proxy_on_device ? "_proxycuda" : "_proxycpu");
}
void PrintTo(const SmallKvCase& s, std::ostream* os) { *os << case_name(s); }

class DeviceSmallKv : public ::testing::TestWithParam<SmallKvCase> {};

// Prefill chunks past the budget (evictions with marginal rows), then decode steps; after each
// step the attention, rows, bytes per tier, context charges and the snapshot; then an explicit
// compression to a lower per-cache budget, and decode steps after it.
TEST_P(DeviceSmallKv, DecodeStepsMatchTheCpuReference) {
  const SmallKvCase s = GetParam();
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 2 * s.q_per_kv, 2, s.dim);
  const kvsdk_policy p = smallkv_policy(s.match_tokens, s.slack);
  // Room for 24 full tokens besides the fixed metadata; the proxy, on the same context, gets
  // room of its own.
  const uint64_t proxy_room =
      s.proxy_on_device ? 128 * kLayers * (uint64_t(kProxyDim) * 4 + 4) : 0;
  const uint64_t budget = 24 * full_token_bytes(g) + fixed_bytes(g, s.match_tokens);
  const uint64_t ctx_budget = budget + proxy_room;
  CUDA_CONTEXT_OR_SKIP(gpu, ctx_budget);
  Rig r;
  r.init(std::move(gpu), ctx_budget, g, p, s.proxy_on_device, s.proxy_on_device ? budget : 0);
  ASSERT_TRUE(r.ok);
  int32_t pos = 0;
  for (size_t i = 0; i < 4; ++i, pos += 10) {
    SCOPED_TRACE("prefill chunk " + std::to_string(i));
    ASSERT_EQ(r.step(make_step(g, pos, 10, 10 + uint32_t(i))), KVSDK_OK) << kvsdk_last_error();
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
  }
  EXPECT_GT(stats(r.c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u)
      << "the prefill evicted to marginal rows";
  for (uint32_t step = 0; step < 12; ++step, ++pos) {
    SCOPED_TRACE("decode at " + std::to_string(pos));
    ASSERT_EQ(r.step(make_step(g, pos, 1, 100 + step)), KVSDK_OK) << kvsdk_last_error();
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
  }
  // Explicit compression: within the budget nothing happens; a lower per-cache budget compresses
  // now (exactly to it, no slack), on both alike.
  EXPECT_EQ(r.same("compress", [](Side& x) { return kvsdk_cache_compress(x.large.get()); }),
            KVSDK_OK);
  const uint64_t lower = stats(r.c.large.get()).bytes * 3 / 4;
  EXPECT_EQ(r.same("set_budget lower",
                   [&](Side& x) { return kvsdk_cache_set_budget(x.large.get(), lower); }),
            KVSDK_OK);
  EXPECT_EQ(r.same("compress again", [](Side& x) { return kvsdk_cache_compress(x.large.get()); }),
            KVSDK_OK);
  EXPECT_LE(stats(r.d.large.get()).bytes, lower);
  EXPECT_LE(stats(r.d.large.get()).device_reserved_bytes, budget);
  expect_same_state(r.d, r.c, g);
  ASSERT_FALSE(HasFailure());
  for (uint32_t step = 0; step < 4; ++step, ++pos) {
    SCOPED_TRACE("decode after the compression at " + std::to_string(pos));
    ASSERT_EQ(r.step(make_step(g, pos, 1, 200 + step)), KVSDK_OK) << kvsdk_last_error();
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DeviceSmallKv,
    ::testing::Values(SmallKvCase{64, 1, -1.0f, 16, false}, SmallKvCase{64, 2, 0.0f, 200, false},
                      SmallKvCase{128, 1, 0.0f, 16, false},
                      SmallKvCase{128, 2, -1.0f, 200, false},
                      SmallKvCase{64, 2, -1.0f, 16, true}, SmallKvCase{128, 1, 0.0f, 200, true}),
    [](const ::testing::TestParamInfo<SmallKvCase>& info) { return case_name(info.param); });

// Snapshots to a buffer and to a file: the CPU's bytes; each side's snapshot loads on the other
// backend and, with the proxy set again, continues alike; the proxy's own snapshot too.
TEST(DeviceSmallKvSnapshot, SavesAndLoadsBothWays) {
  for (bool proxy_on_device : {false, true}) {
    SCOPED_TRACE(proxy_on_device ? "proxy on cuda" : "proxy on cpu");
    const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 4, 2, 64);
    const kvsdk_policy p = smallkv_policy(16, -1.0f);
    const uint64_t budget = 20 * full_token_bytes(g) + fixed_bytes(g, 16);
    CUDA_CONTEXT_OR_SKIP(gpu, 1u << 20);
    Rig r;
    r.init(std::move(gpu), 1u << 20, g, p, proxy_on_device, budget);
    ASSERT_TRUE(r.ok);
    int32_t pos = prefill_and_decode(r, 3, 10, 6, 30);
    ASSERT_FALSE(HasFailure());
    ASSERT_GT(stats(r.c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u);
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());

    // Buffers: the same bytes (default options and uncompressed).
    kvsdk_save_options raw;
    kvsdk_save_options_init(&raw);
    raw.zstd_level = 0;
    for (const kvsdk_save_options* opt : {static_cast<const kvsdk_save_options*>(nullptr),
                                          static_cast<const kvsdk_save_options*>(&raw)}) {
      const auto x = kvsdk_test::save_buffer(r.d.large.get(), opt);
      const auto y = kvsdk_test::save_buffer(r.c.large.get(), opt);
      ASSERT_FALSE(x.empty());
      EXPECT_TRUE(x == y) << "snapshot bytes";
    }
    // Files: the same bytes.
    kvsdk_test::TempDir dir;
    const std::string fd = dir.file("device.kvc"), fc = dir.file("cpu.kvc");
    ASSERT_EQ(kvsdk_cache_save(r.d.large.get(), fd.c_str(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_save(r.c.large.get(), fc.c_str(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
    EXPECT_TRUE(file_bytes(fd) == file_bytes(fc)) << "snapshot files";
    // The proxies' snapshots too (they are loaded again for the loaded caches).
    const auto pd = kvsdk_test::save_buffer(r.d.proxy.get());
    const auto pc = kvsdk_test::save_buffer(r.c.proxy.get());
    EXPECT_TRUE(pd == pc) << "proxy snapshot bytes";

    // The CPU's file on CUDA, the device's buffer on the CPU; each with its proxy loaded again
    // (on the context the proxy lives on) and set.
    Side ld, lc;
    ld.lctx = r.d.lctx;
    ld.pctx = r.d.pctx;
    lc.lctx = r.c.lctx;
    lc.pctx = r.c.pctx;
    kvsdk_cache* raw_cache = nullptr;
    ASSERT_EQ(kvsdk_cache_load(&raw_cache, ld.lctx, fc.c_str(), &g, nullptr), KVSDK_OK)
        << kvsdk_last_error();
    ld.large.reset(raw_cache);
    const auto xd = kvsdk_test::save_buffer(r.d.large.get());
    ASSERT_EQ(kvsdk_cache_load_from_buffer(&raw_cache, lc.lctx, xd.data(), xd.size(), &g, nullptr),
              KVSDK_OK)
        << kvsdk_last_error();
    lc.large.reset(raw_cache);
    ld.proxy = kvsdk_test::load_buffer(ld.pctx, pc);
    ASSERT_TRUE(ld.proxy) << kvsdk_last_error();
    lc.proxy = kvsdk_test::load_buffer(lc.pctx, pd);
    ASSERT_TRUE(lc.proxy) << kvsdk_last_error();
    expect_same_rows(ld.large.get(), r.c.large.get(), g);
    expect_same_rows(lc.large.get(), r.c.large.get(), g);
    ASSERT_FALSE(HasFailure());
    // Both loaded caches read what they were saved from, before and after the proxy is set.
    EXPECT_TRUE(kvsdk_test::snapshot(ld.large.get()) == kvsdk_test::snapshot(r.c.large.get()));
    EXPECT_TRUE(kvsdk_test::snapshot(lc.large.get()) == kvsdk_test::snapshot(r.d.large.get()));
    ASSERT_EQ(kvsdk_cache_set_proxy(ld.large.get(), ld.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_set_proxy(lc.large.get(), lc.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
    expect_same_state(ld, lc, g);
    ASSERT_FALSE(HasFailure());
    // Truncation after a load: only tokens appended since (none yet) can go.
    const kvsdk_status td = kvsdk_cache_truncate(ld.large.get(), pos - 1);
    EXPECT_EQ(td, kvsdk_cache_truncate(lc.large.get(), pos - 1));
    EXPECT_EQ(td, KVSDK_E_STATE);
    // The loaded pair continues alike, and as the originals do.
    for (uint32_t step = 0; step < 6; ++step, ++pos) {
      SCOPED_TRACE("after the load, decode at " + std::to_string(pos));
      const StepInput in = make_step(g, pos, 1, 500 + step);
      ASSERT_EQ(both_step(ld, lc, g, in), KVSDK_OK);
      ASSERT_EQ(r.step(in), KVSDK_OK);
      expect_same_state(ld, lc, g);
      expect_same_state(ld, r.c, g);
      ASSERT_FALSE(HasFailure());
    }
    // A snapshot of the loaded device cache loads on the device again.
    const auto again = kvsdk_test::save_buffer(ld.large.get());
    CachePtr twice = kvsdk_test::load_buffer(ld.lctx, again);
    ASSERT_TRUE(twice) << kvsdk_last_error();
    expect_same_rows(twice.get(), lc.large.get(), g);
  }
}

// Forks of both large caches (each with a fork of its proxy) continue independently of their
// parents and alike across the backends; a fork that does not fit the context is refused on both.
TEST(DeviceSmallKvFork, ForksContinueLikeTheCpu) {
  for (bool proxy_on_device : {false, true}) {
    SCOPED_TRACE(proxy_on_device ? "proxy on cuda" : "proxy on cpu");
    const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 2, 2, 128);
    const kvsdk_policy p = smallkv_policy(16, 0.0f);
    const uint64_t budget = 16 * full_token_bytes(g) + fixed_bytes(g, 16);
    CUDA_CONTEXT_OR_SKIP(gpu, 1u << 20);
    Rig r;
    r.init(std::move(gpu), 1u << 20, g, p, proxy_on_device, budget);
    ASSERT_TRUE(r.ok);
    int32_t pos = prefill_and_decode(r, 2, 12, 4, 60);
    ASSERT_FALSE(HasFailure());
    ASSERT_GT(stats(r.c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u);
    Side fd, fc;
    fd.lctx = r.d.lctx;
    fd.pctx = r.d.pctx;
    fc.lctx = r.c.lctx;
    fc.pctx = r.c.pctx;
    kvsdk_cache* out = nullptr;
    ASSERT_EQ(kvsdk_cache_fork(&out, r.d.large.get()), KVSDK_OK) << kvsdk_last_error();
    fd.large.reset(out);
    ASSERT_EQ(kvsdk_cache_fork(&out, r.c.large.get()), KVSDK_OK) << kvsdk_last_error();
    fc.large.reset(out);
    ASSERT_EQ(kvsdk_cache_fork(&out, r.d.proxy.get()), KVSDK_OK) << kvsdk_last_error();
    fd.proxy.reset(out);
    ASSERT_EQ(kvsdk_cache_fork(&out, r.c.proxy.get()), KVSDK_OK) << kvsdk_last_error();
    fc.proxy.reset(out);
    EXPECT_TRUE(kvsdk_test::snapshot(fd.large.get()) == kvsdk_test::snapshot(r.d.large.get()))
        << "a fork saves as its parent";
    EXPECT_TRUE(kvsdk_test::snapshot(fc.large.get()) == kvsdk_test::snapshot(r.c.large.get()));
    expect_same_rows(fd.large.get(), r.d.large.get(), g);
    ASSERT_EQ(kvsdk_cache_set_proxy(fd.large.get(), fd.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_set_proxy(fc.large.get(), fc.proxy.get()), KVSDK_OK)
        << kvsdk_last_error();
    expect_same_state(fd, fc, g);
    ASSERT_FALSE(HasFailure());
    // After a fork only tokens appended since can go: refused on both.
    EXPECT_EQ(r.same("truncate a fork's history",
                     [&](Side& x) {
                       return kvsdk_cache_truncate(&x == &r.d ? fd.large.get() : fc.large.get(),
                                                   pos - 2);
                     }),
              KVSDK_E_STATE);
    // Parents and forks take different tokens; the first step of both is the same input, so a
    // fork attends as its parent did.
    for (uint32_t step = 0; step < 6; ++step, ++pos) {
      SCOPED_TRACE("decode at " + std::to_string(pos));
      const StepInput parent = make_step(g, pos, 1, 700 + step);
      const StepInput child = step == 0 ? parent : make_step(g, pos, 1, 800 + step);
      const StepOut a = run_step(fd, g, child);
      const StepOut b = run_step(fc, g, child);
      ASSERT_EQ(a.status, KVSDK_OK) << kvsdk_last_error();
      ASSERT_EQ(b.status, KVSDK_OK) << kvsdk_last_error();
      for (uint32_t l = 0; l < kLayers; ++l) expect_close(a.out[l], b.out[l], "fork attention");
      const StepOut e = run_step(r.d, g, parent);
      const StepOut f = run_step(r.c, g, parent);
      ASSERT_EQ(e.status, KVSDK_OK) << kvsdk_last_error();
      ASSERT_EQ(f.status, KVSDK_OK) << kvsdk_last_error();
      for (uint32_t l = 0; l < kLayers; ++l) {
        expect_close(e.out[l], f.out[l], "parent attention");
        if (step == 0) expect_close(a.out[l], e.out[l], "a fork attends as its parent");
      }
      expect_same_state(fd, fc, g);
      expect_same_state(r.d, r.c, g);
      ASSERT_FALSE(HasFailure());
    }
    EXPECT_FALSE(kvsdk_test::snapshot(fd.large.get()) == kvsdk_test::snapshot(r.d.large.get()))
        << "the fork went its own way";
  }
  // A fork beyond the context's budget: KVSDK_E_BUDGET on both, nothing charged.
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 2, 2, 64);
  const kvsdk_policy p = smallkv_policy(16, -1.0f);
  const uint64_t budget = 16 * full_token_bytes(g) + fixed_bytes(g, 16);
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  Rig r;
  r.init(std::move(gpu), budget, g, p, false);
  ASSERT_TRUE(r.ok);
  prefill_and_decode(r, 3, 8, 2, 90);
  ASSERT_FALSE(HasFailure());
  const uint64_t used = kvsdk_test::used(r.gpu.get());
  EXPECT_EQ(r.same("fork over the budget",
                   [](Side& x) {
                     kvsdk_cache* out = nullptr;
                     const kvsdk_status st = kvsdk_cache_fork(&out, x.large.get());
                     kvsdk_cache_destroy(out);
                     return st;
                   }),
            KVSDK_E_BUDGET);
  EXPECT_EQ(kvsdk_test::used(r.gpu.get()), used);
  expect_same_state(r.d, r.c, g);
}

// kvsdk_cache_truncate: allowed (rows appended since the last attend, the proxy truncated too)
// and refused (rows an attend counted; the proxy's latest queries of removed positions; a bad
// position) alike; after an allowed cut both continue alike.
TEST(DeviceSmallKvTruncate, AllowedAndRefusedLikeTheCpu) {
  for (bool proxy_on_device : {false, true}) {
    SCOPED_TRACE(proxy_on_device ? "proxy on cuda" : "proxy on cpu");
    const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 4, 2, 64);
    const kvsdk_policy p = smallkv_policy(16, -1.0f);
    const uint64_t budget = 20 * full_token_bytes(g) + fixed_bytes(g, 16);
    CUDA_CONTEXT_OR_SKIP(gpu, 1u << 20);
    Rig r;
    r.init(std::move(gpu), 1u << 20, g, p, proxy_on_device, budget);
    ASSERT_TRUE(r.ok);
    // Appends only, before any attend: a cut at 0 gives back a fresh pair.
    ASSERT_EQ(r.step(make_step(g, 0, 6, 1), false, true, false), KVSDK_OK);
    const auto trunc = [&](int32_t at) {
      return [at](Side& x) {
        const kvsdk_status st = kvsdk_cache_truncate(x.large.get(), at);
        if (st == KVSDK_OK) EXPECT_EQ(kvsdk_cache_truncate(x.proxy.get(), at), KVSDK_OK);
        return st;
      };
    };
    EXPECT_EQ(r.same("truncate appends at 0", trunc(0)), KVSDK_OK);
    EXPECT_EQ(stats(r.d.large.get()).bytes, stats(r.c.large.get()).bytes);
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
    int32_t pos = prefill_and_decode(r, 3, 10, 4, 120);
    ASSERT_FALSE(HasFailure());
    ASSERT_GT(stats(r.c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u);
    // Refused: rows an attend counted; a bad position.
    const auto before = kvsdk_test::snapshot(r.d.large.get());
    EXPECT_EQ(r.same("truncate attended rows", trunc(pos - 2)), KVSDK_E_STATE);
    EXPECT_EQ(r.same("truncate at -1", trunc(-1)), KVSDK_E_INVALID_ARG);
    EXPECT_EQ(r.same("truncate past the end", trunc(pos + 5)), KVSDK_OK);
    EXPECT_TRUE(kvsdk_test::snapshot(r.d.large.get()) == before) << "refusals changed nothing";
    // A detour that only appended (large and proxy) but evicted: refused (an eviction freezes
    // the rows it kept), as on the CPU; the large caches must evict to take it.
    ASSERT_EQ(r.step(make_step(g, pos, 3, 140), false, true, false), KVSDK_OK);
    expect_same_state(r.d, r.c, g);
    EXPECT_EQ(r.same("truncate rows past an eviction", trunc(pos)), KVSDK_E_STATE);
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
    pos += 3;
    // Allowed: with room in the budget (no eviction), a detour that only appended goes back.
    EXPECT_EQ(r.same("raise the budget",
                     [](Side& x) { return kvsdk_cache_set_budget(x.large.get(), 0); }),
              KVSDK_OK);
    {
      const auto at_detour = kvsdk_test::snapshot(r.d.large.get());
      ASSERT_EQ(r.step(make_step(g, pos, 3, 145), false, true, false), KVSDK_OK);
      expect_same_state(r.d, r.c, g);
      EXPECT_EQ(r.same("truncate appended rows", trunc(pos + 1)), KVSDK_OK);
      EXPECT_EQ(r.same("truncate appended rows", trunc(pos)), KVSDK_OK);
      expect_same_state(r.d, r.c, g);
      EXPECT_TRUE(kvsdk_test::snapshot(r.d.large.get()) == at_detour)
          << "back to before the detour";
      ASSERT_FALSE(HasFailure());
    }
    // Refused: the proxy attended positions the large cache only appended.
    {
      const StepInput in = make_step(g, pos, 2, 150);
      ASSERT_EQ(r.step(in, false, true, true), KVSDK_OK);
      EXPECT_EQ(r.same("truncate positions of the proxy's latest queries", trunc(pos)),
                KVSDK_E_STATE);
      expect_same_state(r.d, r.c, g);
      // The large caches attend that step after all; both continue alike.
      for (uint32_t l = 0; l < kLayers; ++l) {
        std::vector<float> od(in.q[l].size()), oc(in.q[l].size());
        EXPECT_EQ(kvsdk_cache_attend(r.d.large.get(), l, 2, in.q[l].data(), in.pos.data(),
                                     in.q[l].size() * 4, od.data(), od.size() * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
        EXPECT_EQ(kvsdk_cache_attend(r.c.large.get(), l, 2, in.q[l].data(), in.pos.data(),
                                     in.q[l].size() * 4, oc.data(), oc.size() * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
        expect_close(od, oc, "attention of the step the proxy ran first");
      }
      pos += 2;
    }
    EXPECT_EQ(r.same("restore the budget (compresses)",
                     [&](Side& x) { return kvsdk_cache_set_budget(x.large.get(), budget); }),
              KVSDK_OK);
    expect_same_state(r.d, r.c, g);
    for (uint32_t step = 0; step < 4; ++step, ++pos) {
      SCOPED_TRACE("decode after the truncations at " + std::to_string(pos));
      ASSERT_EQ(r.step(make_step(g, pos, 1, 160 + step)), KVSDK_OK);
      expect_same_state(r.d, r.c, g);
      ASSERT_FALSE(HasFailure());
    }
  }
}

// Every other call, bad input included: whatever the CPU answers, CUDA answers, to the same
// effect (failed calls change nothing).
TEST(DeviceSmallKvApi, BadInputAndMisuseMatchTheCpu) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 4, 2, 64);
  const kvsdk_policy p = smallkv_policy(16, -1.0f);
  const uint64_t budget = 20 * full_token_bytes(g) + fixed_bytes(g, 16);
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  Rig r;
  r.init(std::move(gpu), budget, g, p, false);
  ASSERT_TRUE(r.ok);
  int32_t pos = prefill_and_decode(r, 2, 8, 2, 200);
  ASSERT_FALSE(HasFailure());
  const auto before = kvsdk_test::snapshot(r.d.large.get());
  const StepInput in = make_step(g, pos, 1, 210);
  const size_t kv_bytes = in.k[0].size() * sizeof(float), q_bytes = in.q[0].size() * sizeof(float);
  std::vector<float> o(in.q[0].size()), kbuf(64 * g.head_dim), vbuf(kbuf.size());
  std::vector<int32_t> pbuf(64);
  size_t n = 0;
  r.same("append: NULL cache", [&](Side&) {
    return kvsdk_cache_append(nullptr, 0, 1, in.k[0].data(), in.v[0].data(), in.pos.data(),
                              kv_bytes);
  });
  r.same("append: layer out of range", [&](Side& x) {
    return kvsdk_cache_append(x.large.get(), kLayers, 1, in.k[0].data(), in.v[0].data(),
                              in.pos.data(), kv_bytes);
  });
  r.same("append: NULL keys", [&](Side& x) {
    return kvsdk_cache_append(x.large.get(), 0, 1, nullptr, in.v[0].data(), in.pos.data(),
                              kv_bytes);
  });
  r.same("append: NULL values", [&](Side& x) {
    return kvsdk_cache_append(x.large.get(), 0, 1, in.k[0].data(), nullptr, in.pos.data(),
                              kv_bytes);
  });
  r.same("append: wrong size", [&](Side& x) {
    return kvsdk_cache_append(x.large.get(), 0, 1, in.k[0].data(), in.v[0].data(), in.pos.data(),
                              kv_bytes - 4);
  });
  r.same("append: zero tokens", [&](Side& x) {
    return kvsdk_cache_append(x.large.get(), 0, 0, in.k[0].data(), in.v[0].data(), in.pos.data(),
                              0);
  });
  r.same("append: bad position", [&](Side& x) {
    const int32_t bad = -3;
    return kvsdk_cache_append(x.large.get(), 0, 1, in.k[0].data(), in.v[0].data(), &bad,
                              kv_bytes);
  });
  r.same("attend: NULL cache", [&](Side&) {
    return kvsdk_cache_attend(nullptr, 0, 1, in.q[0].data(), in.pos.data(), q_bytes, o.data(),
                              q_bytes);
  });
  r.same("attend: layer out of range", [&](Side& x) {
    return kvsdk_cache_attend(x.large.get(), kLayers, 1, in.q[0].data(), in.pos.data(), q_bytes,
                              o.data(), q_bytes);
  });
  r.same("attend: NULL q", [&](Side& x) {
    return kvsdk_cache_attend(x.large.get(), 0, 1, nullptr, in.pos.data(), q_bytes, o.data(),
                              q_bytes);
  });
  r.same("attend: NULL out", [&](Side& x) {
    return kvsdk_cache_attend(x.large.get(), 0, 1, in.q[0].data(), in.pos.data(), q_bytes,
                              nullptr, q_bytes);
  });
  r.same("attend: wrong size", [&](Side& x) {
    return kvsdk_cache_attend(x.large.get(), 0, 1, in.q[0].data(), in.pos.data(), q_bytes - 4,
                              o.data(), q_bytes);
  });
  r.same("attend: the proxy has not attended this step", [&](Side& x) {
    return kvsdk_cache_attend(x.large.get(), 0, 1, in.q[0].data(), in.pos.data(), q_bytes,
                              o.data(), q_bytes);
  });
  r.same("read: NULL cache", [&](Side&) {
    return kvsdk_cache_read(nullptr, 0, 0, nullptr, nullptr, nullptr, 0, &n);
  });
  r.same("read: layer out of range", [&](Side& x) {
    return kvsdk_cache_read(x.large.get(), kLayers, 0, nullptr, nullptr, nullptr, 0, &n);
  });
  r.same("read: kv head out of range", [&](Side& x) {
    return kvsdk_cache_read(x.large.get(), 0, g.n_kv_heads, nullptr, nullptr, nullptr, 0, &n);
  });
  r.same("read: NULL count", [&](Side& x) {
    return kvsdk_cache_read(x.large.get(), 0, 0, nullptr, nullptr, nullptr, 0, nullptr);
  });
  r.same("read: capacity too small", [&](Side& x) {
    return kvsdk_cache_read(x.large.get(), 0, 0, kbuf.data(), vbuf.data(), pbuf.data(), 1, &n);
  });
  r.same("layer stats: layer out of range", [&](Side& x) {
    kvsdk_layer_stats ls;
    kvsdk_layer_stats_init(&ls);
    return kvsdk_cache_layer_stats_get(x.large.get(), kLayers, &ls);
  });
  r.same("observe (ignored by smallkv)", [&](Side& x) {
    return kvsdk_cache_observe(x.large.get(), 0, 1, in.q[0].data(), in.pos.data(), q_bytes);
  });
  r.same("observe: layer out of range", [&](Side& x) {
    return kvsdk_cache_observe(x.large.get(), kLayers, 1, in.q[0].data(), in.pos.data(), q_bytes);
  });
  r.same("truncate: NULL", [](Side&) { return kvsdk_cache_truncate(nullptr, 0); });
  r.same("compress: NULL", [](Side&) { return kvsdk_cache_compress(nullptr); });
  r.same("fork: NULL source", [](Side&) {
    kvsdk_cache* out = nullptr;
    return kvsdk_cache_fork(&out, nullptr);
  });
  r.same("fork: NULL out", [](Side& x) { return kvsdk_cache_fork(nullptr, x.large.get()); });
  r.same("set_proxy: NULL cache",
         [](Side& x) { return kvsdk_cache_set_proxy(nullptr, x.proxy.get()); });
  r.same("set_proxy: itself",
         [](Side& x) { return kvsdk_cache_set_proxy(x.large.get(), x.large.get()); });
  r.same("set_proxy: the proxy's own",
         [](Side& x) { return kvsdk_cache_set_proxy(x.proxy.get(), x.large.get()); });
  r.same("set_proxy: the current one again",
         [](Side& x) { return kvsdk_cache_set_proxy(x.large.get(), x.proxy.get()); });
  r.same("set_proxy: a proxy that is not 'full'", [&](Side& x) {
    kvsdk_policy h2o;
    EXPECT_EQ(kvsdk_policy_parse(&h2o, "h2o"), KVSDK_OK);
    CachePtr other = kvsdk_test::make_cache(x.pctx, proxy_geometry(), &h2o);
    return kvsdk_cache_set_proxy(x.large.get(), other.get());
  });
  r.same("set_proxy: a proxy that serves another cache", [&](Side& x) {
    CachePtr other = kvsdk_test::make_cache(x.lctx, g, &p);
    EXPECT_TRUE(other) << kvsdk_last_error();
    return kvsdk_cache_set_proxy(other.get(), x.proxy.get());
  });
  r.same("set_proxy: a proxy with too few heads for the mapping", [&](Side& x) {
    CachePtr small = kvsdk_test::make_cache(x.pctx, kvsdk_test::make_geometry(1, 1, 1, 64));
    EXPECT_TRUE(small) << kvsdk_last_error();
    return kvsdk_cache_set_proxy(x.large.get(), small.get());
  });
  r.same("set_proxy_wait: NULL", [](Side&) { return kvsdk_cache_set_proxy_wait(nullptr, 5); });
  ASSERT_EQ(kvsdk_cache_set_proxy(r.d.large.get(), r.d.proxy.get()), KVSDK_OK)
      << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_set_proxy(r.c.large.get(), r.c.proxy.get()), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_TRUE(kvsdk_test::snapshot(r.d.large.get()) == before)
      << "the failed calls changed nothing";
  expect_same_state(r.d, r.c, g);
  ASSERT_FALSE(HasFailure());
  // The pair still runs alike after all that.
  for (uint32_t step = 0; step < 3; ++step, ++pos) {
    ASSERT_EQ(r.step(make_step(g, pos, 1, 220 + step)), KVSDK_OK) << kvsdk_last_error();
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
  }
}

// Without its proxy a cache with marginal rows refuses to attend, to evict (an append past the
// budget, compress, a lower budget) with KVSDK_E_STATE on both, and changes nothing; with the
// proxy set again it continues alike.
TEST(DeviceSmallKvProxy, WithoutTheProxyRefusesLikeTheCpu) {
  for (bool proxy_on_device : {false, true}) {
    SCOPED_TRACE(proxy_on_device ? "proxy on cuda" : "proxy on cpu");
    const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 2, 2, 128);
    const kvsdk_policy p = smallkv_policy(16, 0.0f);
    const uint64_t budget = 16 * full_token_bytes(g) + fixed_bytes(g, 16);
    CUDA_CONTEXT_OR_SKIP(gpu, 1u << 20);
    Rig r;
    r.init(std::move(gpu), 1u << 20, g, p, proxy_on_device, budget);
    ASSERT_TRUE(r.ok);
    int32_t pos = prefill_and_decode(r, 2, 12, 2, 300);
    ASSERT_FALSE(HasFailure());
    ASSERT_GT(stats(r.c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u);
    EXPECT_EQ(r.same("detach",
                     [](Side& x) { return kvsdk_cache_set_proxy(x.large.get(), nullptr); }),
              KVSDK_OK);
    const auto unchanged = kvsdk_test::snapshot(r.d.large.get());
    const StepInput in = make_step(g, pos - 1, 1, 310);
    std::vector<float> o(in.q[0].size());
    for (uint32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(r.same("attend over marginal rows without the proxy",
                       [&](Side& x) {
                         return kvsdk_cache_attend(x.large.get(), l, 1, in.q[l].data(),
                                                   in.pos.data(), in.q[l].size() * 4, o.data(),
                                                   o.size() * 4);
                       }),
                KVSDK_E_STATE);
    }
    EXPECT_EQ(r.same("compress within the budget",
                     [](Side& x) { return kvsdk_cache_compress(x.large.get()); }),
              KVSDK_OK);
    const uint64_t lower = stats(r.c.large.get()).bytes / 2;
    EXPECT_EQ(r.same("lower budget without the proxy",
                     [&](Side& x) { return kvsdk_cache_set_budget(x.large.get(), lower); }),
              KVSDK_E_STATE);
    EXPECT_TRUE(kvsdk_test::snapshot(r.d.large.get()) == unchanged)
        << "the refusals changed nothing";
    // Appends (the proxy still runs its steps) until one needs an eviction: refused at the same
    // token on both.
    kvsdk_status st = KVSDK_OK;
    for (int i = 0; i < 40 && st == KVSDK_OK; ++i) {
      const StepInput a = make_step(g, pos, 1, 320 + uint32_t(i));
      st = r.step(a, false);
      if (st == KVSDK_OK) ++pos;
    }
    EXPECT_EQ(st, KVSDK_E_STATE);
    expect_same_state(r.d, r.c, g);
    ASSERT_FALSE(HasFailure());
    // The refused step's rows that went in (the proxy's, a large layer's that fit) go again, so
    // that the proxies hold what the large caches hold; then the proxies are set again.
    EXPECT_EQ(r.same("truncate the refused step",
                     [&](Side& x) { return kvsdk_cache_truncate(x.large.get(), pos); }),
              KVSDK_OK);
    for (Side* x : {&r.d, &r.c}) {
      ASSERT_EQ(kvsdk_cache_truncate(x->proxy.get(), pos), KVSDK_OK) << kvsdk_last_error();
      ASSERT_EQ(kvsdk_cache_set_proxy(x->large.get(), x->proxy.get()), KVSDK_OK)
          << kvsdk_last_error();
    }
    for (uint32_t step = 0; step < 4; ++step, ++pos) {
      SCOPED_TRACE("decode with the proxy again at " + std::to_string(pos));
      ASSERT_EQ(r.step(make_step(g, pos, 1, 360 + step)), KVSDK_OK) << kvsdk_last_error();
      expect_same_state(r.d, r.c, g);
      ASSERT_FALSE(HasFailure());
    }
  }
}

// Budgets too small: a context whose budget cannot hold the smallkv cache's fixed metadata and a
// row refuses its first append with KVSDK_E_BUDGET on both, holding nothing; a per-cache budget
// below that is refused alike.
TEST(DeviceSmallKvBudget, TooSmallABudgetRefusesLikeTheCpu) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 4, 2, 64);
  const kvsdk_policy p = smallkv_policy(16, -1.0f);
  const uint64_t budget = fixed_bytes(g, 16) / 2;
  CUDA_CONTEXT_OR_SKIP(gpu, budget);
  ContextPtr cpu = kvsdk_test::make_context(budget, KVSDK_BACKEND_CPU_REFERENCE);
  ASSERT_TRUE(cpu);
  kvsdk_cache* a = nullptr;
  kvsdk_cache* b = nullptr;
  const kvsdk_status ca = kvsdk_cache_create(&a, gpu.get(), &g, &p);
  const std::string why = kvsdk_last_error();
  const kvsdk_status cb = kvsdk_cache_create(&b, cpu.get(), &g, &p);
  ASSERT_EQ(ca, cb) << "create: device: " << why << " / cpu: " << kvsdk_last_error();
  CachePtr da(a), db(b);
  if (ca == KVSDK_OK) {
    ContextPtr pa = kvsdk_test::make_context(0, KVSDK_BACKEND_CPU_REFERENCE);
    ContextPtr pb = kvsdk_test::make_context(0, KVSDK_BACKEND_CPU_REFERENCE);
    Side d{std::move(da), kvsdk_test::make_cache(pa.get(), proxy_geometry()), gpu.get(), pa.get()};
    Side c{std::move(db), kvsdk_test::make_cache(pb.get(), proxy_geometry()), cpu.get(), pb.get()};
    ASSERT_EQ(kvsdk_cache_set_proxy(d.large.get(), d.proxy.get()), KVSDK_OK);
    ASSERT_EQ(kvsdk_cache_set_proxy(c.large.get(), c.proxy.get()), KVSDK_OK);
    EXPECT_EQ(both_step(d, c, g, make_step(g, 0, 4, 400)), KVSDK_E_BUDGET);
    EXPECT_EQ(stats(d.large.get()).tokens, 0u);
    expect_same_state(d, c, g);
  } else {
    EXPECT_EQ(ca, KVSDK_E_BUDGET) << why;
  }
  EXPECT_EQ(kvsdk_test::used(gpu.get()), kvsdk_test::used(cpu.get()));

  // A per-cache budget below what the cache must keep: refused on both, nothing changed.
  const uint64_t room = 16 * full_token_bytes(g) + fixed_bytes(g, 16);
  CUDA_CONTEXT_OR_SKIP(gpu2, room);
  Rig r;
  r.init(std::move(gpu2), room, g, p, false);
  ASSERT_TRUE(r.ok);
  const int32_t next = prefill_and_decode(r, 2, 8, 2, 410);
  ASSERT_FALSE(HasFailure());
  const auto before = kvsdk_test::snapshot(r.d.large.get());
  EXPECT_EQ(r.same("set_budget below the fixed bytes",
                   [&](Side& x) { return kvsdk_cache_set_budget(x.large.get(), 8); }),
            KVSDK_E_BUDGET);
  EXPECT_TRUE(kvsdk_test::snapshot(r.d.large.get()) == before);
  expect_same_state(r.d, r.c, g);
  // Filling the context exactly: every step fits (the cache evicts), never past the budget.
  for (int32_t pos = next; pos < next + 20; ++pos) {
    ASSERT_EQ(r.step(make_step(g, pos, 1, 420 + uint32_t(pos))), KVSDK_OK) << kvsdk_last_error();
    EXPECT_LE(stats(r.d.large.get()).device_reserved_bytes, room);
    EXPECT_LE(kvsdk_test::used(r.gpu.get()), room);
  }
  expect_same_state(r.d, r.c, g);
}

// ---- The proxy on its own thread (kvsdk_cache_set_proxy_wait), with the proxy on a CUDA
// context: the link's softmax then runs on the device over the proxy's device rows, on the large
// cache's thread (weights()) or, once every head is matched, on the proxy's thread in its attend
// (precompute_probs()), each with its own device buffers. Named outside DeviceSmallKv* so that
// the tsan preset runs it: the two threads' device calls are what it is there for.

// The proxy's thread of a run: one std::thread for all its steps, handed each step's part and
// waited for as a join would (the header's rules: the proxy's thread starts a step only after the
// large cache's previous one returned, and the large cache's step ends only after the proxy's).
// One thread rather than one per step: the shim keeps its block fibers per thread, and under
// TSan every new thread's fibers slow every later synchronisation (this suite took two to three
// times as long with a thread per step).
class ProxyThread {
 public:
  ProxyThread() : thread_([this] { loop(); }) {}
  ~ProxyThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_ = std::move(work);
    }
    cv_.notify_all();
  }
  void finish() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !work_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || work_; });
      if (!work_) return;
      lock.unlock();
      work_();  // (work_ is not touched elsewhere until it is cleared below)
      lock.lock();
      work_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> work_;
  bool stop_ = false;
  std::thread thread_;  // (last: started once the members above exist)
};

// A step with the proxy's part on `proxy_thread` while this thread runs the large cache's part
// over the same positions.
StepOut run_step_parallel(ProxyThread& proxy_thread, Side& s, const kvsdk_geometry& g,
                          const StepInput& in) {
  StepOut r, p;
  proxy_thread.start([&] { run_proxy_step(s.proxy.get(), in, true, p); });
  run_large_step(s.large.get(), g, in, true, r);
  proxy_thread.finish();
  r.proxy_out = std::move(p.proxy_out);
  return r;
}

// A large smallkv cache on `lctx` with its 'full' proxy on `pctx`, a per-cache budget and the
// proxy wait `wait_ms` (0: none).
void make_threads_side(Side& s, kvsdk_context* lctx, kvsdk_context* pctx, const kvsdk_geometry& g,
                       const kvsdk_policy& p, uint64_t budget, uint32_t wait_ms) {
  s.lctx = lctx;
  s.pctx = pctx;
  s.large = kvsdk_test::make_cache(lctx, g, &p);
  ASSERT_TRUE(s.large) << kvsdk_last_error();
  s.proxy = kvsdk_test::make_cache(pctx, proxy_geometry());
  ASSERT_TRUE(s.proxy) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_set_budget(s.large.get(), budget), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_set_proxy(s.large.get(), s.proxy.get()), KVSDK_OK) << kvsdk_last_error();
  if (wait_ms) {
    ASSERT_EQ(kvsdk_cache_set_proxy_wait(s.large.get(), wait_ms), KVSDK_OK) << kvsdk_last_error();
  }
}

// The bytes the calls of the proxy's part of a step, run first on this thread, brought back from
// the device beyond the proxy's own attention outputs: the link's probabilities when the proxy's
// attend computed them (precompute_probs()), 0 otherwise. Counted by the shim; 0 on a GPU.
unsigned long long proxy_step_extra_down(kvsdk_cache* proxy, const StepInput& in, StepOut& r) {
#ifdef KVSDK_CUDA_HOST_SHIM
  const auto down = [] {
    const kvsdk::cuda_host::TransferBytes t = kvsdk::cuda_host::transfer_bytes();
    return t.to_host_pinned + t.to_host_pageable;
  };
  const unsigned long long before = down();
  run_proxy_step(proxy, in, true, r);
  unsigned long long outputs = 0;
  for (const auto& o : r.proxy_out) outputs += o.size() * sizeof(float);
  return down() - before - outputs;
#else
  run_proxy_step(proxy, in, true, r);
  return 0;
#endif
}

// The same inputs on CUDA run sequentially (the proxy first on this thread, no wait: the large
// cache's attend computes every proxy softmax itself): the large cache's outputs of every step,
// the snapshot at the end and proxy_step_extra_down() of the last step.
struct SequentialRun {
  std::vector<std::vector<float>> out;  // [step * kLayers + layer]
  std::vector<uint8_t> snapshot;
  unsigned long long extra_down = 0;
};

void run_sequential(SequentialRun& run, kvsdk_context* lctx, kvsdk_context* pctx,
                    const kvsdk_geometry& g, const kvsdk_policy& p, uint64_t budget,
                    const std::vector<StepInput>& steps) {
  Side s;
  make_threads_side(s, lctx, pctx, g, p, budget, 0);
  if (::testing::Test::HasFatalFailure()) return;
  for (const StepInput& in : steps) {
    StepOut r;
    run.extra_down = proxy_step_extra_down(s.proxy.get(), in, r);
    run_large_step(s.large.get(), g, in, true, r);
    ASSERT_EQ(r.status, KVSDK_OK) << kvsdk_last_error();
    for (auto& o : r.out) run.out.push_back(std::move(o));
  }
  run.snapshot = kvsdk_test::snapshot(s.large.get());
}

// Prefill chunks within the budget, then decode steps: the first eviction (and with it the head
// matching) comes during decode, and every later step evicts into marginal rows. The large cache
// on CUDA with its proxy on the same CUDA context or on a second one, the wait set and the
// proxy's part of each step on its own thread, against the CPU reference run sequentially (proxy
// first, no wait): attention within 2e-4, rows and accounting bit for bit after every step, and
// the snapshots. The last step runs the proxy first on this thread (the wait still set), where
// the shim shows that the proxy's attend computed the probabilities on the device (what the
// parallel steps since the matching did on the proxy's thread); without the wait it brings back
// nothing but its outputs. Then the same inputs on CUDA sequentially without the wait (every
// proxy softmax on the large cache's thread): the parallel run's outputs and snapshot bit for bit.
void proxy_threads_case(bool second_context) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, 4, 2, 64);
  const kvsdk_policy p = smallkv_policy(16, 0.0f);
  const uint64_t budget = 14 * full_token_bytes(g) + fixed_bytes(g, 16);
  std::vector<StepInput> steps;
  int32_t pos = 0;
  for (uint32_t i = 0; i < 2; ++i, pos += 6) steps.push_back(make_step(g, pos, 6, 600 + i));
  const size_t prefill = steps.size();
  for (uint32_t i = 0; i < 7; ++i, ++pos) steps.push_back(make_step(g, pos, 1, 610 + i));

  CUDA_CONTEXT_OR_SKIP(gpu, 1u << 20);
  ContextPtr gpu2;
  if (second_context) {
    ASSERT_EQ(cuda_context(1u << 20, gpu2), KVSDK_OK) << kvsdk_last_error();
  }
  kvsdk_context* const dp = second_context ? gpu2.get() : gpu.get();
  ContextPtr cpu = kvsdk_test::make_context(1u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  ContextPtr cpu2 = kvsdk_test::make_context(1u << 20, KVSDK_BACKEND_CPU_REFERENCE);
  ASSERT_TRUE(cpu && cpu2);
  kvsdk_context* const cp = second_context ? cpu2.get() : cpu.get();

  std::vector<std::vector<float>> parallel_out;
  std::vector<uint8_t> parallel_snapshot;
  {
    Side d, c;
    ProxyThread proxy_thread;
    make_threads_side(d, gpu.get(), dp, g, p, budget, 10000);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    make_threads_side(c, cpu.get(), cp, g, p, budget, 0);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    for (size_t i = 0; i < steps.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i) + " at " + std::to_string(steps[i].pos[0]));
      StepOut x;
      if (i + 1 < steps.size()) {
        x = run_step_parallel(proxy_thread, d, g, steps[i]);
      } else {
        const unsigned long long extra = proxy_step_extra_down(d.proxy.get(), steps[i], x);
        run_large_step(d.large.get(), g, steps[i], true, x);
#ifdef KVSDK_CUDA_HOST_SHIM
        EXPECT_GT(extra, 0u) << "the proxy's attend computed the probabilities (wait set)";
#else
        (void)extra;
#endif
      }
      const std::string why = kvsdk_last_error();
      const StepOut y = run_step(c, g, steps[i]);
      ASSERT_EQ(x.status, KVSDK_OK) << why;
      ASSERT_EQ(y.status, KVSDK_OK) << kvsdk_last_error();
      for (uint32_t l = 0; l < kLayers; ++l) {
        expect_close(x.out[l], y.out[l], ("attention, layer " + std::to_string(l)).c_str());
        expect_close(x.proxy_out[l], y.proxy_out[l],
                     ("proxy attention, layer " + std::to_string(l)).c_str());
      }
      expect_same_state(d, c, g);
      ASSERT_FALSE(::testing::Test::HasFailure());
      if (i + 1 == prefill) {
        ASSERT_EQ(stats(c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u)
            << "no eviction (and no matching) before the decode steps";
      }
      for (const auto& o : x.out) parallel_out.push_back(o);
    }
    ASSERT_GT(stats(c.large.get()).bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u)
        << "the decode steps evicted into marginal rows";
    parallel_snapshot = kvsdk_test::snapshot(d.large.get());
  }
  SequentialRun plain;
  run_sequential(plain, gpu.get(), dp, g, p, budget, steps);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(plain.extra_down, 0u) << "without the wait the proxy's attend computes nothing more";
  ASSERT_EQ(plain.out.size(), parallel_out.size());
  for (size_t i = 0; i < plain.out.size(); ++i) {
    ASSERT_EQ(plain.out[i].size(), parallel_out[i].size());
    EXPECT_EQ(0, std::memcmp(plain.out[i].data(), parallel_out[i].data(),
                             plain.out[i].size() * sizeof(float)))
        << "attention, sequential vs parallel: step " << i / kLayers << " layer " << i % kLayers;
  }
  EXPECT_TRUE(plain.snapshot == parallel_snapshot) << "snapshot bytes, sequential vs parallel";
}

TEST(DeviceProxyThreads, ProxyOnTheSameCudaContextOnItsOwnThreadMatchesTheCpu) {
  proxy_threads_case(false);
}

TEST(DeviceProxyThreads, ProxyOnASecondCudaContextOnItsOwnThreadMatchesTheCpu) {
  proxy_threads_case(true);
}

}  // namespace
