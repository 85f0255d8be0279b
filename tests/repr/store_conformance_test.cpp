// One conformance suite for every store (core/representation.h): each case is the same code for
// every store, driven only through the store interface (and, for deltas and budget refusals,
// through the C API of a cache of the corresponding policy). Per-store differences go through the
// interface's own capability queries (covers(), selects_rows(), prefetch_bound(),
// plan_eviction(), exact_rows()), never through the store's name.
//
// Stores: ExactRows ('full' row store), KIVI ('kivi' 2-bit, 'kivi+kivi4'), the KIVI overlay row
// store ('xkv+kivi2' via make_row_store), SpindleKV's codebooks, MiniCache ('minicache',
// 'minicache+kivi4'), SmallKV (with its proxy cache) and SpeCache ('specache', 'specache+kivi1').
//
// Cases:
//  1. append in chunks to every covered layer, then head_tokens/read: the appended positions in
//     order; read() equals read_host() converted.
//  2. attend() equals the CPU reference attention (cpu::OnlineAttention, one chunk) over exactly
//     the rows read() returns, bit for bit; after a prefetch too, for stores that prefetch.
//  3. bytes grow with every append, never by more than append_bound(); prefetch within
//     prefetch_bound().
//  4. eviction: plan_keep + drop_keep and plan_eviction + drop_eviction change nothing;
//     commit_keep keeps exactly the planned rows bit for bit; commit_eviction frees what the plan
//     said and keeps a subset of the rows.
//  5. save/restore into a fresh store: identical rows, bytes and attention, also after further
//     appends to both.
//  6. C API: save, append, save_delta, load: the loaded cache reads and attends bit-identically.
//  7. C API: an append one byte beyond the cache's budget is refused with KVSDK_E_BUDGET and
//     changes nothing (caches that evict make room within the budget); at the exact budget it fits.
//  8. restore() of records with any one field dropped throws KVSDK_E_CORRUPT.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attention.h"
#include "core/cache.h"
#include "core/context.h"
#include "core/geometry.h"
#include "core/method_traits.h"
#include "core/policy.h"
#include "core/representation.h"
#include "repr/smallkv_repr.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

using namespace kvsdk;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 32, kGroup = kQ / kKv;
// SmallKV's proxy: a smaller 'full' model holding the same tokens.
constexpr uint32_t kPQ = 2, kPKv = 1;
constexpr size_t kKvRow = size_t(kKv) * kDim;
// Chunk sizes of the appends before and after the point each case inspects (uneven on purpose:
// KIVI blocks (G = 8) and residual windows (R = 8) fill and flush at different places).
const std::vector<size_t> kSetupChunks = {5, 1, 17, 9, 32, 3};
const std::vector<size_t> kMoreChunks = {4, 11};

struct StoreCase {
  const char* name;  // test name suffix
  const char* spec;  // policy preset (kvsdk_policy_parse)
  bool row_store;    // make_row_store (the exact tier's store) instead of make_representation
};

const StoreCase kStores[] = {
    {"ExactRows_full", "full", true},
    {"Kivi2", "kivi", false},
    {"Kivi4", "kivi+kivi4", false},
    {"KiviRows_xkv_kivi2", "xkv+kivi2", true},
    {"SpindleKv", "spindlekv", false},
    {"MiniCache", "minicache", false},
    {"MiniCache_kivi4", "minicache+kivi4", false},
    {"SmallKv", "smallkv", false},
    {"SpeCache", "specache", false},
    {"SpeCache_kivi1", "specache+kivi1", false},
};

kvsdk_geometry c_geometry() { return kvsdk_test::make_geometry(kLayers, kQ, kKv, kDim, KVSDK_DTYPE_F16); }
Geometry geometry() {
  const kvsdk_geometry g = c_geometry();
  return Geometry::from_c(&g);
}
kvsdk_geometry c_proxy_geometry() {
  return kvsdk_test::make_geometry(kLayers, kPQ, kPKv, kDim, KVSDK_DTYPE_F32);
}

// The same parameters for every policy (each method ignores those it does not use): small KIVI
// blocks and windows so that a few dozen tokens quantize, a small SpeCache fetch, and SmallKV's
// matching longer than the runs (its heads match at the first eviction).
kvsdk_policy policy_of(const char* spec) {
  kvsdk_policy p;
  if (kvsdk_policy_parse(&p, spec) != KVSDK_OK) ADD_FAILURE() << "cannot parse " << spec;
  p.quant_group = 8;
  p.quant_residual = 8;
  p.fetch_tokens = 8;
  p.obs_window = 4;
  p.match_tokens = 128;
  return p;
}

// f16-representable values, so that the f32 interface (append) and the host's f16 rows
// (append_host, the C API) carry the same numbers.
std::vector<float> f16_exact(size_t n, uint32_t seed) {
  std::vector<float> x = kvsdk_test::random_floats(n, seed);
  for (float& f : x) f = f16_to_f32(f32_to_f16(f));
  return x;
}
std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
  return h;
}

// One append: n tokens of one layer (k, v [n][kKv][kDim]) and the proxy's rows of those tokens.
struct Chunk {
  size_t n = 0;
  std::vector<int32_t> pos;
  std::vector<float> k, v, pk, pv;
};

Chunk make_chunk(uint32_t layer, int32_t first, size_t n) {
  Chunk c;
  c.n = n;
  for (size_t i = 0; i < n; ++i) c.pos.push_back(first + int32_t(i));
  const uint32_t seed = 7919u * layer + 104729u * uint32_t(first) + uint32_t(n);
  c.k = f16_exact(n * kKvRow, seed);
  c.v = f16_exact(n * kKvRow, seed + 1);
  c.pk = f16_exact(n * kPKv * kDim, seed + 2);
  c.pv = f16_exact(n * kPKv * kDim, seed + 3);
  return c;
}

// Query rows of one KV head as attend() takes them: [n_queries * group][kDim], row r = query
// r / group of head r % group, with the query's position (one sees everything).
struct Queries {
  std::vector<float> rows;
  std::vector<int32_t> pos;
};
Queries make_queries(uint32_t layer, uint32_t kv_head, uint32_t salt = 0) {
  const std::vector<int32_t> qpos = {12, 50, std::numeric_limits<int32_t>::max()};
  Queries q;
  q.rows = f16_exact(qpos.size() * kGroup * kDim, 31u * layer + 17u * kv_head + 1000u * salt + 5);
  for (int32_t p : qpos) q.pos.insert(q.pos.end(), kGroup, p);
  return q;
}

std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  if (!x.empty()) std::memcpy(b.data(), x.data(), x.size() * 4);
  return b;
}

// A store and, for a store that needs one (SmallKV), its proxy cache, fed the same tokens.
struct Rig {
  StoreCase sc;
  Geometry g = geometry();
  kvsdk_policy p;
  std::unique_ptr<Representation> store;
  std::shared_ptr<Context> pctx;
  std::unique_ptr<Cache> proxy;
  int32_t next = 0;
  size_t chunk_index = 0;

  explicit Rig(const StoreCase& s, bool with_proxy = true) : sc(s), p(policy_of(s.spec)) {
    store = fresh();
    if (!store) return;
    if (with_proxy && method_traits(p).needs_proxy) {
      const kvsdk_geometry pg = c_proxy_geometry();
      pctx = std::make_shared<Context>(KVSDK_BACKEND_CPU, 0, 0);
      proxy = std::make_unique<Cache>(pctx, Geometry::from_c(&pg), policy_of("full"));
      dynamic_cast<SmallKvRepresentation&>(*store).set_proxy(proxy.get());
    }
  }
  // On the reference backend, so attend() must equal the reference over read()'s rows bit for
  // bit; backend_ops_test checks the optimized kernels against the reference ones.
  std::unique_ptr<Representation> fresh() const {
    auto s = sc.row_store ? make_row_store(g, p) : make_representation(g, p);
    if (s) s->set_ops(backend::cpu_reference());
    return s;
  }
  std::vector<uint32_t> covered() const {
    std::vector<uint32_t> c;
    for (uint32_t l = 0; l < kLayers; ++l) {
      if (store->covers(l)) c.push_back(l);
    }
    return c;
  }
  uint64_t total_bytes(const Representation& s) const {
    uint64_t t = 0;
    for (uint32_t l : covered()) t += s.layer_bytes(l);
    return t;
  }
  // Appends one chunk to `s` (and the proxy, when `s` is the rig's store), alternating the f32
  // interface and the host's f16 rows.
  void append_to(Representation& s, uint32_t layer, const Chunk& c, bool host) {
    if (proxy && &s == store.get()) {
      proxy->append(layer, c.n, c.pk.data(), c.pv.data(), c.pos.data());
    }
    if (host) {
      const std::vector<uint16_t> k = to_f16(c.k), v = to_f16(c.v);
      s.append_host(layer, c.n, k.data(), v.data(), c.pos.data());
    } else {
      s.append(layer, c.n, c.k.data(), c.v.data(), c.pos.data());
    }
  }
  // Appends chunks of these sizes to every covered layer (chunk by chunk, layer by layer) of the
  // store and of `twin` (if any); calls check(layer, chunk) around nothing, after each append.
  template <class Check>
  void drive(const std::vector<size_t>& sizes, Representation* twin, Check check) {
    for (size_t n : sizes) {
      const bool host = chunk_index++ % 2 == 1;
      for (uint32_t l : covered()) {
        const Chunk c = make_chunk(l, next, n);
        check(l, c, /*before=*/true);
        append_to(*store, l, c, host);
        if (twin) append_to(*twin, l, c, host);
        check(l, c, /*before=*/false);
      }
      next += int32_t(n);
    }
  }
  void drive(const std::vector<size_t>& sizes, Representation* twin = nullptr) {
    drive(sizes, twin, [](uint32_t, const Chunk&, bool) {});
  }
};

// What a store holds of one layer: bytes and, per KV head, rows (bits) and positions.
struct LayerState {
  uint64_t bytes = 0;
  std::vector<std::vector<uint32_t>> k, v;
  std::vector<std::vector<int32_t>> pos;
  bool operator==(const LayerState& o) const {
    return bytes == o.bytes && k == o.k && v == o.v && pos == o.pos;
  }
};

struct Rows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
Rows read_rows(const Representation& s, uint32_t l, uint32_t h) {
  Rows r;
  const size_t n = s.head_tokens(l, h);
  r.k.assign(n * kDim, std::numeric_limits<float>::quiet_NaN());
  r.v.assign(n * kDim, std::numeric_limits<float>::quiet_NaN());
  r.pos.assign(n, -1);
  s.read(l, h, r.k.data(), r.v.data(), r.pos.data());
  return r;
}

LayerState layer_state(const Representation& s, uint32_t l) {
  LayerState st;
  st.bytes = s.layer_bytes(l);
  for (uint32_t h = 0; h < kKv; ++h) {
    const Rows r = read_rows(s, l, h);
    st.k.push_back(bits(r.k));
    st.v.push_back(bits(r.v));
    st.pos.push_back(r.pos);
  }
  return st;
}

std::vector<LayerState> state(const Rig& rig, const Representation& s) {
  std::vector<LayerState> out;
  for (uint32_t l : rig.covered()) out.push_back(layer_state(s, l));
  return out;
}

std::vector<float> attend(const Representation& s, uint32_t l, uint32_t h, const Queries& q) {
  std::vector<float> out(q.rows.size(), std::numeric_limits<float>::quiet_NaN());
  s.attend(l, h, q.rows.data(), q.pos.data(), q.pos.size(), out.data());
  return out;
}

// The reference backend's attention over exactly the rows read() returns, in one chunk.
std::vector<float> reference(const Representation& s, uint32_t l, uint32_t h, const Queries& q) {
  const Rows r = read_rows(s, l, h);
  cpu::OnlineAttention att(q.rows.data(), q.pos.data(), q.pos.size(), kDim,
                           s.geometry().attn_scale);
  att.add_chunk(r.k.data(), r.v.data(), r.pos.data(), r.pos.size());
  std::vector<float> out(q.rows.size());
  att.finish(out.data());
  return out;
}

// Case 2 asks for bit-identity: every store feeds its rows (dequantized, reconstructed, fetched)
// to the same cpu::OnlineAttention, and with fewer rows than a store's attention chunk (256) and
// these deterministic rows the result equals one chunk of exactly the rows read() returns, bit for
// bit (tolerance 0). A store that attended over other rows than it reads back, or rounded them
// differently, differs in far more than the last bit.
void expect_matches_reference(const Representation& s, uint32_t l, uint32_t h, const Queries& q,
                              const std::string& what) {
  const std::vector<float> got = attend(s, l, h, q), want = reference(s, l, h, q);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(bits({got[i]}), bits({want[i]}))
        << what << ": layer " << l << " KV head " << h << ", element " << i << ": " << got[i]
        << " vs the reference " << want[i] << " over the rows read() returns";
  }
}

class StoreConformance : public ::testing::TestWithParam<StoreCase> {
 protected:
  void SetUp() override {
    rig_ = std::make_unique<Rig>(GetParam());
    ASSERT_TRUE(rig_->store) << GetParam().spec << " builds no store";
    ASSERT_FALSE(rig_->covered().empty());
  }
  Rig& rig() { return *rig_; }
  std::unique_ptr<Rig> rig_;
};

// 1. Every covered layer holds the appended positions in append order; read() and read_host()
// agree (read_host is the geometry's f16, read() converted).
TEST_P(StoreConformance, AppendThenReadGivesTheAppendedRows) {
  Rig& r = rig();
  std::vector<int32_t> want;
  r.drive(kSetupChunks);
  for (size_t i = 0; i < size_t(r.next); ++i) want.push_back(int32_t(i));
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (!r.store->covers(l)) continue;
    for (uint32_t h = 0; h < kKv; ++h) {
      SCOPED_TRACE("layer " + std::to_string(l) + " KV head " + std::to_string(h));
      ASSERT_EQ(r.store->head_tokens(l, h), want.size());
      const Rows rows = read_rows(*r.store, l, h);
      EXPECT_EQ(rows.pos, want);
      for (float x : rows.k) ASSERT_TRUE(std::isfinite(x));
      for (float x : rows.v) ASSERT_TRUE(std::isfinite(x));
      const size_t n = want.size();
      std::vector<uint16_t> hk(n * kDim), hv(n * kDim);
      std::vector<int32_t> hpos(n, -1);
      r.store->read_host(l, h, hk.data(), hv.data(), hpos.data());
      EXPECT_EQ(hpos, want);
      EXPECT_EQ(hk, to_f16(rows.k));
      EXPECT_EQ(hv, to_f16(rows.v));
      // Null outputs are skipped.
      std::vector<int32_t> only(n, -1);
      r.store->read(l, h, nullptr, nullptr, only.data());
      EXPECT_EQ(only, want);
    }
  }
}

// 2. attend() is the reference attention over the rows read() returns; for stores that prefetch
// (prefetch_bound > 0), also after a prefetch substituted full-precision rows.
TEST_P(StoreConformance, AttendEqualsReferenceOverReadRows) {
  Rig& r = rig();
  r.drive(kSetupChunks);
  for (uint32_t l : r.covered()) {
    for (uint32_t h = 0; h < kKv; ++h) {
      const Queries q = make_queries(l, h);
      expect_matches_reference(*r.store, l, h, q, "after appends");
      if (r.store->prefetch_bound(l, h) == 0) continue;
      const Queries spec = make_queries(l, h, 1);  // one speculative query: the group's rows
      const uint64_t before = r.store->layer_bytes(l), bound = r.store->prefetch_bound(l, h);
      r.store->prefetch(l, h, spec.rows.data(), spec.pos.data() + kGroup, kGroup);
      const uint64_t after = r.store->layer_bytes(l);
      EXPECT_LE(after - std::min(after, before), bound) << "prefetch grew past prefetch_bound";
      expect_matches_reference(*r.store, l, h, q, "after a prefetch");
    }
  }
  // One more chunk to the first covered layer only (MiniCache: rows waiting for the partner
  // layer, attended after the merged ones).
  const uint32_t first = r.covered().front();
  r.append_to(*r.store, first, make_chunk(first, r.next, 5), false);
  for (uint32_t h = 0; h < kKv; ++h) {
    expect_matches_reference(*r.store, first, h, make_queries(first, h), "after a lone append");
  }
}

// 3. Every append adds its tokens to every KV head of its layer, and the bytes of the covered
// layers change by no more than append_bound() (they may shrink: a KIVI flush quantizes f16
// residual rows, a MiniCache merge releases the partner's waiting rows). add_bytes adds into the
// caller's slots.
TEST_P(StoreConformance, BytesGrowWithinAppendBound) {
  Rig& r = rig();
  uint64_t before = 0, bound = 0, grown = 0;
  std::vector<size_t> tokens(kKv);
  size_t appends = 0;
  r.drive(kSetupChunks, nullptr, [&](uint32_t l, const Chunk& c, bool is_before) {
    if (is_before) {
      before = r.total_bytes(*r.store);
      bound = r.store->append_bound(l, c.n);
      for (uint32_t h = 0; h < kKv; ++h) tokens[h] = r.store->head_tokens(l, h);
      return;
    }
    const uint64_t after = r.total_bytes(*r.store);
    ++appends;
    for (uint32_t h = 0; h < kKv; ++h) {
      EXPECT_EQ(r.store->head_tokens(l, h), tokens[h] + c.n) << "layer " << l << " KV head " << h;
    }
    EXPECT_LE(after - std::min(after, before), bound)
        << "layer " << l << ": an append of " << c.n << " tokens grew " << after - before
        << " bytes, over its append_bound " << bound;
    if (after > before) grown += after - before;
    uint64_t t[KVSDK_TIER_SLOTS] = {};
    r.store->add_bytes(l, t);
    uint64_t again[KVSDK_TIER_SLOTS];
    std::copy(t, t + KVSDK_TIER_SLOTS, again);
    r.store->add_bytes(l, again);
    for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) EXPECT_EQ(again[i], 2 * t[i]);
  });
  EXPECT_EQ(appends, kSetupChunks.size() * r.covered().size());
  EXPECT_GT(grown, 0u);
  EXPECT_GT(r.total_bytes(*r.store), 0u);
}

// 4. Eviction plans change nothing until committed; commits do exactly what was planned.
TEST_P(StoreConformance, EvictionPlansChangeNothingUntilCommitted) {
  Rig& r = rig();
  r.drive(kSetupChunks);
  const std::vector<uint32_t> layers = r.covered();
  const std::vector<LayerState> held = state(r, *r.store);

  if (r.store->selects_rows()) {
    // Per KV head a different subset (the same count: a layer's heads hold as many rows).
    const uint32_t l = layers.front();
    const size_t n = r.store->head_tokens(l, 0);
    std::vector<std::vector<uint32_t>> keep(kKv);
    for (uint32_t h = 0; h < kKv; ++h) {
      for (uint32_t i = 0; i < n; ++i) {
        if ((i + h) % 3 != 0) keep[h].push_back(i);
      }
    }
    size_t fewest = n;
    for (const auto& k : keep) fewest = std::min(fewest, k.size());
    for (auto& k : keep) k.resize(fewest);
    for (uint32_t h = 1; h < kKv; ++h) ASSERT_EQ(keep[h].size(), keep[0].size());
    const uint64_t planned = r.store->plan_keep(l, keep, nullptr);
    EXPECT_TRUE(state(r, *r.store) == held) << "plan_keep changed the store";
    r.store->drop_keep();
    r.store->commit_keep();  // nothing planned any more: a no-op
    EXPECT_TRUE(state(r, *r.store) == held) << "drop_keep + commit_keep changed the store";
    EXPECT_EQ(r.store->plan_keep(l, keep, nullptr), planned);
    r.store->commit_keep();
    EXPECT_EQ(r.store->layer_bytes(l), planned) << "plan_keep's bytes differ from the commit's";
    for (uint32_t h = 0; h < kKv; ++h) {
      const Rows now = read_rows(*r.store, l, h);
      ASSERT_EQ(now.pos.size(), keep[h].size());
      const LayerState& was = held[0];
      for (size_t j = 0; j < keep[h].size(); ++j) {
        const size_t i = keep[h][j];
        EXPECT_EQ(now.pos[j], was.pos[h][i]);
        const std::vector<uint32_t> kb = bits(now.k), vb = bits(now.v);
        EXPECT_TRUE(std::equal(kb.begin() + long(j * kDim), kb.begin() + long((j + 1) * kDim),
                               was.k[h].begin() + long(i * kDim)))
            << "kept row " << i << " of KV head " << h << " changed its key bits";
        EXPECT_TRUE(std::equal(vb.begin() + long(j * kDim), vb.begin() + long((j + 1) * kDim),
                               was.v[h].begin() + long(i * kDim)))
            << "kept row " << i << " of KV head " << h << " changed its value bits";
      }
    }
    for (size_t i = 1; i < layers.size(); ++i) {
      EXPECT_TRUE(layer_state(*r.store, layers[i]) == held[i]) << "another layer changed";
    }
    // Kept rows plus incoming ones: the stored rows first, then the kept incoming rows.
    const Chunk in = make_chunk(l, r.next, 6);
    const std::vector<uint16_t> ik = to_f16(in.k), iv = to_f16(in.v);
    const Representation::IncomingRows incoming{ik.data(), iv.data(), in.pos.data(), in.n};
    const std::vector<LayerState> kept = state(r, *r.store);
    const size_t m = r.store->head_tokens(l, 0);
    std::vector<std::vector<uint32_t>> keep2(kKv, {0, 2, uint32_t(m), uint32_t(m + 3)});
    const uint64_t planned2 = r.store->plan_keep(l, keep2, &incoming);
    r.store->drop_keep();
    EXPECT_TRUE(state(r, *r.store) == kept) << "plan_keep with incoming rows changed the store";
    EXPECT_EQ(r.store->plan_keep(l, keep2, &incoming), planned2);
    r.store->commit_keep();
    EXPECT_EQ(r.store->layer_bytes(l), planned2);
    for (uint32_t h = 0; h < kKv; ++h) {
      const Rows now = read_rows(*r.store, l, h);
      const std::vector<int32_t> want = {kept[0].pos[h][0], kept[0].pos[h][2], in.pos[0],
                                         in.pos[3]};
      EXPECT_EQ(now.pos, want);
      expect_matches_reference(*r.store, l, h, make_queries(l, h), "after commit_keep");
    }
  } else {
    // Not a row store: the selection stage's calls are refused.
    EXPECT_THROW(r.store->plan_keep(layers.front(), {}, nullptr), Error);
  }

  // plan_eviction: stores that cannot evict plan nothing.
  const std::vector<LayerState> before = state(r, *r.store);
  const uint64_t total = r.total_bytes(*r.store);
  const uint64_t freed = r.store->plan_eviction(total / 2, Representation::kNoAppend, 0, nullptr);
  EXPECT_TRUE(state(r, *r.store) == before) << "plan_eviction changed the store";
  r.store->drop_eviction();
  r.store->commit_eviction();  // dropped: a no-op
  EXPECT_TRUE(state(r, *r.store) == before) << "a dropped eviction changed the store";
  EXPECT_EQ(r.store->plan_eviction(total / 2, Representation::kNoAppend, 0, nullptr), freed);
  r.store->commit_eviction();
  EXPECT_EQ(r.total_bytes(*r.store), total - freed) << "commit_eviction freed another amount";
  if (freed > 0) EXPECT_GE(freed, total / 2) << "an eviction that frees less than it could";
  const std::vector<LayerState> after = state(r, *r.store);
  for (size_t i = 0; i < layers.size(); ++i) {
    for (uint32_t h = 0; h < kKv; ++h) {
      // A subset of the rows, in order; each kept row keeps its value bits and either its key
      // bits or no key (a value-only row reads a zero key).
      const LayerState &b = before[i], &a = after[i];
      size_t at = 0;
      for (size_t j = 0; j < a.pos[h].size(); ++j) {
        while (at < b.pos[h].size() && b.pos[h][at] != a.pos[h][j]) ++at;
        ASSERT_LT(at, b.pos[h].size()) << "row at position " << a.pos[h][j] << " is not a "
                                       << "row held before, in order";
        const auto row = [&](const std::vector<uint32_t>& x, size_t t) {
          return std::vector<uint32_t>(x.begin() + long(t * kDim), x.begin() + long((t + 1) * kDim));
        };
        EXPECT_EQ(row(a.v[h], j), row(b.v[h], at));
        const std::vector<uint32_t> key = row(a.k[h], j);
        const bool zero = std::all_of(key.begin(), key.end(), [](uint32_t x) { return x == 0; });
        EXPECT_TRUE(key == row(b.k[h], at) || zero) << "kept row changed its key";
        ++at;
      }
    }
  }
}

// 5. Records (and exact row tables) restored into a fresh store give the same store, which
// continues identically.
TEST_P(StoreConformance, SaveRestoreIsBitIdenticalAndContinues) {
  Rig& r = rig();
  r.drive(kSetupChunks);
  if (r.store->selects_rows()) {  // also a store that lost rows (ragged KIVI blocks)
    for (uint32_t l : r.covered()) {
      const size_t n = r.store->head_tokens(l, 0);
      std::vector<std::vector<uint32_t>> keep(kKv);
      for (uint32_t i = 0; i < n; ++i) {
        if (i % 4 != 1) keep[0].push_back(i), keep[1].push_back(i);
      }
      r.store->plan_keep(l, keep, nullptr);
    }
    r.store->commit_keep();
  }
  std::unique_ptr<Representation> copy = r.fresh();
  for (uint32_t l : r.covered()) {
    copy->restore(l, r.store->save(l));
    if (r.store->exact_rows(l, 0)) {
      std::vector<ExactStore> heads;
      for (uint32_t h = 0; h < kKv; ++h) heads.push_back(*r.store->exact_rows(l, h));
      copy->restore_exact(l, std::move(heads));
    }
  }
  const auto same = [&](const char* when) {
    SCOPED_TRACE(when);
    EXPECT_TRUE(state(r, *r.store) == state(r, *copy)) << "rows, positions or bytes differ";
    EXPECT_EQ(copy->backing_bytes() > 0, r.store->backing_bytes() > 0);
    for (uint32_t l : r.covered()) {
      for (uint32_t h = 0; h < kKv; ++h) {
        EXPECT_EQ(copy->head_tokens(l, h), r.store->head_tokens(l, h));
        const Queries q = make_queries(l, h);
        EXPECT_EQ(bits(attend(*copy, l, h, q)), bits(attend(*r.store, l, h, q)))
            << "attention of layer " << l << " KV head " << h << " differs";
        EXPECT_EQ(copy->save(l).size(), r.store->save(l).size());
      }
    }
  };
  same("restored");
  r.drive(kMoreChunks, copy.get());
  same("after the same appends to both");
}

// 8. Any one field dropped from any record: restore() refuses the records as corrupt.
TEST_P(StoreConformance, RestoreOfRecordsMissingAFieldIsCorrupt) {
  Rig& r = rig();
  r.drive(kSetupChunks);
  size_t tried = 0;
  const auto expect_corrupt = [&](uint32_t l, const std::vector<TierRecord>& recs,
                                  const std::string& what) {
    std::unique_ptr<Representation> s = r.fresh();
    ++tried;
    try {
      s->restore(l, recs);
      ADD_FAILURE() << "layer " << l << ": restore accepted records " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), KVSDK_E_CORRUPT) << what << ": " << e.what();
    }
  };
  for (uint32_t l : r.covered()) {
    const std::vector<TierRecord> good = r.store->save(l);
    r.fresh()->restore(l, good);  // the intact records restore
    if (good.empty()) {
      // A store that saves no records (its rows travel as exact row tables) refuses any.
      TierRecord stray;
      stray.layer = l;
      stray.kind = "kivi.head";
      stray.set_scalar("quantized_tokens", 0);
      expect_corrupt(l, {stray}, "where it saves none");
      continue;
    }
    for (size_t i = 0; i < good.size(); ++i) {
      for (size_t f = 0; f < good[i].fields.size(); ++f) {
        std::vector<TierRecord> bad = good;
        bad[i].fields.erase(bad[i].fields.begin() + long(f));
        expect_corrupt(l, bad,
                       "without field '" + good[i].fields[f].name + "' of record " +
                           std::to_string(i) + " ('" + good[i].kind + "')");
      }
    }
  }
  EXPECT_GT(tried, 0u);
}

// ---- Through the C API: a cache of the store's policy ----------------------------------------

struct CacheRows {
  std::vector<std::vector<uint8_t>> heads;  // per layer and KV head: count, k, v, positions
  std::vector<std::vector<uint16_t>> attention;  // per layer
  kvsdk_cache_stats stats{};
};

template <class T>
void put(std::vector<uint8_t>& out, const T* p, size_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

// Every row of every layer and KV head, the attention of fixed queries on every layer, stats.
CacheRows observe(kvsdk_cache* c) {
  CacheRows o;
  const std::vector<int32_t> qpos = {12, 50, std::numeric_limits<int32_t>::max()};
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kKv; ++h) {
      size_t n = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      std::vector<uint16_t> k(n * kDim), v(n * kDim);
      std::vector<int32_t> pos(n);
      size_t got = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, k.data(), v.data(), pos.data(), n, &got), KVSDK_OK);
      std::vector<uint8_t> b;
      put(b, &got, 1);
      put(b, k.data(), k.size());
      put(b, v.data(), v.size());
      put(b, pos.data(), pos.size());
      o.heads.push_back(std::move(b));
    }
    const std::vector<uint16_t> q = to_f16(f16_exact(qpos.size() * kQ * kDim, 77 + l));
    std::vector<uint16_t> out(q.size());
    EXPECT_EQ(kvsdk_cache_attend(c, l, qpos.size(), q.data(), qpos.data(), q.size() * 2,
                                 out.data(), out.size() * 2),
              KVSDK_OK)
        << kvsdk_last_error();
    o.attention.push_back(std::move(out));
  }
  std::memset(&o.stats, 0, sizeof o.stats);
  o.stats.struct_size = sizeof o.stats;
  EXPECT_EQ(kvsdk_cache_stats_get(c, &o.stats), KVSDK_OK);
  return o;
}

void expect_same(const CacheRows& a, const CacheRows& b, bool with_context) {
  ASSERT_EQ(a.heads.size(), b.heads.size());
  for (size_t i = 0; i < a.heads.size(); ++i) {
    EXPECT_TRUE(a.heads[i] == b.heads[i])
        << "rows of layer " << i / kKv << " KV head " << i % kKv << " differ";
  }
  for (size_t l = 0; l < a.attention.size(); ++l) {
    EXPECT_TRUE(a.attention[l] == b.attention[l]) << "attention of layer " << l << " differs";
  }
  EXPECT_EQ(a.stats.tokens, b.stats.tokens);
  EXPECT_EQ(a.stats.appended_tokens, b.stats.appended_tokens);
  EXPECT_EQ(a.stats.bytes, b.stats.bytes);
  for (int i = 0; i < KVSDK_TIER_SLOTS; ++i) {
    EXPECT_EQ(a.stats.bytes_by_tier[i], b.stats.bytes_by_tier[i]) << "tier " << i;
  }
  EXPECT_EQ(a.stats.full_bytes, b.stats.full_bytes);
  EXPECT_EQ(a.stats.backing_bytes, b.stats.backing_bytes);
  if (with_context) EXPECT_EQ(a.stats.context_used_bytes, b.stats.context_used_bytes);
}

// A cache of the store's policy (and SmallKV's proxy), fed as the rig feeds its store.
struct Host {
  kvsdk_policy p;
  kvsdk_test::ContextPtr ctx, pctx;
  kvsdk_test::CachePtr cache, proxy;
  Host(const StoreCase& sc, uint64_t budget, bool with_proxy) : p(policy_of(sc.spec)) {
    ctx = kvsdk_test::make_context(budget);
    const kvsdk_geometry g = c_geometry();
    cache = kvsdk_test::make_cache(ctx.get(), g, &p);
    EXPECT_TRUE(cache) << sc.spec << ": " << kvsdk_last_error();
    if (cache && with_proxy && method_traits(p).needs_proxy) {
      pctx = kvsdk_test::make_context();
      proxy = kvsdk_test::make_cache(pctx.get(), c_proxy_geometry());
      EXPECT_EQ(kvsdk_cache_set_proxy(cache.get(), proxy.get()), KVSDK_OK);
    }
  }
  kvsdk_status append(uint32_t l, const Chunk& c) {
    if (proxy) {
      EXPECT_EQ(kvsdk_cache_append(proxy.get(), l, c.n, c.pk.data(), c.pv.data(), c.pos.data(),
                                   c.pk.size() * 4),
                KVSDK_OK);
    }
    const std::vector<uint16_t> k = to_f16(c.k), v = to_f16(c.v);
    return kvsdk_cache_append(cache.get(), l, c.n, k.data(), v.data(), c.pos.data(),
                              k.size() * 2);
  }
  uint64_t used() const {
    uint64_t u = 0;
    EXPECT_EQ(kvsdk_context_used_bytes(ctx.get(), &u), KVSDK_OK);
    return u;
  }
};

// Chunks appended to the given layers, as Rig::drive does; returns the next position.
int32_t feed(Host& h, const std::vector<uint32_t>& layers, const std::vector<size_t>& sizes,
             int32_t next) {
  for (size_t n : sizes) {
    for (uint32_t l : layers) {
      EXPECT_EQ(h.append(l, make_chunk(l, next, n)), KVSDK_OK) << kvsdk_last_error();
    }
    next += int32_t(n);
  }
  return next;
}

std::vector<uint32_t> all_layers() {
  std::vector<uint32_t> l(kLayers);
  for (uint32_t i = 0; i < kLayers; ++i) l[i] = i;
  return l;
}

// 6. save, append, save_delta, load: the loaded cache holds and attends bit-identically.
TEST_P(StoreConformance, DeltaJournalLoadsBitIdentical) {
  Host h(GetParam(), 0, /*with_proxy=*/false);
  ASSERT_TRUE(h.cache);
  const std::string path = ::testing::TempDir() + "kvsdk_conformance_" + GetParam().name + "_" +
                           std::to_string(getpid()) + ".kvsdk";
  int32_t next = feed(h, all_layers(), kSetupChunks, 0);
  ASSERT_EQ(kvsdk_cache_save(h.cache.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  next = feed(h, all_layers(), kMoreChunks, next);
  // Policies that prefetch substitute full-precision rows, which the delta must carry too.
  const std::vector<float> spec = f16_exact(kQ * kDim, 3);
  const std::vector<uint16_t> sq = to_f16(spec);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const kvsdk_status st = kvsdk_cache_prefetch(h.cache.get(), l, 1, sq.data(), &next,
                                                 sq.size() * 2);
    EXPECT_TRUE(st == KVSDK_OK || st == KVSDK_E_UNSUPPORTED) << kvsdk_last_error();
  }
  ASSERT_EQ(kvsdk_cache_save_delta(h.cache.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  kvsdk_cache* loaded = nullptr;
  kvsdk_load_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&loaded, h.ctx.get(), path.c_str(), nullptr, &info), KVSDK_OK)
      << kvsdk_last_error();
  kvsdk_test::CachePtr owned(loaded);
  std::remove(path.c_str());
  EXPECT_GT(info.journal_frames_applied, 0u);
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  expect_same(observe(h.cache.get()), observe(loaded), /*with_context=*/true);
}

// 7. With a budget one byte below what an append needs (the store's own append_bound() in the
// same state), the append is refused with KVSDK_E_BUDGET and changes nothing (rows, attention,
// stats, the context's charge); with that byte it fits. The budget is the cache's own
// (kvsdk_cache_set_budget after the setup appends: a context budget that tight would already
// refuse the setup, whose appends reserve their bounds). Caches that evict the layer (an
// evicting method's row store, or a store that plans evictions) make room instead, within the
// budget.
TEST_P(StoreConformance, BudgetRefusalLeavesCacheUnchanged) {
  Rig& r = rig();
  const std::vector<uint32_t> layers = r.covered();
  r.drive(kSetupChunks);
  const uint32_t target = layers.front();
  const Chunk next = make_chunk(target, r.next, 3);
  const uint64_t need = r.store->append_bound(target, next.n);
  ASSERT_GT(need, 0u);
  const bool evicts = (method_traits(r.p).evicts() && r.store->selects_rows()) ||
                      r.store->plan_eviction(1, Representation::kNoAppend, 0, nullptr) > 0;
  r.store->drop_eviction();

  const uint64_t held = r.total_bytes(*r.store);
  for (const uint64_t budget : {held + need - 1, held + need}) {
    SCOPED_TRACE("budget " + std::to_string(budget) + " = held " + std::to_string(held) +
                 " + need " + std::to_string(need) + (budget < held + need ? " - 1" : ""));
    Host h(GetParam(), 0, true);
    ASSERT_TRUE(h.cache);
    feed(h, layers, kSetupChunks, 0);
    ASSERT_EQ(h.used(), held) << "the cache charges other bytes than its store holds";
    ASSERT_EQ(kvsdk_cache_set_budget(h.cache.get(), budget), KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(h.used(), held);
    const CacheRows before = observe(h.cache.get());
    const kvsdk_status st = h.append(target, next);
    if (budget == held + need) {
      EXPECT_EQ(st, KVSDK_OK) << "the append does not fit its own bound: " << kvsdk_last_error();
    } else if (evicts) {
      EXPECT_EQ(st, KVSDK_OK) << "a cache that evicts refused: " << kvsdk_last_error();
      EXPECT_LE(h.used(), budget);
    } else {
      EXPECT_EQ(st, KVSDK_E_BUDGET) << kvsdk_status_str(st) << ": " << kvsdk_last_error();
      expect_same(before, observe(h.cache.get()), /*with_context=*/true);
      EXPECT_EQ(h.used(), held);
    }
  }
}

void PrintTo(const StoreCase& s, std::ostream* os) { *os << s.spec; }

std::string name_of(const ::testing::TestParamInfo<StoreCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(EveryStore, StoreConformance, ::testing::ValuesIn(kStores), name_of);

}  // namespace
