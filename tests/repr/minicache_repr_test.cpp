// MiniCacheRepresentation (policy 'minicache' and 'minicache+kivi4') directly: which layers pairs
// cover, the exact pending buffer of a pair's leading layer, merging on the partner's append,
// attention against straightforward references, bounds, bytes by tier, save/restore.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "same_records.h"
#include "../backends/cpu/reference_attention.h"
#include "core/policy.h"
#include "repr/minicache_repr.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk;
using kvsdk_test::reference_attention;
using kvsdk_test::relative_error;

namespace {

constexpr uint32_t kLayers = 5, kQ = 4, kKv = 2, kDim = 16;

Geometry geometry() {
  const kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, kQ, kKv, kDim);
  return Geometry::from_c(&g);
}

kvsdk_policy policy(int32_t bits = 0) {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_MINICACHE);
  p.quant_bits = bits;
  p.quant_group = 8;
  p.quant_residual = 16;
  return p;
}

// f16-rounded random rows [n][kKv][kDim] (what the exact tier would hold).
std::vector<float> rows(size_t n, uint32_t seed) {
  std::vector<float> x = kvsdk_test::random_floats(n * kKv * kDim, seed);
  for (float& f : x) f = f16_to_f32(f32_to_f16(f));
  return x;
}

// Rows of layer b that are close to those of layer a (so most tokens merge).
std::vector<float> near(const std::vector<float>& a, uint32_t seed) {
  std::vector<float> x = kvsdk_test::random_floats(a.size(), seed, 0.2f);
  for (size_t i = 0; i < a.size(); ++i) x[i] = f16_to_f32(f32_to_f16(a[i] + x[i]));
  return x;
}

// One KV head's rows [n][kDim] out of [n][kKv][kDim].
std::vector<float> head(const std::vector<float>& x, uint32_t h) {
  const size_t n = x.size() / (kKv * kDim);
  std::vector<float> out(n * kDim);
  for (size_t t = 0; t < n; ++t) std::copy_n(&x[(t * kKv + h) * kDim], kDim, &out[t * kDim]);
  return out;
}

struct Rows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
Rows read_rows(const Representation& r, uint32_t layer, uint32_t h) {
  const size_t n = r.head_tokens(layer, h);
  Rows out{std::vector<float>(n * kDim), std::vector<float>(n * kDim), std::vector<int32_t>(n)};
  r.read(layer, h, out.k.data(), out.v.data(), out.pos.data());
  return out;
}

std::vector<float> attend(const Representation& r, uint32_t layer, uint32_t h,
                          const std::vector<float>& q, const std::vector<int32_t>& qpos) {
  std::vector<float> out(q.size());
  r.attend(layer, h, q.data(), qpos.data(), qpos.size(), out.data());
  return out;
}

uint64_t total_bytes(const Representation& r) {
  uint64_t b = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (r.covers(l)) b += r.layer_bytes(l);
  }
  return b;
}

const std::vector<int32_t> kQpos = {INT32_MAX, 20, INT32_MAX, 5};

TEST(MiniCacheRepr, PairsFromTheBoundaryLayerOn) {
  MiniCacheRepresentation mid(geometry(), policy());
  EXPECT_EQ(mid.boundary(), 2u);
  const bool want_mid[kLayers] = {false, false, true, true, false};  // layer 4 has no partner
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(mid.covers(l), want_mid[l]) << l;
  kvsdk_policy p = policy();
  p.boundary_layer = 1;
  MiniCacheRepresentation one(geometry(), p);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(one.covers(l), l >= 1) << l;
  p.boundary_layer = 5;
  try {
    MiniCacheRepresentation bad(geometry(), p);
    ADD_FAILURE() << "boundary 5 of 5 layers accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG);
  }
}

// Rows appended to the first layer of a pair wait exact: attention over them equals exact
// attention, read() returns them as stored, and they count as EXACT.
TEST(MiniCacheRepr, PendingRowsOfTheLeadingLayerAreExact) {
  for (int32_t bits : {0, 4}) {
    MiniCacheRepresentation r(geometry(), policy(bits));
    const size_t n = 40;
    const std::vector<float> k = rows(n, 1), v = rows(n, 2);
    const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
    r.append(2, n, k.data(), v.data(), pos.data());
    EXPECT_EQ(r.pending_tokens(2), n);
    EXPECT_EQ(r.head_tokens(2, 0), n);
    EXPECT_EQ(r.head_tokens(3, 0), 0u);
    const std::vector<float> q = kvsdk_test::random_floats(kQpos.size() * kDim, 3, 0.5f);
    for (uint32_t h = 0; h < kKv; ++h) {
      const Rows got = read_rows(r, 2, h);
      EXPECT_EQ(got.k, head(k, h));
      EXPECT_EQ(got.v, head(v, h));
      EXPECT_EQ(got.pos, pos);
      const auto want = reference_attention(q, kQpos, head(k, h), head(v, h), pos, kDim,
                                            geometry().attn_scale);
      EXPECT_LT(relative_error(attend(r, 2, h, q, kQpos), want), 1e-6);
    }
    uint64_t t2[KVSDK_TIER_SLOTS] = {}, t3[KVSDK_TIER_SLOTS] = {};
    r.add_bytes(2, t2);
    r.add_bytes(3, t3);
    EXPECT_EQ(t2[KVSDK_TIER_EXACT], kKv * n * 4 * kDim);
    EXPECT_EQ(t2[KVSDK_TIER_MERGED] + t3[KVSDK_TIER_MERGED] + t3[KVSDK_TIER_EXACT], 0u);
  }
}

// The partner's append merges the waiting rows: pending released, both layers read as the
// kernel's own reconstruction of the same data, attention equals the reference over read() rows.
TEST(MiniCacheRepr, PartnerAppendMergesLikeTheKernel) {
  MiniCacheRepresentation r(geometry(), policy());
  const size_t n = 60;
  const std::vector<float> k2 = rows(n, 4), v2 = rows(n, 5), k3 = near(k2, 6), v3 = near(v2, 7);
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n, 10);
  r.append(2, n, k2.data(), v2.data(), pos.data());
  r.append(3, n, k3.data(), v3.data(), pos.data());
  EXPECT_EQ(r.pending_tokens(2) + r.pending_tokens(3), 0u);
  const std::vector<float> q = kvsdk_test::random_floats(kQpos.size() * kDim, 8, 0.5f);
  uint64_t merged_bytes = 0, meta_bytes = 0;
  for (uint32_t h = 0; h < kKv; ++h) {
    cpu::MiniCacheHeadPair ref(kDim, cpu::MiniCacheConfig{0.6f, 0.05f});
    ref.append(head(k2, h).data(), head(v2, h).data(), head(k3, h).data(), head(v3, h).data(),
               pos.data(), n);
    for (uint32_t layer : {2u, 3u}) {
      const Rows got = read_rows(r, layer, h);
      std::vector<float> kk(n * kDim), vv(n * kDim);
      ref.keys.reconstruct(int(layer - 2), 0, n, kk.data());
      ref.values.reconstruct(int(layer - 2), 0, n, vv.data());
      EXPECT_EQ(got.k, kk);
      EXPECT_EQ(got.v, vv);
      EXPECT_EQ(got.pos, pos);
      const auto want = reference_attention(q, kQpos, got.k, got.v, got.pos, kDim,
                                            geometry().attn_scale);
      EXPECT_LT(relative_error(attend(r, layer, h, q, kQpos), want), 1e-6);
    }
    EXPECT_EQ(ref.keys.retained(), 3u);  // ceil(0.05 * 60)
    // Independent count: directions, magnitudes and retained rows of keys and values; slots,
    // thresholds and positions.
    for (const cpu::MergedLayerPair* m : {&ref.keys, &ref.values}) {
      merged_bytes += m->merged() * (2 * kDim + 8) + m->retained() * 4 * kDim;
      meta_bytes += 4 * n + 4;
    }
    meta_bytes += 4 * n;
  }
  uint64_t t[KVSDK_TIER_SLOTS] = {};
  r.add_bytes(2, t);
  r.add_bytes(3, t);
  EXPECT_EQ(t[KVSDK_TIER_MERGED], merged_bytes);
  EXPECT_EQ(t[KVSDK_TIER_METADATA], meta_bytes);
  EXPECT_EQ(t[KVSDK_TIER_EXACT], 0u);
  EXPECT_EQ(total_bytes(r), merged_bytes + meta_bytes);
}

TEST(MiniCacheReprKivi, BytesByTierMatchTheKernel) {
  MiniCacheRepresentation r(geometry(), policy(4));
  const size_t n = 70;
  const std::vector<float> k2 = rows(n, 14), v2 = rows(n, 15), k3 = near(k2, 16), v3 = near(v2, 17);
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
  r.append(3, n, k3.data(), v3.data(), pos.data());  // the second layer may lead too
  r.append(2, n, k2.data(), v2.data(), pos.data());
  uint64_t want[KVSDK_TIER_SLOTS] = {};
  for (uint32_t h = 0; h < kKv; ++h) {
    cpu::MiniCacheKiviPair ref(kDim, cpu::MiniCacheConfig{0.6f, 0.05f}, cpu::KiviConfig{4, 8, 16});
    ref.append(head(k2, h).data(), head(v2, h).data(), head(k3, h).data(), head(v3, h).data(),
               pos.data(), n);
    const cpu::MiniCacheKiviBytes b = ref.bytes();
    want[KVSDK_TIER_QUANTIZED] += b.quantized;
    want[KVSDK_TIER_MERGED] += b.merged + b.retained;
    want[KVSDK_TIER_METADATA] += b.metadata;
    for (uint32_t layer : {2u, 3u}) {
      std::vector<float> kk(n * kDim), vv(n * kDim);
      ref.read_rows(int(layer - 2), 0, n, kk.data(), vv.data());
      const Rows got = read_rows(r, layer, h);
      EXPECT_EQ(got.k, kk);
      EXPECT_EQ(got.v, vv);
    }
  }
  uint64_t t[KVSDK_TIER_SLOTS] = {};
  r.add_bytes(2, t);
  r.add_bytes(3, t);
  for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) EXPECT_EQ(t[i], want[i]) << "tier " << i;
}

// Partner appends of other token counts merge the common prefix and keep the rest waiting.
TEST(MiniCacheRepr, DifferentTokenCountsMergeTheCommonPrefix) {
  MiniCacheRepresentation r(geometry(), policy());
  const size_t n = 50;
  const std::vector<float> k = rows(n, 9), v = rows(n, 10), k3 = near(k, 11), v3 = near(v, 12);
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
  const size_t row = kKv * kDim;
  r.append(2, 30, k.data(), v.data(), pos.data());
  r.append(3, 40, k3.data(), v3.data(), pos.data());  // 30 merge, 10 wait on layer 3
  EXPECT_EQ(r.pending_tokens(2), 0u);
  EXPECT_EQ(r.pending_tokens(3), 10u);
  EXPECT_EQ(r.head_tokens(2, 1), 30u);
  EXPECT_EQ(r.head_tokens(3, 1), 40u);
  const Rows l3 = read_rows(r, 3, 0);
  EXPECT_EQ(l3.pos, std::vector<int32_t>(pos.begin(), pos.begin() + 40));
  // The waiting rows are read exactly.
  EXPECT_TRUE(std::equal(l3.k.begin() + 30 * kDim, l3.k.end(), head(k3, 0).begin() + 30 * kDim));
  r.append(2, 15, &k[30 * row], &v[30 * row], &pos[30]);  // 10 merge, 5 wait on layer 2
  EXPECT_EQ(r.pending_tokens(2), 5u);
  EXPECT_EQ(r.pending_tokens(3), 0u);
  EXPECT_EQ(r.head_tokens(2, 0), 45u);
  EXPECT_EQ(r.head_tokens(3, 0), 40u);
  // Positions must agree token by token: refused before anything changes.
  const uint64_t before = total_bytes(r);
  std::vector<int32_t> wrong(pos.begin() + 40, pos.end());
  wrong[2] += 1;
  try {
    r.append(3, 10, &k3[40 * row], &v3[40 * row], wrong.data());
    ADD_FAILURE() << "mismatched positions accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG);
  }
  EXPECT_EQ(total_bytes(r), before);
  EXPECT_EQ(r.pending_tokens(2), 5u);
  r.append(3, 10, &k3[40 * row], &v3[40 * row], &pos[40]);  // 5 merge, 5 wait on layer 3
  EXPECT_EQ(r.head_tokens(2, 0), 45u);
  EXPECT_EQ(r.head_tokens(3, 0), 50u);
  EXPECT_EQ(r.pending_tokens(3), 5u);
}

// append_bound() bounds the change of the representation's bytes for any sequence of appends.
TEST(MiniCacheRepr, AppendBoundIsAnUpperBound) {
  for (int32_t bits : {0, 4, 2}) {
    MiniCacheRepresentation r(geometry(), policy(bits));
    std::mt19937 rng(77 + bits);
    int32_t next[2] = {0, 0};  // next position of layers 2 and 3
    for (int step = 0; step < 120; ++step) {
      const uint32_t side = rng() % 2;
      const size_t n = (step < 4 ? 20 : 0) + rng() % 9;
      // The partner must use the same positions for the same tokens: both sides count alike.
      std::vector<int32_t> pos(n);
      for (size_t i = 0; i < n; ++i) pos[i] = next[side] + int32_t(i);
      next[side] += int32_t(n);
      const std::vector<float> k = rows(n, 1000 + step), v = rows(n, 2000 + step);
      const uint64_t bound = r.append_bound(2 + side, n);
      const uint64_t before = total_bytes(r);
      r.append(2 + side, n, k.data(), v.data(), pos.data());
      const uint64_t after = total_bytes(r);
      ASSERT_LE(after, before + bound) << "bits " << bits << " step " << step << " n " << n;
    }
  }
}

void expect_same(const Representation& a, const Representation& b) {
  const std::vector<float> q = kvsdk_test::random_floats(kQpos.size() * kDim, 31, 0.5f);
  for (uint32_t layer : {2u, 3u}) {
    for (uint32_t h = 0; h < kKv; ++h) {
      const Rows ra = read_rows(a, layer, h), rb = read_rows(b, layer, h);
      EXPECT_EQ(ra.k, rb.k);
      EXPECT_EQ(ra.v, rb.v);
      EXPECT_EQ(ra.pos, rb.pos);
      EXPECT_EQ(attend(a, layer, h, q, kQpos), attend(b, layer, h, q, kQpos));
    }
    EXPECT_EQ(a.layer_bytes(layer), b.layer_bytes(layer));
  }
}

// save() -> restore() into a fresh instance: identical reads, attention and further appends,
// with rows waiting in the pending buffer at save time.
TEST(MiniCacheRepr, SaveRestoreIsBitIdenticalAndContinuesIdentically) {
  for (int32_t bits : {0, 4}) {
    MiniCacheRepresentation a(geometry(), policy(bits)), b(geometry(), policy(bits));
    const size_t n = 80, row = kKv * kDim;
    const std::vector<float> k = rows(n, 21), v = rows(n, 22), k3 = near(k, 23), v3 = near(v, 24);
    const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
    a.append(2, 50, k.data(), v.data(), pos.data());
    a.append(3, 40, k3.data(), v3.data(), pos.data());  // 10 rows of layer 2 wait
    for (uint32_t layer : {2u, 3u}) b.restore(layer, a.save(layer));
    expect_same(a, b);
    for (MiniCacheRepresentation* r : {&a, &b}) {
      r->append(3, 30, &k3[40 * row], &v3[40 * row], &pos[40]);
      r->append(2, 30, &k[50 * row], &v[50 * row], &pos[50]);
    }
    expect_same(a, b);
  }
}

void expect_corrupt(Representation& r, uint32_t layer, const std::vector<TierRecord>& recs,
                    const std::string& what) {
  try {
    r.restore(layer, recs);
    ADD_FAILURE() << "accepted: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << what << ": " << e.what();
  }
}

TEST(MiniCacheRepr, DamagedRecordsAreCorrupt) {
  for (int32_t bits : {0, 4}) {
    MiniCacheRepresentation a(geometry(), policy(bits));
    const size_t n = 60;
    const std::vector<float> k = rows(n, 41), v = rows(n, 42), k3 = near(k, 43);
    const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
    a.append(2, n, k.data(), v.data(), pos.data());
    a.append(3, 50, k3.data(), v.data(), pos.data());
    for (uint32_t layer : {2u, 3u}) {
      const std::vector<TierRecord> good = a.save(layer);
      for (size_t f = 0; f < good[0].fields.size(); ++f) {
        const std::string name = good[0].fields[f].name;
        MiniCacheRepresentation fresh(geometry(), policy(bits));
        std::vector<TierRecord> bad = good;
        bad[1].fields.erase(bad[1].fields.begin() + long(f));
        expect_corrupt(fresh, layer, bad, "missing " + name);
        bad = good;
        TierField& x = bad[1].fields[f];  // one element too many, whatever its type
        x.u8.push_back(1), x.u16.push_back(1), x.i32.push_back(1), x.u32.push_back(1);
        x.f32.push_back(1), x.u64.push_back(1);
        expect_corrupt(fresh, layer, bad, "oversized " + name);
      }
      MiniCacheRepresentation fresh(geometry(), policy(bits));
      std::vector<TierRecord> bad = good;
      bad[0].kind = "kivi.head";
      expect_corrupt(fresh, layer, bad, "wrong kind");
      bad = good;
      bad.pop_back();
      expect_corrupt(fresh, layer, bad, "missing head");
      std::vector<TierRecord> swapped = a.save(layer);
      std::swap(swapped[0], swapped[1]);
      expect_corrupt(fresh, layer, swapped, "heads out of order");
    }
    MiniCacheRepresentation fresh(geometry(), policy(bits));
    expect_corrupt(fresh, 4, a.save(2), "uncovered layer");
  }
}

// The pair's records (both layers) equal field for field, and so do reads, attention and bytes.
void expect_same_records(const Representation& a, const Representation& b) {
  for (uint32_t layer : {2u, 3u}) kvsdk_test::expect_same_records(a, b, layer);
  expect_same(a, b);
}

// Tokens [from, from + n) of the pair's two layers, in one append per layer (layer `lead` first).
struct PairFeed {
  static constexpr size_t kN = 120;
  std::vector<float> k = rows(kN, 51), v = rows(kN, 52), k3 = near(k, 53), v3 = near(v, 54);
  std::vector<int32_t> pos = kvsdk_test::iota_positions(kN);
  void layer(Representation& r, uint32_t l, size_t from, size_t n) const {
    const size_t row = kKv * kDim;
    const std::vector<float>& kk = l == 2 ? k : k3;
    const std::vector<float>& vv = l == 2 ? v : v3;
    r.append(l, n, &kk[from * row], &vv[from * row], &pos[from]);
  }
  void operator()(Representation& r, size_t from, size_t n, uint32_t lead = 2) const {
    layer(r, lead, from, n);
    layer(r, 5 - lead, from, n);
  }
  void steps(Representation& r, size_t from, size_t to) const {
    for (size_t t = from; t < to; ++t) (*this)(r, t, 1, t % 2 ? 3 : 2);
  }
};

bool refuses(const Representation& r, int32_t position, const std::string& with) {
  for (uint32_t layer : {2u, 3u}) {
    const std::string why = r.truncate_refusal(layer, position);
    if (why.find("layer " + std::to_string(layer)) == std::string::npos ||
        why.find(with) == std::string::npos) {
      ADD_FAILURE() << "cut at " << position << ", layer " << layer << ": '" << why << "'";
      return false;
    }
  }
  return true;
}

// What Cache::truncate does: every layer's check, then every layer's cut.
void cut(Representation& r, int32_t position) {
  for (uint32_t layer : {2u, 3u}) ASSERT_EQ(r.truncate_refusal(layer, position), "") << position;
  for (uint32_t layer : {2u, 3u}) r.truncate(layer, position);
}

// MiniCache merges each token after the first merge by itself against the fixed retention
// threshold: removing the newest tokens (merged or retained, and rows waiting for the partner)
// leaves the pair of a history without them, and continuing gives the same pair.
TEST(MiniCacheRepr, TruncationAfterTheFirstMergeIsExact) {
  for (int32_t bits : {0, 4}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const PairFeed feed;
    MiniCacheRepresentation a(geometry(), policy(bits)), b(geometry(), policy(bits)),
        c(geometry(), policy(bits));
    // 30 tokens (about 28 merged directions: one KIVI flush at 24, residual 16 + 4), 3 steps.
    for (MiniCacheRepresentation* r : {&a, &b, &c}) feed(*r, 0, 30);
    feed.steps(a, 30, 33);
    feed.steps(c, 30, 31);
    feed.layer(a, 2, 33, 2);  // two rows of layer 2 wait for layer 3
    cut(a, 35);               // nothing goes
    cut(a, 31);
    expect_same_records(a, c);
    cut(a, 30);
    expect_same_records(a, b);
    for (MiniCacheRepresentation* r : {&a, &b}) {
      feed.steps(*r, 30, 32);
      feed(*r, 32, 3, 3);
    }
    expect_same_records(a, b);
    // Only waiting rows: the leading layer's newest go.
    for (MiniCacheRepresentation* r : {&a, &b}) feed.layer(*r, 3, 35, 2);
    feed.layer(a, 3, 37, 1);
    cut(a, 37);
    EXPECT_EQ(a.pending_tokens(3), 2u);
    expect_same_records(a, b);
  }
}

TEST(MiniCacheRepr, TruncationInsideTheFirstMergeIsRefusedAndEverythingGoesExactly) {
  for (int32_t bits : {0, 4}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const PairFeed feed;
    MiniCacheRepresentation a(geometry(), policy(bits)), b(geometry(), policy(bits));
    feed(a, 0, 20);
    feed.steps(a, 20, 22);
    const std::vector<TierRecord> before2 = a.save(2), before3 = a.save(3);
    // The retention threshold is the γ-quantile of the first merge's distances: a cut inside
    // it would have fixed another one.
    for (int32_t at : {1, 10, 19}) refuses(a, at, "threshold");
    b.restore(2, before2);
    b.restore(3, before3);
    expect_same_records(a, b);
    // Everything: the fresh pair, whose next append fixes a threshold again.
    cut(a, 0);
    MiniCacheRepresentation fresh(geometry(), policy(bits));
    expect_same_records(a, fresh);
    EXPECT_EQ(total_bytes(a), 0u);
    for (MiniCacheRepresentation* r : {&a, &fresh}) {
      feed(*r, 40, 12, 3);
      feed.steps(*r, 52, 54);
    }
    expect_same_records(a, fresh);
  }
}

TEST(MiniCacheRepr, AfterARestoreOnlyNewerTokensCanGo) {
  // A snapshot does not say how many tokens the first merge held: every restored token counts.
  for (int32_t bits : {0, 4}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const PairFeed feed;
    MiniCacheRepresentation a(geometry(), policy(bits)), b(geometry(), policy(bits));
    feed(a, 0, 10);
    feed.steps(a, 10, 14);
    for (uint32_t layer : {2u, 3u}) b.restore(layer, a.save(layer));
    EXPECT_EQ(a.truncate_refusal(2, 12), "");
    refuses(b, 12, "snapshot");
    feed.steps(b, 14, 16);
    EXPECT_EQ(b.truncate_refusal(2, 14), "");
    EXPECT_EQ(b.truncate_refusal(3, 0), "");
  }
}

TEST(MiniCacheReprKivi, DirectionsQuantizedByAFlushCannotGo) {
  // KIVI (G 8, R 16) flushes its oldest 8 directions when the residual reaches 24: the tokens
  // that made it flush can no longer go (the history without them holds those directions exact).
  const PairFeed feed;
  MiniCacheRepresentation a(geometry(), policy(4));
  feed(a, 0, 20);  // γ = 5%: one token retained, 19 directions exact
  feed.steps(a, 20, 30);  // (merged, these inputs: the 24th direction, token 24, flushes)
  refuses(a, 24, "since the last flush");
  EXPECT_EQ(a.truncate_refusal(2, 25), "");
}

}  // namespace
