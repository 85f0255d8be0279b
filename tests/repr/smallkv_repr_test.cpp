// The 'smallkv' Representation directly: Eq. 6 attention against a reference over read() rows,
// append_bound against the real growth, bytes by tier against an independent count, save/restore
// (bit-identical, same behaviour afterwards), damaged records, eviction without a proxy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/cache.h"
#include "core/context.h"
#include "core/geometry.h"
#include "core/policy.h"
#include "repr/smallkv_repr.h"
#include "test_util.h"
#include "util/error.h"

using namespace kvsdk;

namespace {

constexpr uint32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 8, kPQ = 2, kMatch = 12;

Geometry geometry(uint32_t q, uint32_t kv) {
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, q, kv, kDim);
  return Geometry::from_c(&g);
}

kvsdk_policy policy() {
  kvsdk_policy p = policy_defaults(KVSDK_METHOD_SMALLKV);
  p.match_tokens = kMatch;
  return p;
}

// One step of input: positions, the proxy's rows and queries, the large model's rows and queries
// (per layer).
struct Step {
  std::vector<int32_t> pos;
  std::vector<std::vector<float>> pk, pv, pq, k, v, q;
};

// A proxy cache ('full') and smallkv representations driven like a host does: the proxy's step
// (append + attend) first, then the representation's.
struct Rig {
  std::shared_ptr<Context> ctx = std::make_shared<Context>(KVSDK_BACKEND_CPU, 0, 0);
  Cache proxy{ctx, geometry(kPQ, 1), policy_defaults(KVSDK_METHOD_FULL)};
  std::unique_ptr<SmallKvRepresentation> repr =
      std::make_unique<SmallKvRepresentation>(geometry(kQ, kKv), policy());
  std::mt19937 rng{11};
  int32_t next = 0;

  Step make(size_t n) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    Step s;
    for (size_t t = 0; t < n; ++t) s.pos.push_back(next++);
    auto fill = [&](size_t count) {
      std::vector<float> x(count);
      for (float& e : x) e = d(rng);
      return x;
    };
    for (uint32_t l = 0; l < kLayers; ++l) {
      s.pk.push_back(fill(n * kDim));
      s.pv.push_back(fill(n * kDim));
      s.pq.push_back(fill(n * kPQ * kDim));
      s.k.push_back(fill(n * kKv * kDim));
      s.v.push_back(fill(n * kKv * kDim));
      s.q.push_back(fill(n * kQ * kDim));
    }
    return s;
  }
  void proxy_append(const Step& s) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      proxy.append(l, s.pos.size(), s.pk[l].data(), s.pv[l].data(), s.pos.data());
    }
  }
  void proxy_attend(const Step& s) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> out(s.pq[l].size());
      proxy.attend(l, s.pos.size(), s.pq[l].data(), s.pos.data(), out.data());
    }
  }
  static void append(SmallKvRepresentation& r, const Step& s) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      const uint64_t before = r.layer_bytes(l), bound = r.append_bound(l, s.pos.size());
      r.append(l, s.pos.size(), s.k[l].data(), s.v[l].data(), s.pos.data());
      const uint64_t after = r.layer_bytes(l);
      EXPECT_LE(after > before ? after - before : 0, bound);
    }
  }
  // Attention of every layer and KV head; returns the outputs [layer][kv_head][rows][dim].
  static std::vector<std::vector<float>> attend(const SmallKvRepresentation& r, const Step& s) {
    const uint32_t group = kQ / kKv;
    const size_t rows = s.pos.size() * group;
    std::vector<std::vector<float>> outs;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t g = 0; g < kKv; ++g) {
        std::vector<float> q(rows * kDim), out(rows * kDim);
        std::vector<int32_t> rpos(rows);
        for (size_t i = 0; i < rows; ++i) {
          rpos[i] = s.pos[i / group];
          std::copy_n(s.q[l].data() + ((i / group) * kQ + g * group + i % group) * kDim, kDim,
                      q.data() + i * kDim);
        }
        r.attend(l, g, q.data(), rpos.data(), rows, out.data());
        outs.push_back(out);
      }
    }
    return outs;
  }
  // A whole host step on the rig's representation.
  Step step(size_t n) {
    Step s = make(n);
    proxy_append(s);
    proxy_attend(s);
    append(*repr, s);
    attend(*repr, s);
    return s;
  }
};

std::vector<float> read_all(const SmallKvRepresentation& r, uint32_t l, uint32_t g,
                            std::vector<int32_t>* pos) {
  const size_t n = r.head_tokens(l, g);
  std::vector<float> k(n * kDim), v(n * kDim);
  pos->resize(n);
  r.read(l, g, k.data(), v.data(), pos->data());
  k.insert(k.end(), v.begin(), v.end());
  return k;
}

}  // namespace

TEST(SmallKvRepresentation, BytesByTierMatchAnIndependentCount) {
  Rig rig;
  rig.repr->set_proxy(&rig.proxy);
  for (int s = 0; s < 6; ++s) rig.step(3);
  rig.repr->evict(1200);
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t t[KVSDK_TIER_SLOTS] = {};
    rig.repr->add_bytes(l, t);
    uint64_t exact = 0, value_only = 0, meta = kQ * 4;  // the mapping (statistics are freed)
    for (uint32_t g = 0; g < kKv; ++g) {
      const size_t n = rig.repr->head_tokens(l, g), m = rig.repr->marginal_tokens(l, g);
      exact += (n - m) * kDim * 4;
      value_only += m * kDim * 2;
      meta += n * 8;
    }
    EXPECT_EQ(t[KVSDK_TIER_EXACT], exact);
    EXPECT_EQ(t[KVSDK_TIER_VALUE_ONLY], value_only);
    EXPECT_EQ(t[KVSDK_TIER_METADATA], meta);
    EXPECT_GT(value_only, 0u);
  }
}

TEST(SmallKvRepresentation, EvictMeetsTheTargetAndAppendBoundHolds) {
  Rig rig;
  rig.repr->set_proxy(&rig.proxy);
  std::mt19937 rng(5);
  const uint64_t cap = 4000;
  for (int s = 0; s < 30; ++s) {
    rig.step(1 + rng() % 5);  // checks append_bound
    uint64_t total = 0;
    for (uint32_t l = 0; l < kLayers; ++l) total += rig.repr->layer_bytes(l);
    if (total > cap) {
      const uint64_t freed = rig.repr->evict(total - cap);
      EXPECT_GE(freed, total - cap);
      uint64_t after = 0;
      for (uint32_t l = 0; l < kLayers; ++l) after += rig.repr->layer_bytes(l);
      EXPECT_EQ(after, total - freed);
      EXPECT_LE(after, cap);
    }
  }
}

// Double-precision softmax of one query over rows visible at its position.
std::vector<double> softmax(const float* q, int32_t qpos, const std::vector<float>& k,
                            const std::vector<int32_t>& pos) {
  std::vector<double> p(pos.size(), 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < pos.size(); ++t) {
    if (pos[t] > qpos) continue;
    double d = 0;
    for (uint32_t x = 0; x < kDim; ++x) d += double(q[x]) * k[t * kDim + x];
    p[t] = d / std::sqrt(double(kDim));
    mx = std::max(mx, p[t]);
  }
  double z = 0;
  for (size_t t = 0; t < pos.size(); ++t) z += (p[t] = pos[t] > qpos ? 0.0 : std::exp(p[t] - mx));
  for (double& x : p) x /= z;
  return p;
}

TEST(SmallKvRepresentation, AttendIsEq6OverReadRows) {
  Rig rig;
  rig.repr->set_proxy(&rig.proxy);
  for (int s = 0; s < 8; ++s) rig.step(3);
  rig.repr->evict(2500);
  Step s = rig.make(1);
  rig.proxy_append(s);
  rig.proxy_attend(s);
  Rig::append(*rig.repr, s);
  const auto outs = Rig::attend(*rig.repr, s);
  size_t marginal_seen = 0;
  const uint32_t group = kQ / kKv;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<uint32_t> map = rig.repr->mapping(l);
    for (uint32_t g = 0; g < kKv; ++g) {
      const size_t n = rig.repr->head_tokens(l, g);
      std::vector<float> k(n * kDim), v(n * kDim);
      std::vector<int32_t> pos(n);
      rig.repr->read(l, g, k.data(), v.data(), pos.data());
      // Full rows and marginal rows (read with zero keys).
      std::vector<float> fk, fv, mv;
      std::vector<int32_t> fpos, mpos;
      for (size_t t = 0; t < n; ++t) {
        bool zero = true;
        for (uint32_t x = 0; x < kDim; ++x) zero = zero && k[t * kDim + x] == 0.0f;
        if (zero) {
          mpos.push_back(pos[t]);
          mv.insert(mv.end(), v.begin() + long(t * kDim), v.begin() + long((t + 1) * kDim));
        } else {
          fpos.push_back(pos[t]);
          fk.insert(fk.end(), k.begin() + long(t * kDim), k.begin() + long((t + 1) * kDim));
          fv.insert(fv.end(), v.begin() + long(t * kDim), v.begin() + long((t + 1) * kDim));
        }
      }
      EXPECT_EQ(mpos.size(), rig.repr->marginal_tokens(l, g));
      marginal_seen += mpos.size();
      for (uint32_t j = 0; j < group; ++j) {
        const float* q = s.q[l].data() + (g * group + j) * kDim;
        // The matched proxy head's probabilities over the proxy's full cache (its rows as held).
        const uint32_t ph = map[g * group + j], pl = ph / kPQ, pj = ph % kPQ;
        const size_t pn = rig.proxy.head_tokens(pl, 0);
        std::vector<float> pk(pn * kDim);
        std::vector<int32_t> ppos(pn);
        rig.proxy.read(pl, 0, pk.data(), nullptr, ppos.data(), pn);
        const std::vector<double> pw = softmax(s.pq[pl].data() + pj * kDim, s.pos[0], pk, ppos);
        std::vector<double> want(kDim, 0.0);
        double mass = 0;
        for (size_t m = 0; m < mpos.size(); ++m) {
          const size_t t = size_t(std::find(ppos.begin(), ppos.end(), mpos[m]) - ppos.begin());
          ASSERT_LT(t, pn);
          mass += pw[t];
          for (uint32_t x = 0; x < kDim; ++x) want[x] += pw[t] * mv[m * kDim + x];
        }
        const std::vector<double> a = softmax(q, s.pos[0], fk, fpos);
        for (size_t t = 0; t < fpos.size(); ++t) {
          for (uint32_t x = 0; x < kDim; ++x) want[x] += (1.0 - mass) * a[t] * fv[t * kDim + x];
        }
        const std::vector<float>& out = outs[l * kKv + g];
        for (uint32_t x = 0; x < kDim; ++x) {
          EXPECT_NEAR(out[j * kDim + x], want[x], 1e-5) << "layer " << l << " head " << g;
        }
      }
    }
  }
  EXPECT_GT(marginal_seen, 0u);
}

TEST(SmallKvRepresentation, SaveRestoreIsBitIdenticalAndBehavesTheSame) {
  Rig rig;
  rig.repr->set_proxy(&rig.proxy);
  for (int s = 0; s < 8; ++s) rig.step(3);
  rig.repr->evict(2000);
  auto copy = std::make_unique<SmallKvRepresentation>(geometry(kQ, kKv), policy());
  for (uint32_t l = 0; l < kLayers; ++l) copy->restore(l, rig.repr->save(l));
  auto same = [&] {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t g = 0; g < kKv; ++g) {
        std::vector<int32_t> a, b;
        EXPECT_EQ(read_all(*rig.repr, l, g, &a), read_all(*copy, l, g, &b));
        EXPECT_EQ(a, b);
      }
      EXPECT_EQ(copy->mapping(l), rig.repr->mapping(l));
      EXPECT_EQ(copy->layer_bytes(l), rig.repr->layer_bytes(l));
    }
  };
  same();
  // The same further steps on both: the proxy serves one at a time, so it attends the step again
  // for the other (its cache is unchanged by attention).
  for (int i = 0; i < 4; ++i) {
    Step s = rig.make(2);
    rig.proxy_append(s);
    rig.repr->set_proxy(&rig.proxy);
    rig.proxy_attend(s);
    Rig::append(*rig.repr, s);
    const auto a = Rig::attend(*rig.repr, s);
    copy->set_proxy(&rig.proxy);
    EXPECT_FALSE(rig.repr->has_proxy());
    rig.proxy_attend(s);
    Rig::append(*copy, s);
    const auto b = Rig::attend(*copy, s);
    EXPECT_EQ(a, b);
    rig.repr->set_proxy(&rig.proxy);
    const uint64_t freed = rig.repr->evict(600);
    copy->set_proxy(&rig.proxy);
    EXPECT_EQ(copy->evict(600), freed);
    same();
  }
}

TEST(SmallKvRepresentation, DamagedRecordsAreCorrupt) {
  Rig rig;
  rig.repr->set_proxy(&rig.proxy);
  for (int s = 0; s < 6; ++s) rig.step(3);
  rig.repr->evict(2000);
  const std::vector<TierRecord> good = rig.repr->save(0);
  auto expect_corrupt = [](std::vector<TierRecord> recs) {
    SmallKvRepresentation r(geometry(kQ, kKv), policy());
    try {
      r.restore(0, recs);
      ADD_FAILURE() << "restore accepted damaged records";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << e.what();
    }
  };
  {
    auto r = good;
    r.pop_back();
    expect_corrupt(r);
  }
  {
    auto r = good;
    r[1].kind = "kivi.head";
    expect_corrupt(r);
  }
  {
    auto r = good;
    r[1].fields.erase(r[1].fields.begin());  // missing field
    expect_corrupt(r);
  }
  {
    auto r = good;
    for (TierField& f : r[1].fields) {
      if (f.name == "full_keys") f.u16.pop_back();
    }
    expect_corrupt(r);
  }
  {
    auto r = good;
    for (TierField& f : r[0].fields) {
      if (f.name == "mapping") f.u32.push_back(0);
    }
    expect_corrupt(r);
  }
  {
    auto r = good;
    for (TierField& f : r[2].fields) {
      if (f.name == "matched") f.u64 = {7};
    }
    expect_corrupt(r);
  }
}

TEST(SmallKvRepresentation, EvictionNeedsAProxy) {
  SmallKvRepresentation r(geometry(kQ, kKv), policy());
  std::vector<float> k(kKv * kDim, 1.0f), v(k.size(), 1.0f);
  int32_t pos = 0;
  r.append(0, 1, k.data(), v.data(), &pos);
  try {
    r.evict(100);
    ADD_FAILURE() << "evicted without a proxy";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_STATE);
  }
  EXPECT_EQ(r.head_tokens(0, 0), 1u);
}
