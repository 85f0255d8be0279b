// Property: a call that fails leaves the cache unchanged (kvsdk.h, ABI rules; "On any error the
// cache is unchanged"). For every policy preset (eviction presets with and without '+kiviN'
// overlays, kivi, spindlekv, minicache, specache, smallkv with its proxy) a cache is driven through
// the C API to the edge of a small budget, then calls that must fail are made: appends refused for
// the budget, attends, observes, compresses and budget changes that cannot succeed. Around every
// failed call everything a host can observe is compared byte for byte: the rows and positions of
// every layer and KV head (kvsdk_cache_read), kvsdk_cache_stats (bytes by tier, tokens), the
// context's used bytes, SpeCache's fetch hit rate, and a snapshot (kvsdk_cache_save_to_buffer),
// which also holds the state that decides later results (H2O scores, observation windows,
// allocation state, SmallKV's row scores, head mapping and matching statistics).
//
// The same property under allocation failure (KVSDK_E_NO_MEMORY): this binary replaces the global
// operator new so that a test can make the n-th allocation of a call fail, for n = 0, 1, 2, ...
// until the call runs through; every call that failed must have changed nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/cache.h"
#include "kvsdk.h"
#include "repr/smallkv_repr.h"
#include "test_util.h"

using namespace kvsdk_test;

// Allocation failure injection: while g_fail_countdown >= 0, the allocation that finds it at 0
// throws std::bad_alloc (once); every other allocation goes to malloc.
namespace {
std::atomic<long> g_fail_countdown{-1};
std::atomic<bool> g_failed{false};

void* allocate(size_t n) {
  if (g_fail_countdown.load(std::memory_order_relaxed) >= 0 &&
      g_fail_countdown.fetch_sub(1, std::memory_order_relaxed) == 0) {
    g_failed.store(true, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* allocate_nothrow(size_t n) noexcept {
  try {
    return allocate(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
}  // namespace

// Every (unaligned) form, so that all of them pair with the delete below (sanitizers check).
void* operator new(size_t n) { return allocate(n); }
void* operator new[](size_t n) { return allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate_nothrow(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate_nothrow(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

// Large model: 4 layers x 4 query heads x 2 KV heads. SmallKV's proxy: 2 layers x 2 query heads x
// 1 KV head, every large KV head built from one proxy layer so that the two KV heads of a large
// layer match proxy heads of different proxy layers (see Host::large_from_proxy).
constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16;
constexpr uint32_t kPLayers = 2, kPQ = 2;
constexpr size_t kKvRow = size_t(kKv) * kDim, kQRow = size_t(kQ) * kDim;
constexpr size_t kPKvRow = kDim, kPQRow = size_t(kPQ) * kDim;
// The budget: this many tokens of every layer in f16 (keys, values, positions).
constexpr uint64_t kBudgetTokens = 24;

// Everything a host can observe of a cache.
struct Observed {
  std::vector<std::vector<uint8_t>> heads;  // per layer and KV head: count, k, v, positions
  kvsdk_cache_stats stats{};
  uint64_t context_used = 0;
  std::vector<uint8_t> snapshot;
  // SpeCache's fetch hit rate (not in snapshots); other policies: KVSDK_E_UNSUPPORTED.
  kvsdk_status fetch_status = KVSDK_OK;
  double hit_rate = 0;
  uint64_t hit_samples = 0;
};

template <class T>
void put_bytes(std::vector<uint8_t>& out, const T* p, size_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

Observed capture(kvsdk_cache* c, kvsdk_context* ctx) {
  Observed o;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kKv; ++h) {
      size_t n = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      std::vector<float> k(n * kDim), v(n * kDim);
      std::vector<int32_t> pos(n);
      size_t got = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, k.data(), v.data(), pos.data(), n, &got), KVSDK_OK);
      std::vector<uint8_t> bytes;
      put_bytes(bytes, &got, 1);
      put_bytes(bytes, k.data(), k.size());
      put_bytes(bytes, v.data(), v.size());
      put_bytes(bytes, pos.data(), pos.size());
      o.heads.push_back(std::move(bytes));
    }
  }
  std::memset(&o.stats, 0, sizeof o.stats);
  o.stats.struct_size = sizeof o.stats;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &o.stats), KVSDK_OK);
  EXPECT_EQ(kvsdk_context_used_bytes(ctx, &o.context_used), KVSDK_OK);
  // (The fastest zstd level: only equality matters. One encode when the buffer is large enough.)
  kvsdk_save_options opt;
  kvsdk_save_options_init(&opt);
  opt.zstd_level = -7;
  size_t size = 0;
  o.snapshot.resize(size_t(1) << 20);
  if (kvsdk_cache_save_to_buffer(c, &opt, o.snapshot.data(), o.snapshot.size(), &size) !=
      KVSDK_OK) {
    EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &opt, nullptr, 0, &size), KVSDK_OK)
        << kvsdk_last_error();
    o.snapshot.resize(size);
    EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &opt, o.snapshot.data(), size, &size), KVSDK_OK)
        << kvsdk_last_error();
  }
  o.snapshot.resize(size);
  o.fetch_status = kvsdk_cache_fetch_stats(c, &o.hit_rate, &o.hit_samples);
  return o;
}

bool same(const Observed& a, const Observed& b) {
  return a.heads == b.heads && std::memcmp(&a.stats, &b.stats, sizeof a.stats) == 0 &&
         a.context_used == b.context_used && a.snapshot == b.snapshot &&
         a.fetch_status == b.fetch_status &&
         std::memcmp(&a.hit_rate, &b.hit_rate, sizeof a.hit_rate) == 0 &&
         a.hit_samples == b.hit_samples;
}

void expect_same(const Observed& a, const Observed& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.heads.size(), b.heads.size());
  for (size_t i = 0; i < a.heads.size(); ++i) {
    EXPECT_TRUE(a.heads[i] == b.heads[i])
        << "rows of layer " << i / kKv << " KV head " << i % kKv << " changed";
  }
  const kvsdk_cache_stats &s = a.stats, &t = b.stats;
  EXPECT_EQ(s.tokens, t.tokens);
  EXPECT_EQ(s.appended_tokens, t.appended_tokens);
  EXPECT_EQ(s.bytes, t.bytes);
  for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) {
    EXPECT_EQ(s.bytes_by_tier[i], t.bytes_by_tier[i]) << "tier " << i;
  }
  EXPECT_EQ(s.full_bytes, t.full_bytes);
  EXPECT_EQ(s.backing_bytes, t.backing_bytes);
  EXPECT_EQ(s.context_used_bytes, t.context_used_bytes);
  EXPECT_EQ(a.context_used, b.context_used);
  EXPECT_TRUE(a.snapshot == b.snapshot) << "the snapshot changed (" << a.snapshot.size()
                                        << " -> " << b.snapshot.size() << " bytes)";
  EXPECT_EQ(a.fetch_status, b.fetch_status);
  EXPECT_EQ(a.hit_rate, b.hit_rate) << "the fetch hit rate changed";
  EXPECT_EQ(a.hit_samples, b.hit_samples);
}

struct Preset {
  const char* spec;
  bool evicts;       // an exact-tier eviction preset (refuses appends only under an allocation)
  bool overlay;      // with a '+kiviN' overlay: fits any append by evicting more (fit_caps)
  bool fixed_bytes;  // holds bytes no eviction frees (windows, compressed layers): set_budget(1)
                     // must fail
};

const Preset kPresets[] = {
    {"full", false, false, true},
    {"streaming_llm", true, false, false},
    {"h2o", true, false, false},
    {"snapkv", true, false, true},
    {"pyramidkv", true, false, true},
    {"xkv", true, false, true},
    {"streaming_llm+kivi2", true, true, false},
    {"h2o+kivi4", true, true, false},
    {"snapkv+kivi2", true, true, true},
    {"pyramidkv+kivi1", true, true, true},
    {"xkv+kivi2", true, true, true},
    {"kivi", false, false, true},
    {"kivi+kivi4", false, false, true},
    {"spindlekv", true, false, true},
    {"minicache", false, false, true},
    {"minicache+kivi4", false, false, true},
    {"specache", false, false, true},
    {"smallkv", false, false, true},
};

void PrintTo(const Preset& p, std::ostream* os) { *os << p.spec; }

bool is(const Preset& p, const char* method) {
  const std::string s(p.spec);
  return s.compare(0, std::strlen(method), method) == 0;
}

// A host driving one cache (and SmallKV's proxy) step by step; every append the cache refuses is
// checked to have changed nothing.
struct Host {
  const Preset& preset;
  kvsdk_policy policy{};
  ContextPtr ctx, pctx;
  CachePtr cache, proxy;
  std::mt19937 rng{1234};
  int32_t next = 0;
  bool smallkv = false;
  int refused_appends = 0;
  // The proxy's keys, values and queries of the last step, per proxy layer (SmallKV).
  std::vector<std::vector<float>> pk, pv, pq;

  explicit Host(const Preset& p) : preset(p) {
    EXPECT_EQ(kvsdk_policy_parse(&policy, p.spec), KVSDK_OK) << p.spec;
    policy.quant_group = 4;  // small KIVI blocks and windows: short runs quantize
    policy.quant_residual = 4;
    policy.obs_window = 4;
    policy.sink_tokens = 2;
    policy.fetch_tokens = 4;
    policy.match_tokens = 24;
    smallkv = policy.method == KVSDK_METHOD_SMALLKV;
    const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
    ctx = make_context(kBudgetTokens * kLayers * exact_bytes_per_token(g));
    cache = make_cache(ctx.get(), g, &policy);
    EXPECT_TRUE(cache) << p.spec << ": " << kvsdk_last_error();
    if (smallkv) {
      pctx = make_context();
      proxy = make_cache(pctx.get(), make_geometry(kPLayers, kPQ, 1, kDim));
      EXPECT_EQ(kvsdk_cache_set_proxy(cache.get(), proxy.get()), KVSDK_OK);
    }
  }

  Observed snap() { return capture(cache.get(), ctx.get()); }

  std::vector<float> noise(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> x(n);
    for (float& e : x) e = d(rng);
    return x;
  }

  // The proxy's part of a step: append n tokens to every proxy layer, attend those in `attend`.
  void proxy_step(const std::vector<int32_t>& pos, uint32_t attend_layers = kPLayers) {
    const size_t n = pos.size();
    pk.assign(kPLayers, {});
    pv.assign(kPLayers, {});
    pq.assign(kPLayers, {});
    for (uint32_t l = 0; l < kPLayers; ++l) {
      pk[l] = noise(n * kPKvRow, 3.0f);
      pv[l] = noise(n * kPKvRow);
      pq[l] = noise(n * kPQRow, 3.0f);
      ASSERT_EQ(kvsdk_cache_append(proxy.get(), l, n, pk[l].data(), pv[l].data(), pos.data(),
                                   pk[l].size() * 4),
                KVSDK_OK);
      if (l >= attend_layers) continue;
      std::vector<float> out(pq[l].size());
      ASSERT_EQ(kvsdk_cache_attend(proxy.get(), l, n, pq[l].data(), pos.data(), pq[l].size() * 4,
                                   out.data(), out.size() * 4),
                KVSDK_OK);
    }
  }

  // SmallKV: large layer l's KV head g holds proxy layer (l + g) % 2's keys (values with a little
  // noise), and its query head (g, j) proxy head 1 - j's queries, so the two KV heads of a layer
  // match heads of different proxy layers. Other presets: random rows.
  void layer_rows(uint32_t l, size_t n, std::vector<float>& k, std::vector<float>& v,
                  std::vector<float>& q) {
    k = noise(n * kKvRow, 3.0f);
    v = noise(n * kKvRow);
    q = noise(n * kQRow, 3.0f);
    if (!smallkv) return;
    for (size_t t = 0; t < n; ++t) {
      for (uint32_t g = 0; g < kKv; ++g) {
        const uint32_t src = (l + g) % kPLayers;
        for (uint32_t x = 0; x < kDim; ++x) {
          k[(t * kKv + g) * kDim + x] = pk[src][t * kDim + x];
          v[(t * kKv + g) * kDim + x] = pv[src][t * kDim + x] + 0.1f * v[(t * kKv + g) * kDim + x];
          for (uint32_t j = 0; j < 2; ++j) {
            q[(t * kQ + g * 2 + j) * kDim + x] = pq[src][(t * kPQ + (1 - j)) * kDim + x];
          }
        }
      }
    }
  }

  // Appends to one layer; a refused append must change nothing. Returns its status.
  kvsdk_status append(uint32_t l, const std::vector<float>& k, const std::vector<float>& v,
                      const std::vector<int32_t>& pos) {
    const Observed before = snap();
    const kvsdk_status st = kvsdk_cache_append(cache.get(), l, pos.size(), k.data(), v.data(),
                                               pos.data(), k.size() * 4);
    if (st != KVSDK_OK) {
      ++refused_appends;
      expect_same(before, snap(), std::string(preset.spec) + ": append to layer " +
                                      std::to_string(l) + " refused with " +
                                      kvsdk_status_str(st) + " (" + kvsdk_last_error() + ")");
    }
    return st;
  }

  // One decode step of n tokens: (proxy step,) then per layer append, attend and observe
  // (specache: prefetch with the step's queries too). Returns the first refused append's status.
  kvsdk_status step(size_t n) {
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), next);
    if (smallkv) proxy_step(pos);
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k, v, q;
      layer_rows(l, n, k, v, q);
      const kvsdk_status st = append(l, k, v, pos);
      if (st != KVSDK_OK) return st;
      std::vector<float> out(q.size());
      EXPECT_EQ(kvsdk_cache_attend(cache.get(), l, n, q.data(), pos.data(), q.size() * 4,
                                   out.data(), out.size() * 4),
                KVSDK_OK)
          << preset.spec << ": " << kvsdk_last_error();
      EXPECT_EQ(kvsdk_cache_observe(cache.get(), l, n, q.data(), pos.data(), q.size() * 4),
                KVSDK_OK)
          << preset.spec << ": " << kvsdk_last_error();
      if (policy.method == KVSDK_METHOD_SPECACHE) {
        const kvsdk_status ps = kvsdk_cache_prefetch(cache.get(), l, 1, q.data(), pos.data(),
                                                     kQRow * 4);
        EXPECT_TRUE(ps == KVSDK_OK || ps == KVSDK_E_BUDGET) << kvsdk_last_error();
      }
    }
    next += int32_t(n);
    return KVSDK_OK;
  }

  // Runs steps until an append is refused (non-evicting presets) or `steps` steps passed.
  kvsdk_status drive(int steps) {
    for (int s = 0; s < steps; ++s) {
      const kvsdk_status st = step(2);
      if (st != KVSDK_OK) return st;
    }
    return KVSDK_OK;
  }

  // Expects `call` to fail with `want` (any error when want is KVSDK_OK) and to change nothing.
  template <class Call>
  void expect_refused(const std::string& what, kvsdk_status want, Call call) {
    const Observed before = snap();
    const kvsdk_status st = call();
    const std::string label = std::string(preset.spec) + ": " + what;
    if (want == KVSDK_OK) {
      EXPECT_NE(st, KVSDK_OK) << label;
    } else {
      EXPECT_EQ(st, want) << label << ": " << kvsdk_status_str(st) << " (" << kvsdk_last_error()
                          << ")";
    }
    if (st == KVSDK_OK) return;
    expect_same(before, snap(), label + " failed with " + kvsdk_status_str(st) + " (" +
                                    kvsdk_last_error() + ")");
  }

  // A call that may fail; if it does, it must have changed nothing.
  template <class Call>
  kvsdk_status maybe_refused(const std::string& what, Call call) {
    const Observed before = snap();
    const kvsdk_status st = call();
    if (st != KVSDK_OK) {
      expect_same(before, snap(), std::string(preset.spec) + ": " + what + " failed with " +
                                      kvsdk_status_str(st) + " (" + kvsdk_last_error() + ")");
    }
    return st;
  }

  std::vector<uint64_t> allocation() {
    std::vector<uint64_t> a(kLayers);
    EXPECT_EQ(kvsdk_cache_allocation(cache.get(), a.data(), kLayers), KVSDK_OK);
    return a;
  }
};

class FailedCallUnchanged : public ::testing::TestWithParam<Preset> {};

// The snapshot, rows and stats of an untouched cache compare equal (the comparison is sound).
TEST_P(FailedCallUnchanged, CaptureIsDeterministic) {
  Host h(GetParam());
  ASSERT_TRUE(h.cache);
  ASSERT_EQ(h.drive(3), KVSDK_OK) << kvsdk_last_error();
  expect_same(h.snap(), h.snap(), "two captures of the same cache");
}

// At the edge of the budget: appends beyond it, and budget changes the cache cannot meet.
TEST_P(FailedCallUnchanged, BudgetRefusalsChangeNothing) {
  const Preset& p = GetParam();
  Host h(p);
  ASSERT_TRUE(h.cache);
  const kvsdk_status driven = h.drive(p.evicts || h.smallkv ? 40 : 200);
  if (p.evicts || h.smallkv) {
    // Eviction keeps these inside the budget (SpindleKV's codebook layers may fill it first).
    if (!is(p, "spindlekv")) EXPECT_EQ(driven, KVSDK_OK) << kvsdk_last_error();
  } else {
    EXPECT_EQ(driven, KVSDK_E_BUDGET) << "the drive should reach the budget";
  }
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(kvsdk_cache_stats_get(h.cache.get(), &st), KVSDK_OK);
  EXPECT_GT(st.bytes, 0u);

  // An append larger than the whole budget: no eviction can make room for it.
  const size_t big = size_t(kBudgetTokens) * 8;
  std::vector<int32_t> pos(big);
  std::iota(pos.begin(), pos.end(), h.next);
  if (h.smallkv) h.proxy_step(pos);
  std::vector<float> k, v, q;
  h.layer_rows(0, big, k, v, q);
  if (!p.evicts || is(p, "spindlekv")) {  // spindlekv: layer 0 is a codebook layer
    EXPECT_EQ(h.append(0, k, v, pos), KVSDK_E_BUDGET) << p.spec << ": " << kvsdk_last_error();
  }

  // A per-cache budget of one byte: only a cache whose every byte can be evicted meets it.
  if (p.fixed_bytes) {
    h.expect_refused("set_budget(1)", KVSDK_E_BUDGET,
                     [&] { return kvsdk_cache_set_budget(h.cache.get(), 1); });
  }
  // An allocation beyond the budget, or on a policy without one.
  {
    std::vector<uint64_t> a(kLayers, uint64_t(kBudgetTokens) * 100);
    h.expect_refused("set_allocation beyond the budget",
                     p.evicts ? KVSDK_E_BUDGET : KVSDK_OK,
                     [&] { return kvsdk_cache_set_allocation(h.cache.get(), a.data(), kLayers); });
  }
  // Compress at the budget: nothing to do.
  EXPECT_EQ(h.maybe_refused("compress", [&] { return kvsdk_cache_compress(h.cache.get()); }),
            KVSDK_OK)
      << kvsdk_last_error();
  if (!p.evicts || is(p, "spindlekv")) EXPECT_GT(h.refused_appends, 0);
}

// Calls refused for their arguments (layer out of range) after a few steps change nothing.
TEST_P(FailedCallUnchanged, ArgumentRefusalsChangeNothing) {
  const Preset& p = GetParam();
  Host h(p);
  ASSERT_TRUE(h.cache);
  h.drive(20);  // non-evicting presets may reach the budget (a refused append is checked too)
  std::vector<float> q = h.noise(kQRow), out(kQRow, 7.0f);
  const int32_t pos = h.next;
  h.expect_refused("attend on a layer out of range", KVSDK_E_OUT_OF_RANGE, [&] {
    return kvsdk_cache_attend(h.cache.get(), kLayers, 1, q.data(), &pos, q.size() * 4, out.data(),
                              out.size() * 4);
  });
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
  h.expect_refused("observe on a layer out of range", KVSDK_E_OUT_OF_RANGE, [&] {
    return kvsdk_cache_observe(h.cache.get(), kLayers, 1, q.data(), &pos, q.size() * 4);
  });
  std::vector<float> k = h.noise(kKvRow), v = h.noise(kKvRow);
  const int32_t neg = -1;
  h.expect_refused("append with a negative position", KVSDK_E_INVALID_ARG, [&] {
    return kvsdk_cache_append(h.cache.get(), 0, 1, k.data(), v.data(), &neg, k.size() * 4);
  });
}

// Eviction presets refuse an append only under a fixed allocation that the context cannot hold
// any more (another cache took the rest of it); without an overlay that append must fail.
class FailedCallUnchangedEvicting : public ::testing::TestWithParam<Preset> {};

TEST_P(FailedCallUnchangedEvicting, AppendBeyondAFixedAllocationChangesNothing) {
  const Preset& p = GetParam();
  Host h(p);
  ASSERT_TRUE(h.cache);
  // (SpindleKV: few enough steps that its codebook layers leave room for rows in the others.)
  ASSERT_EQ(h.drive(is(p, "spindlekv") ? 10 : 30), KVSDK_OK) << kvsdk_last_error();
  // SpindleKV's first half of the layers are codebook layers (not allocated: entry 0).
  const uint32_t first = is(p, "spindlekv") ? kLayers / 2 : 0;
  std::vector<uint64_t> a = h.allocation();
  for (uint32_t l = 0; l < kLayers; ++l) a[l] = l < first ? 0 : a[l] / 2;
  ASSERT_EQ(kvsdk_cache_set_allocation(h.cache.get(), a.data(), kLayers), KVSDK_OK)
      << kvsdk_last_error();
  for (uint32_t l = first; l < kLayers; ++l) a[l] += 2;
  ASSERT_EQ(kvsdk_cache_set_allocation(h.cache.get(), a.data(), kLayers), KVSDK_OK)
      << kvsdk_last_error();
  // Another cache takes the rest of the context.
  CachePtr other = make_cache(h.ctx.get(), make_geometry(kLayers, kQ, kKv, kDim));
  ASSERT_TRUE(other);
  std::vector<float> k1 = h.noise(kKvRow), v1 = h.noise(kKvRow);
  for (int32_t t = 0; kvsdk_cache_append(other.get(), 0, 1, k1.data(), v1.data(), &t,
                                         k1.size() * 4) == KVSDK_OK;
       ++t) {
  }
  std::vector<int32_t> pos{h.next};
  std::vector<float> k, v, q;
  h.layer_rows(first, 1, k, v, q);
  const kvsdk_status st = h.append(first, k, v, pos);
  if (!p.overlay) EXPECT_EQ(st, KVSDK_E_BUDGET) << kvsdk_last_error();
  // Window presets: observing more queries than the window holds may need room it cannot get.
  std::vector<float> qs = h.noise(8 * kQRow);
  std::vector<int32_t> qpos(8);
  std::iota(qpos.begin(), qpos.end(), h.next);
  for (uint32_t l = first; l < kLayers; ++l) {
    h.maybe_refused("observe with the context full", [&] {
      return kvsdk_cache_observe(h.cache.get(), l, 8, qs.data(), qpos.data(), qs.size() * 4);
    });
  }
}

// SmallKV: attends that fail part-way (the proxy out of step, or detached while marginal rows
// need its weights), appends that must evict without a proxy, and set_budget that cannot be met.
TEST(FailedCallUnchangedSmallKv, RefusalsChangeNothing) {
  const Preset p{"smallkv", false, false, true};
  Host h(p);
  ASSERT_TRUE(h.cache);
  ASSERT_EQ(h.drive(40), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(kvsdk_cache_stats_get(h.cache.get(), &st), KVSDK_OK);
  ASSERT_GT(st.bytes_by_tier[KVSDK_TIER_VALUE_ONLY], 0u) << "the drive should evict to marginal";

  // The proxy runs the next token through both its layers but attends only its layer 0. In a
  // large layer whose KV head 0 is matched to proxy heads of proxy layer 0 only and KV head 1 to
  // one of proxy layer 1, the attend then fails at KV head 1, after KV head 0 was processed.
  const auto& repr =
      dynamic_cast<const kvsdk::SmallKvRepresentation&>(*h.cache->impl->representation());
  uint32_t layer = kLayers;
  for (uint32_t l = 0; l < kLayers && layer == kLayers; ++l) {
    const std::vector<uint32_t> map = repr.mapping(l);  // proxy head = proxy layer * kPQ + head
    const bool head0 = map[0] / kPQ == 0 && map[1] / kPQ == 0;
    const bool head1 = map[2] / kPQ == 1 || map[3] / kPQ == 1;
    if (repr.matched(l, 0) && repr.matched(l, 1) && head0 && head1) layer = l;
  }
  ASSERT_LT(layer, kLayers) << "no layer whose KV heads match different proxy layers";
  std::vector<int32_t> pos{h.next};
  h.proxy_step(pos, /*attend_layers=*/1);
  std::vector<float> k, v, q;
  h.layer_rows(layer, 1, k, v, q);
  ASSERT_EQ(h.append(layer, k, v, pos), KVSDK_OK) << kvsdk_last_error();
  std::vector<float> out(q.size(), 7.0f);
  h.expect_refused("attend with the proxy out of step", KVSDK_E_STATE, [&] {
    return kvsdk_cache_attend(h.cache.get(), layer, 1, q.data(), pos.data(), q.size() * 4,
                              out.data(), out.size() * 4);
  });
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
  // A failed attend repeated gives the same result as the first (nothing half-applied).
  h.expect_refused("attend with the proxy out of step, again", KVSDK_E_STATE, [&] {
    return kvsdk_cache_attend(h.cache.get(), layer, 1, q.data(), pos.data(), q.size() * 4,
                              out.data(), out.size() * 4);
  });

  // Appends that must evict, and set_budget(1), without a proxy: KVSDK_E_STATE.
  ASSERT_EQ(kvsdk_cache_set_proxy(h.cache.get(), nullptr), KVSDK_OK);
  h.expect_refused("attend over marginal rows without a proxy", KVSDK_E_STATE, [&] {
    return kvsdk_cache_attend(h.cache.get(), layer, 1, q.data(), pos.data(), q.size() * 4,
                              out.data(), out.size() * 4);
  });
  const size_t big = size_t(kBudgetTokens) * 8;
  std::vector<int32_t> bpos(big);
  std::iota(bpos.begin(), bpos.end(), h.next + 1);
  std::vector<float> bk = h.noise(big * kKvRow), bv = h.noise(big * kKvRow);
  EXPECT_EQ(h.append(1, bk, bv, bpos), KVSDK_E_STATE) << kvsdk_last_error();
  h.expect_refused("set_budget(1) without a proxy", KVSDK_E_STATE,
                   [&] { return kvsdk_cache_set_budget(h.cache.get(), 1); });

  // With the proxy: the same append and set_budget(1) are refused for the budget even after
  // evicting every row.
  ASSERT_EQ(kvsdk_cache_set_proxy(h.cache.get(), h.proxy.get()), KVSDK_OK);
  EXPECT_EQ(h.append(1, bk, bv, bpos), KVSDK_E_BUDGET) << kvsdk_last_error();
  h.expect_refused("set_budget(1)", KVSDK_E_BUDGET,
                   [&] { return kvsdk_cache_set_budget(h.cache.get(), 1); });
  // set_budget that can be met still works, and the cache goes on.
  ASSERT_EQ(kvsdk_cache_stats_get(h.cache.get(), &st), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_set_budget(h.cache.get(), st.bytes / 2), KVSDK_OK) << kvsdk_last_error();
  EXPECT_LE(h.snap().stats.bytes, st.bytes / 2);
}

// Runs `call` with its n-th allocation failing, for n = 0, 1, 2, ... until it runs without an
// injected failure; each run that failed must have changed nothing (the first one that did is
// reported). Returns the final status.
template <class Call>
kvsdk_status expect_atomic_under_allocation_failures(Host& h, const std::string& what, Call call) {
  const Observed before = h.snap();
  for (long n = 0; n < 100000; ++n) {
    g_failed = false;
    g_fail_countdown = n;
    const kvsdk_status st = call();
    g_fail_countdown = -1;
    if (!g_failed || st == KVSDK_OK) return st;  // ran through (or absorbed the failure)
    const std::string error = kvsdk_last_error();
    const Observed after = h.snap();
    if (!same(before, after)) {
      expect_same(before, after,
                  std::string(h.preset.spec) + ": " + what + " with allocation " +
                      std::to_string(n) + " failing: " + kvsdk_status_str(st) + " (" + error +
                      ")");
      return st;
    }
  }
  ADD_FAILURE() << what << ": too many allocations";
  return KVSDK_E_INTERNAL;
}

// Allocation failures in the calls of a decode step at the edge of the budget. Appends go to a
// cache past its budget (eviction presets and smallkv evict to make room) or with room for one
// more step (the others).
class AllocationFailure : public ::testing::TestWithParam<Preset> {
 protected:
  void SetUp() override {
    const Preset& p = GetParam();
    h_ = std::make_unique<Host>(p);
    ASSERT_TRUE(h_->cache);
    ASSERT_EQ(h_->drive(p.evicts || h_->smallkv ? (is(p, "spindlekv") ? 8 : 30) : 4), KVSDK_OK)
        << kvsdk_last_error();
    pos_.resize(2);
    std::iota(pos_.begin(), pos_.end(), h_->next);
    if (h_->smallkv) h_->proxy_step(pos_);
  }
  // Runs `call(layer, k, v, q)` for every layer under every allocation failure; layers for which
  // `append_first` is set get the step's rows appended first (without failures).
  template <class Call>
  void each_layer(const char* what, bool append_first, Call call,
                  const std::vector<uint32_t>& skip = {}) {
    for (uint32_t l = 0; l < kLayers && !HasFailure(); ++l) {
      if (std::find(skip.begin(), skip.end(), l) != skip.end()) continue;
      std::vector<float> k, v, q;
      h_->layer_rows(l, pos_.size(), k, v, q);
      out_.assign(q.size(), 0.0f);  // (allocated outside the failing call)
      if (append_first) {
        ASSERT_EQ(kvsdk_cache_append(h_->cache.get(), l, pos_.size(), k.data(), v.data(),
                                     pos_.data(), k.size() * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
      const std::string label = std::string(what) + " (layer " + std::to_string(l) + ")";
      const kvsdk_status st =
          expect_atomic_under_allocation_failures(*h_, label, [&] { return call(l, k, v, q); });
      EXPECT_EQ(st, KVSDK_OK) << label << ": " << kvsdk_last_error();
    }
  }
  std::unique_ptr<Host> h_;
  std::vector<int32_t> pos_;
  std::vector<float> out_;
};

TEST_P(AllocationFailure, AppendChangesNothing) {
  const Preset& p = GetParam();
  // Known limitation, not fixed here: in the layers these representations hold, an append goes
  // to one KV head's store after the other (SpeCache's copies, SpindleKV codebooks, MiniCache
  // merges) and the stores allocate as they go, so KVSDK_E_NO_MEMORY part-way through keeps the
  // tokens in the heads done so far (the budget charge matches what is held); documented in
  // kvsdk.h (kvsdk_cache_append). Those layers are skipped; the others are checked. KIVI stores
  // reserve room in every head before appending (KiviHeadStore::reserve), so 'kivi' is checked.
  std::vector<uint32_t> skip;
  if (is(p, "specache")) skip = {0, 1, 2, 3};
  if (is(p, "spindlekv")) skip = {0, 1};   // codebook layers (boundary_layer: half)
  if (is(p, "minicache")) skip = {2, 3};   // merged layers
  each_layer(
      "append", false,
      [&](uint32_t l, auto& k, auto& v, auto&) {
        return kvsdk_cache_append(h_->cache.get(), l, pos_.size(), k.data(), v.data(),
                                  pos_.data(), k.size() * 4);
      },
      skip);
  if (!skip.empty() && !HasFailure()) {
    GTEST_SKIP() << p.spec << ": " << skip.size() << " layer(s) not checked: an allocation "
                 << "failure part-way through an append to a compressed layer keeps the KV heads "
                 << "already appended";
  }
}

// The first appends past the budget (the first eviction, the first allocation plan), each under
// every allocation failure. The eviction presets without overlay and one with (the overlays share
// the orchestration; each costs many allocations per append).
TEST(AllocationFailureFirstEviction, AppendsChangeNothing) {
  for (const Preset& p : kPresets) {
    if (!p.evicts || is(p, "spindlekv")) continue;  // spindlekv: its codebook layers (see above)
    if (p.overlay && std::string(p.spec) != "xkv+kivi2") continue;
    SCOPED_TRACE(p.spec);
    Host h(p);
    ASSERT_TRUE(h.cache);
    // Until three steps after the first eviction (KIVI overlays hold more tokens first).
    int after_eviction = 0;
    for (int s = 0; s < 80 && after_eviction < 3 && !::testing::Test::HasFailure(); ++s) {
      std::vector<int32_t> pos(2);
      std::iota(pos.begin(), pos.end(), h.next);
      // Failures are injected from two steps before the budget on (f16 rows: an upper bound).
      const uint64_t budget =
          kBudgetTokens * kLayers * exact_bytes_per_token(make_geometry(kLayers, kQ, kKv, kDim));
      const bool near = h.snap().stats.bytes + 2 * 2 * budget / kBudgetTokens >= budget;
      for (uint32_t l = 0; l < kLayers; ++l) {
        std::vector<float> k, v, q;
        h.layer_rows(l, pos.size(), k, v, q);
        const auto append = [&] {
          return kvsdk_cache_append(h.cache.get(), l, pos.size(), k.data(), v.data(), pos.data(),
                                    k.size() * 4);
        };
        EXPECT_EQ(near ? expect_atomic_under_allocation_failures(h, "append", append) : append(),
                  KVSDK_OK);
        EXPECT_EQ(kvsdk_cache_observe(h.cache.get(), l, pos.size(), q.data(), pos.data(),
                                      q.size() * 4),
                  KVSDK_OK);
      }
      h.next += 2;
      if (h.snap().stats.tokens < uint64_t(h.next) * kLayers * kKv) ++after_eviction;
    }
    EXPECT_EQ(after_eviction, 3) << "no eviction";
  }
}

TEST_P(AllocationFailure, AttendChangesNothing) {
  each_layer("attend", true, [&](uint32_t l, auto&, auto&, auto& q) {
    return kvsdk_cache_attend(h_->cache.get(), l, pos_.size(), q.data(), pos_.data(),
                              q.size() * 4, out_.data(), out_.size() * 4);
  });
}

TEST_P(AllocationFailure, ObserveChangesNothing) {
  each_layer("observe", true, [&](uint32_t l, auto&, auto&, auto& q) {
    return kvsdk_cache_observe(h_->cache.get(), l, pos_.size(), q.data(), pos_.data(),
                               q.size() * 4);
  });
}

TEST_P(AllocationFailure, CompressAndSetBudgetChangeNothing) {
  const Preset& p = GetParam();
  EXPECT_EQ(expect_atomic_under_allocation_failures(
                *h_, "compress", [&] { return kvsdk_cache_compress(h_->cache.get()); }),
            KVSDK_OK);
  if (!p.evicts && !h_->smallkv) return;
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(kvsdk_cache_stats_get(h_->cache.get(), &st), KVSDK_OK);
  EXPECT_EQ(expect_atomic_under_allocation_failures(
                *h_, "set_budget(3/4 of the bytes)",
                [&] { return kvsdk_cache_set_budget(h_->cache.get(), st.bytes / 4 * 3); }),
            KVSDK_OK)
      << kvsdk_last_error();
  if (!p.evicts) return;
  // A fixed allocation of half the rows of each evicting layer (spindlekv: codebook layers 0).
  std::vector<uint64_t> a = h_->allocation();
  for (uint32_t l = 0; l < kLayers; ++l) {
    a[l] = is(p, "spindlekv") && l < kLayers / 2 ? 0 : a[l] / 2;
  }
  EXPECT_EQ(expect_atomic_under_allocation_failures(
                *h_, "set_allocation(half)",
                [&] { return kvsdk_cache_set_allocation(h_->cache.get(), a.data(), kLayers); }),
            KVSDK_OK)
      << kvsdk_last_error();
}

INSTANTIATE_TEST_SUITE_P(Presets, AllocationFailure, ::testing::ValuesIn(kPresets),
                         [](const ::testing::TestParamInfo<Preset>& info) {
                           std::string s = info.param.spec;
                           std::replace(s.begin(), s.end(), '+', '_');
                           return s;
                         });

TEST(AllocationFailureSpeCache, PrefetchChangesNothing) {
  // Known limitation, not fixed here: prefetch replaces the fetched rows of one KV head after the
  // other, so KVSDK_E_NO_MEMORY part-way through keeps the new fetch of the heads done so far.
  // Documented in kvsdk.h (kvsdk_cache_prefetch).
  GTEST_SKIP() << "an allocation failure part-way through a specache prefetch keeps the new "
                  "fetch of the KV heads done so far";
  Host h(Preset{"specache", false, false, true});
  ASSERT_TRUE(h.cache);
  ASSERT_EQ(h.drive(4), KVSDK_OK) << kvsdk_last_error();
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = h.noise(kQRow, 3.0f);
    const int32_t pos = h.next;
    expect_atomic_under_allocation_failures(h, "prefetch", [&] {
      return kvsdk_cache_prefetch(h.cache.get(), l, 1, q.data(), &pos, kQRow * 4);
    });
  }
}

// SmallKV: the proxy's attend feeds the link, then the large cache's append (evicting, with the
// first head matching) and attend use it; every allocation failure in any of them changes
// nothing, and the step then completes as without failures.
TEST(AllocationFailureSmallKv, StepsAndSetProxyChangeNothing) {
  const Preset p{"smallkv", false, false, true};
  Host h(p);
  ASSERT_TRUE(h.cache);
  for (int s = 0; s < 24 && !::testing::Test::HasFailure(); ++s) {
    std::vector<int32_t> pos(2);
    std::iota(pos.begin(), pos.end(), h.next);
    h.proxy_step(pos);
    for (uint32_t l = 0; l < kLayers && !::testing::Test::HasFailure(); ++l) {
      std::vector<float> k, v, q, out;
      h.layer_rows(l, pos.size(), k, v, q);
      out.resize(q.size());
      const std::string at = " (step " + std::to_string(s) + ", layer " + std::to_string(l) + ")";
      EXPECT_EQ(expect_atomic_under_allocation_failures(h, "append" + at, [&] {
                  return kvsdk_cache_append(h.cache.get(), l, pos.size(), k.data(), v.data(),
                                            pos.data(), k.size() * 4);
                }),
                KVSDK_OK);
      EXPECT_EQ(expect_atomic_under_allocation_failures(h, "attend" + at, [&] {
                  return kvsdk_cache_attend(h.cache.get(), l, pos.size(), q.data(), pos.data(),
                                            q.size() * 4, out.data(), out.size() * 4);
                }),
                KVSDK_OK);
    }
    h.next += 2;
  }
  // Re-linking the proxy under allocation failures keeps the old link.
  ASSERT_EQ(kvsdk_cache_set_proxy(h.cache.get(), nullptr), KVSDK_OK);
  EXPECT_EQ(expect_atomic_under_allocation_failures(
                h, "set_proxy",
                [&] { return kvsdk_cache_set_proxy(h.cache.get(), h.proxy.get()); }),
            KVSDK_OK);
  EXPECT_EQ(h.step(2), KVSDK_OK) << kvsdk_last_error();
}

std::string preset_name(const ::testing::TestParamInfo<Preset>& info) {
  std::string s = info.param.spec;
  for (char& c : s) {
    if (c == '+') c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Presets, FailedCallUnchanged, ::testing::ValuesIn(kPresets), preset_name);

std::vector<Preset> evicting_presets() {
  std::vector<Preset> out;
  for (const Preset& p : kPresets) {
    if (p.evicts) out.push_back(p);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Presets, FailedCallUnchangedEvicting,
                         ::testing::ValuesIn(evicting_presets()), preset_name);

}  // namespace
