// Policy 'smallkv' through the C ABI: kvsdk_cache_set_proxy, head matching against an independent
// argmax-Jaccard reference, Eq. 6 attention against a straightforward reference, the budget under
// random appends, and misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/cache.h"
#include "kvsdk.h"
#include "repr/smallkv_repr.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// Large: 2 layers x 4 query heads x 2 KV heads; proxy: 2 layers x 2 query heads x 1 KV head.
constexpr uint32_t kLayers = 2, kQ = 4, kKv = 2, kPQ = 2, kDim = 16;
constexpr int32_t kMatch = 40;

kvsdk_policy smallkv_policy() {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_SMALLKV);
  p.match_tokens = kMatch;
  return p;
}

uint64_t bytes_of(kvsdk_cache* c) {
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s.bytes;
}

// A large cache and its proxy fed by a host that runs the proxy's step first. The large model's
// heads are built from the proxy's: large KV head (l, g) has the keys/values of proxy layer
// (l + g) % 2 and large query head (l, 2g + j) the queries of proxy head 1 - j of that layer (the
// rest of the large model's input is independent noise with small weight), so the expected
// mapping is known.
struct Pair {
  ContextPtr lctx, pctx;
  CachePtr large, proxy;
  int32_t next = 0;
  std::mt19937 rng{7};
  std::vector<std::vector<float>> last_pq;  // proxy queries of the last step, per proxy layer
  std::vector<std::vector<float>> last_lq;  // large queries of the last step, per layer
  std::vector<std::vector<float>> last_out;
  std::vector<int32_t> last_pos;

  // `slack` < 0: the policy's default evict_slack.
  explicit Pair(uint64_t budget, float slack = -1.0f)
      : lctx(make_context(budget)), pctx(make_context()) {
    const kvsdk_geometry lg = make_geometry(kLayers, kQ, kKv, kDim);
    const kvsdk_geometry pg = make_geometry(kLayers, kPQ, 1, kDim);
    kvsdk_policy p = smallkv_policy();
    if (slack >= 0.0f) p.evict_slack = slack;
    large = make_cache(lctx.get(), lg, &p);
    proxy = make_cache(pctx.get(), pg);
  }
  static uint32_t expected(uint32_t layer, uint32_t q_head) {
    const uint32_t g = q_head / 2, j = q_head % 2;
    return ((layer + g) % 2) * kPQ + (1 - j);
  }
  // One step of n tokens. Returns the large cache's append status.
  kvsdk_status step(size_t n) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), next);
    std::vector<std::vector<float>> pk(kLayers), pv(kLayers), pq(kLayers);
    last_pq.assign(kLayers, {});
    for (uint32_t l = 0; l < kLayers; ++l) {
      pk[l].resize(n * kDim);
      pv[l].resize(n * kDim);
      pq[l].resize(n * kPQ * kDim);
      for (float& x : pk[l]) x = 3.0f * d(rng);
      for (float& x : pv[l]) x = d(rng);
      for (float& x : pq[l]) x = 3.0f * d(rng);
      EXPECT_EQ(kvsdk_cache_append(proxy.get(), l, n, pk[l].data(), pv[l].data(), pos.data(),
                                   pk[l].size() * 4),
                KVSDK_OK);
      std::vector<float> out(pq[l].size());
      EXPECT_EQ(kvsdk_cache_attend(proxy.get(), l, n, pq[l].data(), pos.data(), pq[l].size() * 4,
                                   out.data(), out.size() * 4),
                KVSDK_OK);
      last_pq[l] = pq[l];
    }
    last_lq.assign(kLayers, {});
    last_out.assign(kLayers, {});
    last_pos = pos;
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k(n * kKv * kDim), v(n * kKv * kDim), q(n * kQ * kDim);
      for (size_t t = 0; t < n; ++t) {
        for (uint32_t g = 0; g < kKv; ++g) {
          const uint32_t src = (l + g) % 2;
          for (uint32_t x = 0; x < kDim; ++x) {
            k[(t * kKv + g) * kDim + x] = pk[src][t * kDim + x];
            v[(t * kKv + g) * kDim + x] = pv[src][t * kDim + x] + 0.1f * d(rng);
          }
          for (uint32_t j = 0; j < 2; ++j) {
            for (uint32_t x = 0; x < kDim; ++x) {
              q[(t * kQ + g * 2 + j) * kDim + x] = pq[src][(t * kPQ + (1 - j)) * kDim + x];
            }
          }
        }
      }
      const kvsdk_status st = kvsdk_cache_append(large.get(), l, n, k.data(), v.data(),
                                                 pos.data(), k.size() * 4);
      if (st != KVSDK_OK) return st;
      std::vector<float> out(q.size());
      EXPECT_EQ(kvsdk_cache_attend(large.get(), l, n, q.data(), pos.data(), q.size() * 4,
                                   out.data(), out.size() * 4),
                KVSDK_OK)
          << kvsdk_last_error();
      last_lq[l] = q;
      last_out[l] = out;
    }
    next += int32_t(n);
    return KVSDK_OK;
  }
  const kvsdk::SmallKvRepresentation& repr() const {
    return dynamic_cast<const kvsdk::SmallKvRepresentation&>(*large->impl->representation());
  }
};

struct Rows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
Rows read_rows(kvsdk_cache* c, uint32_t layer, uint32_t head) {
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(c, layer, head, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  Rows r;
  r.k.resize(n * kDim);
  r.v.resize(n * kDim);
  r.pos.resize(n);
  EXPECT_EQ(kvsdk_cache_read(c, layer, head, r.k.data(), r.v.data(), r.pos.data(), n, &n),
            KVSDK_OK);
  return r;
}

// Softmax (double) of one query over rows visible at its position.
std::vector<double> softmax(const float* q, int32_t qpos, const Rows& r) {
  const size_t n = r.pos.size();
  std::vector<double> p(n, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < n; ++t) {
    if (r.pos[t] > qpos) continue;
    double s = 0;
    for (uint32_t x = 0; x < kDim; ++x) s += double(q[x]) * r.k[t * kDim + x];
    p[t] = s / std::sqrt(double(kDim));
    mx = std::max(mx, p[t]);
  }
  double z = 0;
  for (size_t t = 0; t < n; ++t) {
    p[t] = r.pos[t] > qpos ? 0.0 : std::exp(p[t] - mx);
    z += p[t];
  }
  for (double& x : p) x /= z;
  return p;
}

std::set<size_t> topk(const std::vector<double>& s, size_t k) {
  std::vector<size_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return s[a] > s[b]; });
  return std::set<size_t>(idx.begin(), idx.begin() + long(std::min(k, s.size())));
}

double jaccard(const std::set<size_t>& a, const std::set<size_t>& b) {
  size_t both = 0;
  for (size_t x : a) both += b.count(x);
  return double(both) / double(a.size() + b.size() - both);
}

}  // namespace

TEST(SmallKvCache, MappingIsTheArgmaxJaccardProxyHead) {
  Pair p(0);
  ASSERT_TRUE(p.large && p.proxy);
  ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
  // Record every query of the first kMatch tokens to build the reference (Eq. 1).
  std::vector<std::vector<float>> lq(kLayers), pq(kLayers);
  for (int s = 0; s < kMatch / 4; ++s) {
    ASSERT_EQ(p.step(4), KVSDK_OK);
    for (uint32_t l = 0; l < kLayers; ++l) {
      lq[l].insert(lq[l].end(), p.last_lq[l].begin(), p.last_lq[l].end());
      pq[l].insert(pq[l].end(), p.last_pq[l].begin(), p.last_pq[l].end());
    }
  }
  // Eq. 1 per head (large: layer * 4 + head, proxy: layer * 2 + head) over the held rows.
  auto accumulate = [](kvsdk_cache* c, const std::vector<std::vector<float>>& qs, uint32_t nq,
                       uint32_t group) {
    std::vector<std::vector<double>> acc;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < nq; ++h) {
        const Rows r = read_rows(c, l, h / group);
        std::vector<double> a(kMatch, 0.0);
        for (int32_t t = 0; t < kMatch; ++t) {
          const std::vector<double> pr = softmax(&qs[l][(size_t(t) * nq + h) * kDim], t, r);
          for (int32_t u = 0; u < kMatch; ++u) a[size_t(u)] += pr[size_t(u)];
        }
        acc.push_back(a);
      }
    }
    return acc;
  };
  const auto large = accumulate(p.large.get(), lq, kQ, kQ / kKv);
  const auto proxy = accumulate(p.proxy.get(), pq, kPQ, kPQ);
  const size_t k = (kMatch + 9) / 10;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<uint32_t> map = p.repr().mapping(l);
    for (uint32_t h = 0; h < kQ; ++h) {
      ASSERT_TRUE(p.repr().matched(l, h / 2));
      std::vector<double> sim;
      for (const auto& pa : proxy) sim.push_back(jaccard(topk(large[l * kQ + h], k), topk(pa, k)));
      const size_t best = size_t(std::max_element(sim.begin(), sim.end()) - sim.begin());
      EXPECT_EQ(map[h], best) << "layer " << l << " head " << h;
      EXPECT_EQ(map[h], Pair::expected(l, h)) << "layer " << l << " head " << h;
      EXPECT_DOUBLE_EQ(sim[best], 1.0);
    }
  }
}

TEST(SmallKvCache, AttentionIsEq6OverFullAndMarginalRows) {
  const uint64_t full_token = uint64_t(kLayers) * kKv * (kDim * 4 + 8);
  Pair p(40 * full_token);  // room for ~40 full tokens: eviction with marginal rows
  ASSERT_TRUE(p.large && p.proxy);
  ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
  for (int s = 0; s < 20; ++s) ASSERT_EQ(p.step(4), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(p.step(1), KVSDK_OK);
  bool saw_marginal = false;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<uint32_t> map = p.repr().mapping(l);
    for (uint32_t h = 0; h < kQ; ++h) {
      const uint32_t g = h / 2;
      const Rows r = read_rows(p.large.get(), l, g);
      const float* q = &p.last_lq[l][h * kDim];
      const int32_t qpos = p.last_pos[0];
      // Marginal rows are read with zero keys; full rows never have all-zero random keys.
      Rows full, marg;
      for (size_t t = 0; t < r.pos.size(); ++t) {
        const bool zero = std::all_of(r.k.begin() + long(t * kDim), r.k.begin() + long((t + 1) * kDim),
                                      [](float x) { return x == 0.0f; });
        Rows& dst = zero ? marg : full;
        dst.pos.push_back(r.pos[t]);
        dst.k.insert(dst.k.end(), r.k.begin() + long(t * kDim), r.k.begin() + long((t + 1) * kDim));
        dst.v.insert(dst.v.end(), r.v.begin() + long(t * kDim), r.v.begin() + long((t + 1) * kDim));
      }
      saw_marginal = saw_marginal || !marg.pos.empty();
      // The matched proxy head's probabilities of this step over the proxy's full cache.
      const uint32_t ph = map[h], pl = ph / kPQ, pj = ph % kPQ;
      const Rows pr = read_rows(p.proxy.get(), pl, 0);
      const std::vector<double> pw = softmax(&p.last_pq[pl][pj * kDim], qpos, pr);
      std::vector<double> want(kDim, 0.0);
      double mass = 0;
      for (size_t m = 0; m < marg.pos.size(); ++m) {
        const size_t t = size_t(std::find(pr.pos.begin(), pr.pos.end(), marg.pos[m]) - pr.pos.begin());
        ASSERT_LT(t, pr.pos.size());
        mass += pw[t];
        for (uint32_t x = 0; x < kDim; ++x) want[x] += pw[t] * marg.v[m * kDim + x];
      }
      const std::vector<double> a = softmax(q, qpos, full);
      for (size_t t = 0; t < full.pos.size(); ++t) {
        for (uint32_t x = 0; x < kDim; ++x) want[x] += (1.0 - mass) * a[t] * full.v[t * kDim + x];
      }
      for (uint32_t x = 0; x < kDim; ++x) {
        EXPECT_NEAR(p.last_out[l][h * kDim + x], want[x], 1e-4) << "layer " << l << " head " << h;
      }
    }
  }
  EXPECT_TRUE(saw_marginal);
}

TEST(SmallKvCache, BudgetIsNeverExceededUnderRandomAppends) {
  const uint64_t budget = 30 * uint64_t(kLayers) * kKv * (kDim * 4 + 8) + 2000;
  Pair p(budget);
  ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
  std::mt19937 rng(3);
  uint64_t value_only = 0;
  for (int s = 0; s < 40; ++s) {
    ASSERT_EQ(p.step(1 + rng() % 6), KVSDK_OK) << kvsdk_last_error();
    kvsdk_cache_stats st{};
    st.struct_size = sizeof st;
    ASSERT_EQ(kvsdk_cache_stats_get(p.large.get(), &st), KVSDK_OK);
    EXPECT_LE(st.bytes, budget);
    EXPECT_EQ(st.context_used_bytes, st.bytes);
    uint64_t sum = 0;
    for (uint64_t b : st.bytes_by_tier) sum += b;
    EXPECT_EQ(sum, st.bytes);
    value_only = std::max(value_only, st.bytes_by_tier[KVSDK_TIER_VALUE_ONLY]);
  }
  EXPECT_GT(value_only, 0u);
}

// policy.evict_slack: an eviction that makes room for an append goes down to the rows' byte target
// minus the slack, so the following appends fit without selecting again; with slack 0 a full
// cache selects on every append. Either way the budget holds.
TEST(SmallKvCache, EvictSlackAmortizesEviction) {
  const uint64_t budget = 30 * uint64_t(kLayers) * kKv * (kDim * 4 + 8) + 2000;
  auto evicting_appends = [&](float slack, uint64_t* low) {
    Pair p(budget, slack);
    EXPECT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
    for (int s = 0; s < 12; ++s) EXPECT_EQ(p.step(4), KVSDK_OK) << kvsdk_last_error();
    int evicting = 0;
    *low = budget;
    for (int s = 0; s < 64; ++s) {
      kvsdk_cache_stats a{}, b{};
      a.struct_size = b.struct_size = sizeof a;
      EXPECT_EQ(kvsdk_cache_stats_get(p.large.get(), &a), KVSDK_OK);
      EXPECT_EQ(p.step(1), KVSDK_OK) << kvsdk_last_error();
      EXPECT_EQ(kvsdk_cache_stats_get(p.large.get(), &b), KVSDK_OK);
      EXPECT_LE(b.bytes, budget);
      evicting += b.tokens < a.tokens + kLayers * kKv;  // one row appended per layer and KV head
      *low = std::min(*low, b.bytes);
    }
    return evicting;
  };
  uint64_t low_exact = 0, low_slack = 0;
  const int exact = evicting_appends(0.0f, &low_exact);
  const int slack = evicting_appends(0.25f, &low_slack);
  EXPECT_GE(exact, 60) << "a full cache without slack evicts on (nearly) every append";
  EXPECT_GE(slack, 1);
  EXPECT_LE(slack * 4, exact) << "with a slack of 1/4, evictions are several appends apart";
  EXPECT_LT(low_slack, low_exact);  // the slack leaves room below the budget
  std::printf("[ counts   ] evicting appends of 64: %d exact, %d with slack 1/4\n", exact, slack);
}

TEST(SmallKvCache, SetProxyMisuse) {
  Pair p(0);
  EXPECT_EQ(kvsdk_cache_set_proxy(nullptr, p.proxy.get()), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.large.get()), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_set_proxy(p.proxy.get(), p.large.get()), KVSDK_E_UNSUPPORTED);
  // A proxy whose policy is not 'full'.
  kvsdk_policy h2o;
  kvsdk_policy_init(&h2o, KVSDK_METHOD_H2O);
  CachePtr evicting = make_cache(p.pctx.get(), make_geometry(kLayers, kPQ, 1, kDim), &h2o);
  EXPECT_EQ(kvsdk_cache_set_proxy(p.large.get(), evicting.get()), KVSDK_E_INVALID_ARG);
  EXPECT_NE(std::string(kvsdk_last_error()).find("'full'"), std::string::npos);
  // One proxy serves one cache; setting the same proxy again is a no-op; NULL detaches.
  ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
  const kvsdk_policy sp = smallkv_policy();
  CachePtr other = make_cache(p.lctx.get(), make_geometry(kLayers, kQ, kKv, kDim), &sp);
  EXPECT_EQ(kvsdk_cache_set_proxy(other.get(), p.proxy.get()), KVSDK_E_STATE);
  EXPECT_EQ(kvsdk_cache_set_proxy(p.large.get(), nullptr), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_set_proxy(other.get(), p.proxy.get()), KVSDK_OK);
}

TEST(SmallKvCache, WithoutProxyEvictionFailsAndChangesNothing) {
  const uint64_t budget = 10 * uint64_t(kLayers) * kKv * (kDim * 4 + 8) + 2000;
  Pair p(budget);
  kvsdk_status st = KVSDK_OK;
  int steps = 0;
  std::vector<Rows> before;
  uint64_t bytes = 0;
  while (st == KVSDK_OK && steps < 50) {
    before.clear();
    for (uint32_t l = 0; l < kLayers; ++l) before.push_back(read_rows(p.large.get(), l, 1));
    bytes = bytes_of(p.large.get());
    st = p.step(2);
    ++steps;
  }
  ASSERT_EQ(st, KVSDK_E_STATE) << kvsdk_last_error();
  EXPECT_NE(std::string(kvsdk_last_error()).find("kvsdk_cache_set_proxy"), std::string::npos);
  // Layer 0 refused the append: it is unchanged.
  EXPECT_EQ(read_rows(p.large.get(), 0, 1).pos, before[0].pos);
  EXPECT_EQ(read_rows(p.large.get(), 0, 1).v, before[0].v);
  EXPECT_EQ(bytes_of(p.large.get()), bytes);
  EXPECT_EQ(kvsdk_cache_compress(p.large.get()), KVSDK_OK);  // within budget: nothing to do
}

TEST(SmallKvCache, DestroyingEitherCacheDetaches) {
  const uint64_t budget = 10 * uint64_t(kLayers) * kKv * (kDim * 4 + 8) + 2000;
  {
    Pair p(budget);
    ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
    ASSERT_EQ(p.step(4), KVSDK_OK);
    p.proxy.reset();  // the large cache forgets it
    std::vector<float> k(kKv * kDim, 1.0f), v(kKv * kDim, 1.0f);
    kvsdk_status st = KVSDK_OK;
    for (int32_t t = 100; t < 200 && st == KVSDK_OK; ++t) {
      st = kvsdk_cache_append(p.large.get(), 0, 1, k.data(), v.data(), &t, k.size() * 4);
    }
    EXPECT_EQ(st, KVSDK_E_STATE);
  }
  {
    Pair p(0);
    ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
    ASSERT_EQ(p.step(2), KVSDK_OK);
    p.large.reset();  // the proxy's tap goes away with it
    std::vector<float> q(kPQ * kDim, 1.0f), out(q.size());
    int32_t pos = 5;
    EXPECT_EQ(kvsdk_cache_attend(p.proxy.get(), 0, 1, q.data(), &pos, q.size() * 4, out.data(),
                                 out.size() * 4),
              KVSDK_OK);
  }
}

TEST(SmallKvCache, StatsAndSnapshotRefusal) {
  Pair p(0);
  ASSERT_EQ(kvsdk_cache_set_proxy(p.large.get(), p.proxy.get()), KVSDK_OK);
  ASSERT_EQ(p.step(5), KVSDK_OK);
  kvsdk_layer_stats ls{};
  ls.struct_size = sizeof ls;
  ASSERT_EQ(kvsdk_cache_layer_stats_get(p.large.get(), 1, &ls), KVSDK_OK);
  EXPECT_EQ(ls.tokens, 5u * kKv);
  // Full rows (K+V f16), positions and scores, the mapping and the matching statistics.
  EXPECT_EQ(ls.bytes_by_tier[KVSDK_TIER_EXACT], 5u * kKv * kDim * 4);
  EXPECT_EQ(ls.bytes_by_tier[KVSDK_TIER_METADATA], 5u * kKv * 8 + kQ * 4 + kQ * kMatch * 4);
  // Snapshots hold every tier (rows, value-only rows, scores, mapping); the proxy link is not
  // saved, so a loaded cache reads the same rows and is re-linked by the host.
  std::vector<uint8_t> buf(1 << 20);
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(p.large.get(), nullptr, buf.data(), buf.size(), &size),
            KVSDK_OK)
      << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&raw, p.lctx.get(), buf.data(), size, nullptr, nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kKv; ++h) {
      size_t na = 0, nb = 0;
      std::vector<float> ka(64 * kDim), kb(64 * kDim), va(64 * kDim), vb(64 * kDim);
      std::vector<int32_t> pa(64), pb(64);
      ASSERT_EQ(kvsdk_cache_read(p.large.get(), l, h, ka.data(), va.data(), pa.data(), 64, &na),
                KVSDK_OK);
      ASSERT_EQ(kvsdk_cache_read(loaded.get(), l, h, kb.data(), vb.data(), pb.data(), 64, &nb),
                KVSDK_OK);
      EXPECT_EQ(na, nb);
      EXPECT_EQ(ka, kb);
      EXPECT_EQ(va, vb);
      EXPECT_EQ(pa, pb);
    }
  }
}

// kvsdk_cache_truncate under smallkv (docs/truncation.md): rows appended since the last attend
// go exactly (with the start of a layer they began), rows an attend counted are refused, and so
// are positions the proxy link still holds queries of.
namespace truncation {

std::vector<uint8_t> snapshot(kvsdk_cache* c) {
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, nullptr, nullptr, 0, &size), KVSDK_OK);
  std::vector<uint8_t> out(size);
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, nullptr, out.data(), size, &size), KVSDK_OK)
      << kvsdk_last_error();
  out.resize(size);
  return out;
}

struct Duo {
  ContextPtr ctx = make_context();
  CachePtr large, proxy;
  Duo() {
    const kvsdk_policy p = smallkv_policy();
    large = make_cache(ctx.get(), make_geometry(kLayers, kQ, kKv, kDim), &p);
    proxy = make_cache(ctx.get(), make_geometry(kLayers, kPQ, 1, kDim));
    EXPECT_EQ(kvsdk_cache_set_proxy(large.get(), proxy.get()), KVSDK_OK) << kvsdk_last_error();
  }
  // n tokens from `pos` into both caches, attended by both (proxy first) when `attend`.
  void tokens(int32_t pos, size_t n, uint32_t seed, bool attend, bool attend_proxy) {
    const std::vector<int32_t> p = iota_positions(n, pos);
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<float> pk = random_floats(n * kDim, seed + l),
                               pq = random_floats(n * kPQ * kDim, seed + 10 + l);
      std::vector<float> po(pq.size());
      ASSERT_EQ(kvsdk_cache_append(proxy.get(), l, n, pk.data(), pk.data(), p.data(),
                                   pk.size() * 4),
                KVSDK_OK);
      if (attend_proxy) {
        ASSERT_EQ(kvsdk_cache_attend(proxy.get(), l, n, pq.data(), p.data(), pq.size() * 4,
                                     po.data(), po.size() * 4),
                  KVSDK_OK);
      }
    }
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<float> k = random_floats(n * kKv * kDim, seed + 20 + l),
                               q = random_floats(n * kQ * kDim, seed + 30 + l);
      std::vector<float> o(q.size());
      ASSERT_EQ(kvsdk_cache_append(large.get(), l, n, k.data(), k.data(), p.data(), k.size() * 4),
                KVSDK_OK);
      if (attend) {
        ASSERT_EQ(kvsdk_cache_attend(large.get(), l, n, q.data(), p.data(), q.size() * 4,
                                     o.data(), o.size() * 4),
                  KVSDK_OK)
            << kvsdk_last_error();
      }
    }
  }
  kvsdk_status truncate(int32_t position) {
    const kvsdk_status s = kvsdk_cache_truncate(large.get(), position);
    if (s == KVSDK_OK) EXPECT_EQ(kvsdk_cache_truncate(proxy.get(), position), KVSDK_OK);
    return s;
  }
};

TEST(SmallKvTruncate, AppendsOnlyGoBackToAFreshCache) {
  // Nothing attended: even a cut at 0 (among the matching tokens, and the appends that started
  // the layers and allocated their matching statistics) is exact.
  Duo a, fresh;
  a.tokens(0, 12, 1, false, false);
  ASSERT_EQ(a.truncate(0), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(snapshot(a.large.get()), snapshot(fresh.large.get()));
  EXPECT_EQ(bytes_of(a.large.get()), 0u);
  // And it continues as the fresh cache does.
  a.tokens(0, 50, 2, true, true);
  fresh.tokens(0, 50, 2, true, true);
  EXPECT_EQ(snapshot(a.large.get()), snapshot(fresh.large.get()));
}

TEST(SmallKvTruncate, RowsAnAttendCountedStay) {
  Duo a, b;
  for (Duo* d : {&a, &b}) {
    d->tokens(0, 50, 1, true, true);  // matched (50 >= match_tokens), scores accumulated
    // The first append after the matching freed the matching statistics (that append can never
    // go), and its attend counted every row.
    d->tokens(50, 1, 2, true, true);
  }
  a.tokens(51, 3, 3, false, false);
  const std::vector<uint8_t> before = snapshot(a.large.get());
  const uint64_t bytes = bytes_of(a.large.get());
  EXPECT_EQ(kvsdk_cache_truncate(a.large.get(), 50), KVSDK_E_STATE);
  const std::string why = kvsdk_last_error();
  EXPECT_NE(why.find("exactly"), std::string::npos) << why;
  EXPECT_NE(why.find("importance state"), std::string::npos) << why;
  EXPECT_NE(why.find("at is 51"), std::string::npos) << why;
  EXPECT_EQ(snapshot(a.large.get()), before);
  EXPECT_EQ(bytes_of(a.large.get()), bytes);
  ASSERT_EQ(a.truncate(52), KVSDK_OK) << kvsdk_last_error();  // keeps 51
  ASSERT_EQ(a.truncate(51), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(snapshot(a.large.get()), snapshot(b.large.get()));
  EXPECT_EQ(bytes_of(a.large.get()), bytes_of(b.large.get()));
  a.tokens(51, 2, 4, true, true);
  b.tokens(51, 2, 4, true, true);
  EXPECT_EQ(snapshot(a.large.get()), snapshot(b.large.get()));
}

TEST(SmallKvTruncate, TheProxysQueriesOfRemovedPositionsRefuse) {
  Duo a;
  a.tokens(0, 50, 1, true, true);
  a.tokens(50, 1, 2, true, true);
  a.tokens(51, 2, 3, false, true);  // the proxy attended 51..52, the large cache did not
  EXPECT_EQ(kvsdk_cache_truncate(a.large.get(), 51), KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("proxy's latest"), std::string::npos)
      << kvsdk_last_error();
}

TEST(SmallKvTruncate, AfterALoadOnlyNewRowsGo) {
  Duo a;
  a.tokens(0, 12, 1, false, false);  // appends only, but a snapshot does not say so
  const std::vector<uint8_t> snap = snapshot(a.large.get());
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&raw, a.ctx.get(), snap.data(), snap.size(), nullptr,
                                         nullptr),
            KVSDK_OK);
  CachePtr loaded(raw);
  EXPECT_EQ(kvsdk_cache_truncate(loaded.get(), 6), KVSDK_E_STATE);
  const std::vector<float> k = random_floats(kKv * kDim, 5);
  const int32_t pos = 12;
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kvsdk_cache_append(loaded.get(), l, 1, k.data(), k.data(), &pos, k.size() * 4),
              KVSDK_OK);
  }
  ASSERT_EQ(kvsdk_cache_truncate(loaded.get(), 12), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(snapshot(loaded.get()), snap);
}

}  // namespace truncation
