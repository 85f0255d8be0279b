// SpindleKvRepresentation (policy 'spindlekv') directly: codebook layers below the boundary,
// attention against references over read() rows and the kernel's reconstruction, coverage of the
// inputs, append bound, bytes by tier, save/restore.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "same_records.h"
#include "../backends/cpu/reference_attention.h"
#include "repr/spindlekv_repr.h"
#include "rope.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk;
using kvsdk_test::reference_attention;
using kvsdk_test::relative_error;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16;

Geometry geometry() {
  kvsdk_geometry g = kvsdk_test::make_geometry(kLayers, kQ, kKv, kDim);
  g.rope_style = KVSDK_ROPE_HALF;
  return Geometry::from_c(&g);
}

kvsdk_policy policy() {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_SPINDLEKV);
  return p;
}

// Rows [n][kKv][kDim] around a few directions (so codebooks share entries), keys rotated by RoPE
// at their positions as a host would give them.
std::vector<float> clustered(size_t n, uint32_t seed, const std::vector<int32_t>* rope_pos) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> centers(6 * kDim);
  for (float& c : centers) c = d(rng);
  std::vector<float> x(n * kKv * kDim);
  const cpu::Rope rope(kDim, 10000.0f, KVSDK_ROPE_HALF);
  for (size_t t = 0; t < n * kKv; ++t) {
    const size_t c = rng() % 6;
    const float scale = 0.5f + float(rng() % 100) / 50.0f;
    for (size_t i = 0; i < kDim; ++i) x[t * kDim + i] = scale * (centers[c * kDim + i] + 0.03f * d(rng));
    if (rope_pos) rope.apply(&x[t * kDim], (*rope_pos)[t / kKv]);
  }
  return x;
}

std::vector<float> head(const std::vector<float>& x, uint32_t h) {
  const size_t n = x.size() / (kKv * kDim);
  std::vector<float> out(n * kDim);
  for (size_t t = 0; t < n; ++t) std::copy_n(&x[(t * kKv + h) * kDim], kDim, &out[t * kDim]);
  return out;
}

double cosine(const float* a, const float* b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < kDim; ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
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

const std::vector<int32_t> kQpos = {INT32_MAX, 30, INT32_MAX, 7};

TEST(SpindleKvRepr, CodebooksBelowTheBoundary) {
  SpindleKvRepresentation mid(geometry(), policy());
  EXPECT_EQ(mid.boundary(), 2u);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(mid.covers(l), l < 2) << l;
  kvsdk_policy p = policy();
  p.boundary_layer = 0;
  SpindleKvRepresentation none(geometry(), p);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_FALSE(none.covers(l));
  p.boundary_layer = 5;
  EXPECT_THROW(SpindleKvRepresentation(geometry(), p), Error);
}

TEST(SpindleKvRepr, AttentionAndReadMatchTheKernelAndCoverEveryRow) {
  SpindleKvRepresentation r(geometry(), policy());
  const size_t n = 90;
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n, 3);
  const std::vector<float> k = clustered(n, 1, &pos), v = clustered(n, 2, nullptr);
  r.append(1, 70, k.data(), v.data(), pos.data());
  r.append(1, 20, &k[70 * kKv * kDim], &v[70 * kKv * kDim], &pos[70]);  // decode-like
  const std::vector<float> q = kvsdk_test::random_floats(kQpos.size() * kDim, 3, 0.5f);
  uint64_t codebook = 0;
  for (uint32_t h = 0; h < kKv; ++h) {
    cpu::SpindleHeadStore ref(kDim, 10000.0f, KVSDK_ROPE_HALF);
    ref.append(head(k, h).data(), head(v, h).data(), pos.data(), 70);
    ref.append(&head(k, h)[70 * kDim], &head(v, h)[70 * kDim], &pos[70], 20);
    codebook += ref.keys().bytes() + ref.values().bytes();
    std::vector<float> kk(n * kDim), vv(n * kDim);
    ref.read_rows(0, n, kk.data(), vv.data());
    const Rows got = read_rows(r, 1, h);
    EXPECT_EQ(got.k, kk);
    EXPECT_EQ(got.v, vv);
    EXPECT_EQ(got.pos, pos);
    EXPECT_LT(ref.keys().entries(), n / 2) << "clustered keys should share entries";
    for (size_t t = 0; t < n; ++t) {  // coverage: every row within θ of what attention sees
      EXPECT_GT(cosine(&got.k[t * kDim], &head(k, h)[t * kDim]), cpu::kSpindleThetaK - 1e-4);
      EXPECT_GT(cosine(&got.v[t * kDim], &head(v, h)[t * kDim]), cpu::kSpindleThetaV - 1e-4);
    }
    const auto want = reference_attention(q, kQpos, got.k, got.v, got.pos, kDim,
                                          geometry().attn_scale);
    EXPECT_LT(relative_error(attend(r, 1, h, q, kQpos), want), 1e-6);
  }
  uint64_t t[KVSDK_TIER_SLOTS] = {};
  r.add_bytes(1, t);
  EXPECT_EQ(t[KVSDK_TIER_CODEBOOK], codebook);
  EXPECT_EQ(t[KVSDK_TIER_METADATA], kKv * 4 * n);
  EXPECT_EQ(r.layer_bytes(1), codebook + kKv * 4 * n);
  EXPECT_EQ(r.layer_bytes(0), 0u);
}

TEST(SpindleKvRepr, AppendBoundIsAnUpperBound) {
  SpindleKvRepresentation r(geometry(), policy());
  std::mt19937 rng(5);
  int32_t next = 0;
  for (int step = 0; step < 80; ++step) {
    const size_t n = 1 + rng() % (step % 10 == 0 ? 60 : 4);
    const std::vector<int32_t> pos = kvsdk_test::iota_positions(n, next);
    next += int32_t(n);
    // Random rows: nearly every token opens new entries (the worst case).
    const std::vector<float> k = kvsdk_test::random_floats(n * kKv * kDim, 100 + step);
    const std::vector<float> v = step % 2 ? clustered(n, 200 + step, nullptr)
                                          : kvsdk_test::random_floats(n * kKv * kDim, 300 + step);
    const uint64_t bound = r.append_bound(0, n), before = r.layer_bytes(0);
    r.append(0, n, k.data(), v.data(), pos.data());
    ASSERT_LE(r.layer_bytes(0), before + bound) << step;
  }
}

void expect_same(const Representation& a, const Representation& b, uint32_t layer) {
  const std::vector<float> q = kvsdk_test::random_floats(kQpos.size() * kDim, 31, 0.5f);
  for (uint32_t h = 0; h < kKv; ++h) {
    const Rows ra = read_rows(a, layer, h), rb = read_rows(b, layer, h);
    EXPECT_EQ(ra.k, rb.k);
    EXPECT_EQ(ra.v, rb.v);
    EXPECT_EQ(ra.pos, rb.pos);
    EXPECT_EQ(attend(a, layer, h, q, kQpos), attend(b, layer, h, q, kQpos));
  }
  EXPECT_EQ(a.layer_bytes(layer), b.layer_bytes(layer));
}

TEST(SpindleKvRepr, SaveRestoreIsBitIdenticalAndContinuesIdentically) {
  SpindleKvRepresentation a(geometry(), policy()), b(geometry(), policy());
  const size_t n = 100, row = kKv * kDim;
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
  const std::vector<float> k = clustered(n, 11, &pos), v = clustered(n, 12, nullptr);
  a.append(0, 60, k.data(), v.data(), pos.data());
  b.restore(0, a.save(0));
  expect_same(a, b, 0);
  for (SpindleKvRepresentation* r : {&a, &b}) r->append(0, 40, &k[60 * row], &v[60 * row], &pos[60]);
  expect_same(a, b, 0);
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

TEST(SpindleKvRepr, DamagedRecordsAreCorrupt) {
  SpindleKvRepresentation a(geometry(), policy());
  const size_t n = 50;
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
  const std::vector<float> k = clustered(n, 21, &pos), v = clustered(n, 22, nullptr);
  a.append(1, n, k.data(), v.data(), pos.data());
  const std::vector<TierRecord> good = a.save(1);
  for (size_t f = 0; f < good[0].fields.size(); ++f) {
    const std::string name = good[0].fields[f].name;
    SpindleKvRepresentation fresh(geometry(), policy());
    std::vector<TierRecord> bad = good;
    bad[1].fields.erase(bad[1].fields.begin() + long(f));
    expect_corrupt(fresh, 1, bad, "missing " + name);
    bad = good;
    TierField& x = bad[1].fields[f];
    x.u16.push_back(1), x.i32.push_back(1), x.u32.push_back(1), x.f32.push_back(1);
    expect_corrupt(fresh, 1, bad, "oversized " + name);
  }
  SpindleKvRepresentation fresh(geometry(), policy());
  std::vector<TierRecord> bad = good;
  bad[0].kind = "minicache.pair";
  expect_corrupt(fresh, 1, bad, "wrong kind");
  bad = good;
  bad.pop_back();
  expect_corrupt(fresh, 1, bad, "missing head");
  bad = good;
  for (uint32_t& i : bad[0].fields[1].u32) i = 1000;  // keys.index past the entries
  expect_corrupt(fresh, 1, bad, "index past the entries");
  expect_corrupt(fresh, 2, good, "record for an evicting layer");
}

using kvsdk_test::expect_same_records;

// Tokens [from, from + n) of clustered rows (k rotated at their positions) in one append.
struct Feed {
  std::vector<int32_t> pos = kvsdk_test::iota_positions(200);
  std::vector<float> k = clustered(200, 41, &pos), v = clustered(200, 42, nullptr);
  void operator()(Representation& r, uint32_t layer, size_t from, size_t n) const {
    const size_t row = kKv * kDim;
    r.append(layer, n, &k[from * row], &v[from * row], &pos[from]);
  }
};

TEST(SpindleKvRepr, TruncationRemovesWholeAppendsExactly) {
  // SpindleKV's greedy construction (Algorithm 1) only ever adds entries at the end, for the
  // leftovers of one append: removing whole appends from the end gives the codebook of a history
  // without them, and continuing gives the same codes.
  const Feed feed;
  SpindleKvRepresentation a(geometry(), policy());
  feed(a, 0, 0, 40);                                 // prefill
  for (size_t t = 40; t < 45; ++t) feed(a, 0, t, 1);  // decode
  feed(a, 0, 45, 30);                                // a second multi-row append
  for (size_t t = 75; t < 78; ++t) feed(a, 0, t, 1);
  SpindleKvRepresentation b(geometry(), policy()), c(geometry(), policy());
  feed(b, 0, 0, 40);
  for (size_t t = 40; t < 45; ++t) feed(b, 0, t, 1);
  feed(c, 0, 0, 40);
  for (size_t t = 40; t < 45; ++t) feed(c, 0, t, 1);
  feed(c, 0, 45, 30);
  EXPECT_EQ(a.truncate_refusal(0, 78), "");  // nothing to remove
  EXPECT_EQ(a.truncate_refusal(0, 75), "");
  a.truncate(0, 75);
  expect_same_records(a, c, 0);
  EXPECT_EQ(a.truncate_refusal(0, 45), "");
  a.truncate(0, 45);
  a.truncate(0, 45);  // idempotent
  expect_same_records(a, b, 0);
  expect_same(a, b, 0);
  for (SpindleKvRepresentation* r : {&a, &b}) {
    feed(*r, 0, 45, 20);
    feed(*r, 0, 65, 1);
  }
  expect_same_records(a, b, 0);
  expect_same(a, b, 0);
  // Everything: the empty store.
  EXPECT_EQ(a.truncate_refusal(0, 0), "");
  a.truncate(0, 0);
  SpindleKvRepresentation fresh(geometry(), policy());
  expect_same_records(a, fresh, 0);
  EXPECT_EQ(a.layer_bytes(0), 0u);
}

TEST(SpindleKvRepr, TruncationInsideAnAppendIsRefused) {
  const Feed feed;
  SpindleKvRepresentation a(geometry(), policy());
  feed(a, 1, 0, 40);
  feed(a, 1, 40, 2);
  feed(a, 1, 42, 1);
  const std::vector<TierRecord> before = a.save(1);
  for (int32_t cut : {1, 20, 39, 41}) {
    const std::string why = a.truncate_refusal(1, cut);
    EXPECT_NE(why.find("layer 1"), std::string::npos) << cut << ": " << why;
    EXPECT_NE(why.find("one append"), std::string::npos) << cut << ": " << why;
  }
  for (int32_t cut : {0, 40, 42, 43}) EXPECT_EQ(a.truncate_refusal(1, cut), "") << cut;
  SpindleKvRepresentation same(geometry(), policy());
  same.restore(1, before);
  expect_same_records(a, same, 1);
}

TEST(SpindleKvRepr, AfterARestoreOnlyNewerAppendsCanGo) {
  // A snapshot does not record which rows were encoded together: the restored rows stay (or all
  // go), the rows appended since follow the usual rule.
  const Feed feed;
  SpindleKvRepresentation a(geometry(), policy());
  feed(a, 0, 0, 30);
  for (size_t t = 30; t < 34; ++t) feed(a, 0, t, 1);
  SpindleKvRepresentation b(geometry(), policy());
  b.restore(0, a.save(0));
  EXPECT_EQ(a.truncate_refusal(0, 32), "");
  EXPECT_NE(b.truncate_refusal(0, 32).find("snapshot"), std::string::npos);
  for (size_t t = 34; t < 36; ++t) feed(b, 0, t, 1);
  feed(b, 0, 36, 10);
  EXPECT_NE(b.truncate_refusal(0, 40), "");
  EXPECT_EQ(b.truncate_refusal(0, 36), "");
  EXPECT_EQ(b.truncate_refusal(0, 34), "");
  b.truncate(0, 34);
  SpindleKvRepresentation c(geometry(), policy());
  c.restore(0, a.save(0));
  expect_same_records(b, c, 0);
  EXPECT_EQ(b.truncate_refusal(0, 0), "");
}

TEST(SpindleKvRepr, ALongAppendCanBeCutBetweenItsPrefillBlocks) {
  // A long append is encoded block by block (kSpindlePrefillBlock rows each), every block as an
  // append of its own would be: a cut between two blocks is exact, one inside a block is not.
  const size_t n = cpu::kSpindlePrefillBlock + 6;
  const std::vector<int32_t> pos = kvsdk_test::iota_positions(n);
  const std::vector<float> k = clustered(n, 61, &pos), v = clustered(n, 62, nullptr);
  const std::vector<float> k0 = head(k, 0), v0 = head(v, 0);
  cpu::SpindleHeadStore a(kDim, 10000.0f, KVSDK_ROPE_HALF), b(kDim, 10000.0f, KVSDK_ROPE_HALF);
  a.append(k0.data(), v0.data(), pos.data(), n);
  b.append(k0.data(), v0.data(), pos.data(), cpu::kSpindlePrefillBlock);
  const int32_t block = int32_t(cpu::kSpindlePrefillBlock);
  EXPECT_NE(a.removal_refusal(block + 3), nullptr);
  EXPECT_NE(a.removal_refusal(block - 1), nullptr);
  ASSERT_EQ(a.removal_refusal(block), nullptr);
  a.remove_from(block);
  EXPECT_EQ(a.positions(), b.positions());
  EXPECT_EQ(a.keys().entry_data(), b.keys().entry_data());
  EXPECT_EQ(a.keys().index(), b.keys().index());
  EXPECT_EQ(a.keys().magnitude(), b.keys().magnitude());
  EXPECT_EQ(a.values().entry_data(), b.values().entry_data());
  EXPECT_EQ(a.values().index(), b.values().index());
  EXPECT_EQ(a.values().magnitude(), b.values().magnitude());
  EXPECT_EQ(a.bytes().total(), b.bytes().total());
}

}  // namespace
