// Policy 'specache' through the C ABI: prefetch + attend (exact over the f16 backing rows when
// every token is fetched), stats (backing store reported apart, never charged), the budget
// holding through appends and prefetches, a file-backed store giving identical results, the
// fetch hit rate, misuse statuses, and UNSUPPORTED for other policies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"
#include "util/half.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 32;
constexpr size_t kRow = kKv * kDim, kQRow = kQ * kDim;

kvsdk_policy specache_policy(const char* spec = "specache", int32_t fetch = 64) {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_SPECACHE);
  EXPECT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK) << kvsdk_last_error();
  p.quant_group = 8;
  p.quant_residual = 16;
  p.fetch_tokens = fetch;
  return p;
}

// Double-precision attention of queries [nq][kQ][kDim] over per-KV-head rows.
std::vector<double> reference(const std::vector<float>& q, size_t nq,
                              const std::vector<std::vector<float>>& k,
                              const std::vector<std::vector<float>>& v, size_t n, float scale) {
  std::vector<double> out(nq * kQRow, 0.0);
  for (size_t i = 0; i < nq; ++i) {
    for (size_t h = 0; h < kQ; ++h) {
      const size_t g = h / (kQ / kKv);
      std::vector<double> s(n);
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t t = 0; t < n; ++t) {
        double d = 0;
        for (size_t x = 0; x < kDim; ++x) d += double(q[(i * kQ + h) * kDim + x]) * k[g][t * kDim + x];
        mx = std::max(mx, s[t] = d * scale);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - mx));
      for (size_t t = 0; t < n; ++t)
        for (size_t x = 0; x < kDim; ++x) out[(i * kQ + h) * kDim + x] += s[t] / z * v[g][t * kDim + x];
    }
  }
  return out;
}

double rel(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    w += want[i] * want[i];
  }
  return std::sqrt(e / w);
}

kvsdk_cache_stats stats(kvsdk_cache* c) {
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s;
}

struct HeadRows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
HeadRows read(kvsdk_cache* c, uint32_t l, uint32_t h) {
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  HeadRows r{std::vector<float>(n * kDim), std::vector<float>(n * kDim), std::vector<int32_t>(n)};
  EXPECT_EQ(kvsdk_cache_read(c, l, h, r.k.data(), r.v.data(), r.pos.data(), n, &n), KVSDK_OK);
  return r;
}

std::vector<float> attend(kvsdk_cache* c, uint32_t l, const std::vector<float>& q) {
  std::vector<float> out(q.size());
  const size_t nq = q.size() / kQRow;
  EXPECT_EQ(kvsdk_cache_attend(c, l, nq, q.data(), nullptr, q.size() * 4, out.data(), out.size() * 4),
            KVSDK_OK)
      << kvsdk_last_error();
  return out;
}

kvsdk_status prefetch(kvsdk_cache* c, uint32_t l, const std::vector<float>& q) {
  return kvsdk_cache_prefetch(c, l, 1, q.data(), nullptr, kQRow * 4);
}

void append(kvsdk_cache* c, size_t n, uint32_t seed, int32_t first = 0) {
  const std::vector<float> k = random_floats(n * kRow, seed), v = random_floats(n * kRow, seed + 1);
  const std::vector<int32_t> pos = iota_positions(n, first);
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kvsdk_cache_append(c, l, n, k.data(), v.data(), pos.data(), n * kRow * 4), KVSDK_OK)
        << kvsdk_last_error();
  }
}

TEST(SpeCacheCache, EveryTokenFetchedIsExactAttentionOverTheBackingRows) {
  for (const char* spec : {"specache", "specache+kivi1"}) {
    auto ctx = make_context();
    const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
    const size_t n = 120;
    const kvsdk_policy p = specache_policy(spec, int32_t(n));
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache) << kvsdk_last_error();
    append(cache.get(), n, 1);
    const std::vector<float> k = random_floats(n * kRow, 1), v = random_floats(n * kRow, 2);
    std::vector<std::vector<float>> kh(kKv), vh(kKv);
    for (size_t t = 0; t < n; ++t)
      for (uint32_t h = 0; h < kKv; ++h)
        for (size_t d = 0; d < kDim; ++d) {
          kh[h].push_back(kvsdk::f16_to_f32(kvsdk::f32_to_f16(k[(t * kKv + h) * kDim + d])));
          vh[h].push_back(kvsdk::f16_to_f32(kvsdk::f32_to_f16(v[(t * kKv + h) * kDim + d])));
        }
    const std::vector<float> q = random_floats(kQRow, 3);
    const float scale = 1.0f / std::sqrt(float(kDim));
    // Before any prefetch: low-bit attention, measurably off.
    const double lowbit_err = rel(attend(cache.get(), 1, q), reference(q, 1, kh, vh, n, scale));
    EXPECT_GT(lowbit_err, 1e-3) << spec;
    ASSERT_EQ(prefetch(cache.get(), 1, q), KVSDK_OK) << kvsdk_last_error();
    EXPECT_LT(rel(attend(cache.get(), 1, q), reference(q, 1, kh, vh, n, scale)), 2e-6) << spec;
    // read() shows the rows attention used: the backing rows.
    for (uint32_t h = 0; h < kKv; ++h) EXPECT_EQ(read(cache.get(), 1, h).k, kh[h]);
    double hit = 0;
    uint64_t samples = 0;
    ASSERT_EQ(kvsdk_cache_fetch_stats(cache.get(), &hit, &samples), KVSDK_OK);
    EXPECT_NEAR(hit, 1.0, 1e-6);
    EXPECT_EQ(samples, uint64_t(kKv));
  }
}

// A decode step as the reference runtime runs it (SpeCache §3.3): the output token and the
// speculative token attend in one call, then the speculative token prefetches. The same outputs,
// prefetched rows and hit rate as the two attends one after the other: the hit rate is the
// output token's (the first query), and the prefetch reuses the speculative token's scores.
TEST(SpeCacheCache, OneAttendOfOutputAndSpeculativeTokensIsTwoAttends) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = specache_policy("specache", 24);
  auto ctx = make_context();
  auto one = make_cache(ctx.get(), g, &p), two = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(one && two) << kvsdk_last_error();
  int32_t next = 0;
  for (int step = 0; step < 6; ++step) {
    const size_t n = step == 0 ? 90 : 1;
    append(one.get(), n, 10 + step, next);
    append(two.get(), n, 10 + step, next);
    next += int32_t(n);
    const std::vector<float> q = random_floats(2 * kQRow, 40 + step);  // output, speculative
    const int32_t qpos[2] = {next - 1, next};
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> both(2 * kQRow), sep(2 * kQRow);
      ASSERT_EQ(kvsdk_cache_attend(one.get(), l, 2, q.data(), qpos, q.size() * 4, both.data(),
                                   both.size() * 4),
                KVSDK_OK)
          << kvsdk_last_error();
      for (size_t i = 0; i < 2; ++i) {
        ASSERT_EQ(kvsdk_cache_attend(two.get(), l, 1, q.data() + i * kQRow, qpos + i, kQRow * 4,
                                     sep.data() + i * kQRow, kQRow * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
      EXPECT_EQ(both, sep) << "step " << step << " layer " << l;
      ASSERT_EQ(kvsdk_cache_prefetch(one.get(), l, 1, q.data() + kQRow, qpos + 1, kQRow * 4),
                KVSDK_OK);
      ASSERT_EQ(kvsdk_cache_prefetch(two.get(), l, 1, q.data() + kQRow, qpos + 1, kQRow * 4),
                KVSDK_OK);
      for (uint32_t h = 0; h < kKv; ++h) {
        EXPECT_EQ(read(one.get(), l, h).k, read(two.get(), l, h).k) << "fetched rows differ";
      }
    }
  }
  double hit_one = 0, hit_two = 0;
  uint64_t samples_one = 0, samples_two = 0;
  ASSERT_EQ(kvsdk_cache_fetch_stats(one.get(), &hit_one, &samples_one), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_fetch_stats(two.get(), &hit_two, &samples_two), KVSDK_OK);
  EXPECT_EQ(samples_one, samples_two);
  EXPECT_EQ(samples_one, uint64_t(5 * kLayers * kKv));  // every step after the first prefetch
  EXPECT_EQ(hit_one, hit_two);
  EXPECT_GT(hit_one, 0.0);
  EXPECT_LT(hit_one, 1.0);
}

TEST(SpeCacheCache, AttendMatchesReadRowsAndStatsReportTheBackingApart) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = specache_policy("specache", 16);
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache);
  append(cache.get(), 90, 5);
  const std::vector<float> spec = random_floats(kQRow, 6), q = random_floats(2 * kQRow, 7);
  ASSERT_EQ(prefetch(cache.get(), 0, spec), KVSDK_OK);
  std::vector<std::vector<float>> k(kKv), v(kKv);
  for (uint32_t h = 0; h < kKv; ++h) {
    const HeadRows r = read(cache.get(), 0, h);
    k[h] = r.k;
    v[h] = r.v;
  }
  // The fused KIVI kernel attends the low-bit rows with 7-bit value weights (what a 2-bit copy
  // gets by default, kvsdk_policy.kivi_weight_bits): ~1e-2 from float attention over the same
  // rows, as kivi_cache_test's kernel tolerance.
  EXPECT_LT(rel(attend(cache.get(), 0, q), reference(q, 2, k, v, 90, 1.0f / std::sqrt(float(kDim)))), 3e-2);
  const kvsdk_cache_stats s = stats(cache.get());
  uint64_t sum = 0;
  for (uint64_t b : s.bytes_by_tier) sum += b;
  EXPECT_EQ(sum, s.bytes);
  EXPECT_EQ(s.context_used_bytes, s.bytes);  // the backing store is not charged
  EXPECT_GT(s.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);
  // Backing: 90 tokens -> 2 blocks of 64 per layer and KV head, f16 keys and values.
  EXPECT_EQ(s.backing_bytes, uint64_t(kLayers) * kKv * 2 * 64 * kDim * 2 * 2);
  EXPECT_LT(s.bytes, s.full_bytes);
  // Fetched rows are budgeted: 16 per head of layer 0 (f16 k, v and a 4-byte index).
  kvsdk_layer_stats l0{}, l1{};
  l0.struct_size = l1.struct_size = sizeof l0;
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 0, &l0), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache.get(), 1, &l1), KVSDK_OK);
  EXPECT_EQ(l0.bytes - l1.bytes, uint64_t(kKv) * 16 * (kDim * 4 + 4));
}

TEST(SpeCacheCache, BudgetHoldsThroughPrefetchAndRefusalsChangeNothing) {
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = specache_policy("specache", 32);
  uint64_t lowbit_bytes = 0;
  {
    auto ctx = make_context();
    auto cache = make_cache(ctx.get(), g, &p);
    append(cache.get(), 80, 9);
    lowbit_bytes = stats(cache.get()).bytes;
  }
  // Room for the low-bit copy and one layer's fetch (32 rows x 2 heads), not two.
  const uint64_t fetch = uint64_t(kKv) * 32 * (kDim * 4 + 4);
  auto ctx = make_context(lowbit_bytes + fetch + fetch / 2);
  auto cache = make_cache(ctx.get(), g, &p);
  append(cache.get(), 80, 9);
  const std::vector<float> q = random_floats(kQRow, 10);
  ASSERT_EQ(prefetch(cache.get(), 0, q), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(stats(cache.get()).bytes, lowbit_bytes + fetch);
  // A second prefetch of layer 0 replaces its fetch: fits again.
  ASSERT_EQ(prefetch(cache.get(), 0, random_floats(kQRow, 11)), KVSDK_OK);
  const kvsdk_cache_stats before = stats(cache.get());
  const HeadRows r_before = read(cache.get(), 1, 0);
  EXPECT_EQ(prefetch(cache.get(), 1, q), KVSDK_E_BUDGET);
  const kvsdk_cache_stats after = stats(cache.get());
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  EXPECT_EQ(read(cache.get(), 1, 0).k, r_before.k);
  EXPECT_LE(after.context_used_bytes, after.budget_bytes);
  // Appends until the budget refuses: refused appends change nothing, never over the budget.
  kvsdk_status st = KVSDK_OK;
  int32_t pos = 80;
  for (int i = 0; i < 200 && st == KVSDK_OK; ++i) {
    const std::vector<float> k = random_floats(kRow, 100 + i), v = random_floats(kRow, 300 + i);
    const kvsdk_cache_stats b = stats(cache.get());
    st = kvsdk_cache_append(cache.get(), 0, 1, k.data(), v.data(), &pos, kRow * 4);
    const kvsdk_cache_stats a = stats(cache.get());
    EXPECT_LE(a.context_used_bytes, a.budget_bytes);
    if (st != KVSDK_OK) {
      EXPECT_EQ(st, KVSDK_E_BUDGET);
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
    }
    ++pos;
  }
  EXPECT_EQ(st, KVSDK_E_BUDGET);
}

TEST(SpeCacheCache, BackingFileGivesTheSameResultsAsHostMemory) {
  char path[] = "/tmp/kvsdk_specache_cache_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = specache_policy("specache+kivi1", 24);
  auto host = make_cache(ctx.get(), g, &p);
  auto file = make_cache(ctx.get(), g, &p);
  ASSERT_EQ(kvsdk_cache_set_backing_file(file.get(), path), KVSDK_OK) << kvsdk_last_error();
  for (int step = 0; step < 6; ++step) {
    append(host.get(), 50, 20 + step, step * 50);
    append(file.get(), 50, 20 + step, step * 50);
    const std::vector<float> q = random_floats(kQRow, 40 + step);
    for (uint32_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(prefetch(host.get(), l, q), KVSDK_OK);
      ASSERT_EQ(prefetch(file.get(), l, q), KVSDK_OK);
      EXPECT_EQ(attend(host.get(), l, q), attend(file.get(), l, q));
      EXPECT_EQ(read(host.get(), l, 1).k, read(file.get(), l, 1).k);
    }
  }
  const kvsdk_cache_stats a = stats(host.get()), b = stats(file.get());
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.backing_bytes, b.backing_bytes);
  double ha = 0, hb = 0;
  ASSERT_EQ(kvsdk_cache_fetch_stats(host.get(), &ha, nullptr), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_fetch_stats(file.get(), &hb, nullptr), KVSDK_OK);
  EXPECT_EQ(ha, hb);
  EXPECT_GT(ha, 0.0);
  EXPECT_LE(ha, 1.0);
  file.reset();
  std::remove(path);
}

TEST(SpeCacheCache, MisuseReturnsClearStatuses) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy p = specache_policy();
  auto cache = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(cache);
  const std::vector<float> q = random_floats(2 * kQRow, 1);
  double hit = 5;
  uint64_t samples = 7;
  ASSERT_EQ(kvsdk_cache_fetch_stats(cache.get(), &hit, &samples), KVSDK_OK);
  EXPECT_EQ(hit, -1.0);  // nothing measured yet
  EXPECT_EQ(samples, 0u);
  ASSERT_EQ(kvsdk_cache_prefetch(cache.get(), 0, 1, q.data(), nullptr, kQRow * 4), KVSDK_OK);  // empty
  EXPECT_EQ(kvsdk_cache_prefetch(nullptr, 0, 1, q.data(), nullptr, kQRow * 4), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_prefetch(cache.get(), 0, 1, nullptr, nullptr, kQRow * 4), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_prefetch(cache.get(), 0, 2, q.data(), nullptr, 2 * kQRow * 4), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_prefetch(cache.get(), 0, 0, q.data(), nullptr, 0), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_prefetch(cache.get(), 0, 1, q.data(), nullptr, kQRow * 4 - 1), KVSDK_E_INVALID_ARG);
  const int32_t neg = -1;
  EXPECT_EQ(kvsdk_cache_prefetch(cache.get(), 0, 1, q.data(), &neg, kQRow * 4), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_prefetch(cache.get(), kLayers, 1, q.data(), nullptr, kQRow * 4), KVSDK_E_OUT_OF_RANGE);
  EXPECT_EQ(kvsdk_cache_fetch_stats(nullptr, &hit, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_fetch_stats(cache.get(), nullptr, &samples), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_set_backing_file(nullptr, "/tmp/x"), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_set_backing_file(cache.get(), nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_set_backing_file(cache.get(), "/nonexistent-dir-kvsdk/b.bin"), KVSDK_E_IO);
  append(cache.get(), 10, 3);
  char path[] = "/tmp/kvsdk_specache_late_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(kvsdk_cache_set_backing_file(cache.get(), path), KVSDK_E_STATE);
  std::remove(path);
  EXPECT_EQ(hit, -1.0);  // outputs untouched on failure
  EXPECT_EQ(samples, 0u);
}

TEST(SpeCacheCache, OtherPoliciesAreUnsupported) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  for (const char* spec : {"full", "kivi", "h2o"}) {
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK);
    auto cache = make_cache(ctx.get(), g, &p);
    ASSERT_TRUE(cache) << spec;
    append(cache.get(), 4, 1);
    const std::vector<float> q = random_floats(kQRow, 1);
    EXPECT_EQ(prefetch(cache.get(), 0, q), KVSDK_E_UNSUPPORTED) << spec;
    double hit = 0;
    EXPECT_EQ(kvsdk_cache_fetch_stats(cache.get(), &hit, nullptr), KVSDK_E_UNSUPPORTED) << spec;
    EXPECT_EQ(kvsdk_cache_set_backing_file(cache.get(), "/tmp/unused"), KVSDK_E_UNSUPPORTED) << spec;
  }
  // A snapshot restores the cache with the same rows and attention (the fetched rows are saved
  // too; the backing store only with include_backing: tests/formats/tier_snapshot_test.cpp).
  {
    const kvsdk_policy sp = specache_policy("specache", 8);
    auto cache = make_cache(ctx.get(), g, &sp);
    append(cache.get(), 40, 1);
    const std::vector<float> q = random_floats(kQRow, 2);
    ASSERT_EQ(prefetch(cache.get(), 1, q), KVSDK_OK);
    size_t size = 0;
    const kvsdk_status st = kvsdk_cache_save_to_buffer(cache.get(), nullptr, nullptr, 0, &size);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    {
      std::vector<uint8_t> buf(size);
      ASSERT_EQ(kvsdk_cache_save_to_buffer(cache.get(), nullptr, buf.data(), size, &size), KVSDK_OK);
      kvsdk_cache* loaded = nullptr;
      ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, ctx.get(), buf.data(), size, nullptr, nullptr),
                KVSDK_OK)
          << kvsdk_last_error();
      CachePtr owned(loaded);
      for (uint32_t l = 0; l < kLayers; ++l) {
        EXPECT_EQ(read(cache.get(), l, 1).k, read(loaded, l, 1).k);
        EXPECT_EQ(attend(cache.get(), l, q), attend(loaded, l, q));
      }
    }
  }
  // quant_bits other than 1 or 2 are refused at creation.
  kvsdk_policy p = specache_policy();
  p.quant_bits = 4;
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_create(&c, ctx.get(), &g, &p), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
}

}  // namespace

// Saved with default options, a specache cache that has prefetched continues exactly like the
// uninterrupted one through later appends, prefetches and attends: the default save includes the
// backing store, so later fetches bring the same f16 rows.
TEST(SpeCacheCache, DefaultSaveResumesIdenticallyAfterPrefetch) {
  auto ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy sp = specache_policy("specache", 8);
  auto a = make_cache(ctx.get(), g, &sp);
  append(a.get(), 40, 1);
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_EQ(prefetch(a.get(), l, random_floats(kQRow, 10 + l)), KVSDK_OK);
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  std::vector<uint8_t> buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.get(), nullptr, buf.data(), size, &size), KVSDK_OK);
  kvsdk_cache* loaded = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded, ctx.get(), buf.data(), size, nullptr, nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(loaded);
  // The same file without the backing store: the first later prefetch brings rows rebuilt from
  // the low-bit copy, so this copy diverges (which is what the default save avoids).
  kvsdk_save_options small;
  kvsdk_save_options_init(&small);
  small.include_backing = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.get(), &small, nullptr, 0, &size), KVSDK_OK);
  std::vector<uint8_t> small_buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.get(), &small, small_buf.data(), size, &size), KVSDK_OK);
  EXPECT_LT(small_buf.size(), buf.size());
  kvsdk_cache* loaded_small = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&loaded_small, ctx.get(), small_buf.data(), size, nullptr,
                                         nullptr),
            KVSDK_OK);
  CachePtr c(loaded_small);
  bool c_diverged = false;
  for (int step = 0; step < 3; ++step) {
    for (kvsdk_cache* x : {a.get(), b.get(), c.get()}) append(x, 1, uint32_t(100 + step), 40 + step);
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<float> q = random_floats(kQRow, uint32_t(200 + 10 * step + l));
      for (kvsdk_cache* x : {a.get(), b.get(), c.get()}) ASSERT_EQ(prefetch(x, l, q), KVSDK_OK);
      const std::vector<float> want = attend(a.get(), l, q);
      EXPECT_EQ(attend(b.get(), l, q), want) << "step " << step << " layer " << l;
      c_diverged = c_diverged || attend(c.get(), l, q) != want;
    }
  }
  EXPECT_TRUE(c_diverged);
}
