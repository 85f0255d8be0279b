// The positions contract (kvsdk.h, KVSDK_MAX_POSITION): every position a caller passes (keys to
// append, queries to attend, observe or prefetch, a planner's keys and queries) lies in
// 0..KVSDK_MAX_POSITION, a query's may also be INT32_MAX (no position: it sees every key, as
// with q_positions NULL); anything else is refused with KVSDK_E_INVALID_ARG naming its index and
// value, and the call changes nothing. Positions need not increase and may repeat.
// At the very top of the range every policy works end to end: append, attend, observe,
// prefetch, save, journal delta, load, attend (under the asan preset: without UBSan reports).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../formats/snapshot_test_util.h"
#include "kvsdk.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

const char* const kPresets[] = {
    "full",      "streaming_llm", "h2o",          "snapkv",    "pyramidkv",       "xkv",
    "kivi",      "spindlekv",     "minicache",    "smallkv",   "specache",        "snapkv+kivi2",
    "h2o+kivi4", "xkv+kivi2",     "minicache+kivi4", "specache+kivi1", "kivi+kivi1"};

static_assert(KVSDK_MAX_POSITION == INT32_MAX - 1, "the documented value");

kvsdk_geometry geometry() { return make_geometry(4, 8, 2, 32); }

kvsdk_policy preset(const std::string& spec) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec.c_str()), KVSDK_OK) << kvsdk_last_error();
  p.quant_group = 8;
  p.quant_residual = 16;
  return p;
}

bool is_specache(const std::string& spec) { return spec.rfind("specache", 0) == 0; }

// Appends the tokens at `pos` to `layer`; the status.
kvsdk_status append(kvsdk_cache* c, const kvsdk_geometry& g, uint32_t layer,
                    const std::vector<int32_t>& pos, uint32_t seed) {
  const size_t elems = pos.size() * g.n_kv_heads * g.head_dim;
  const auto k = random_floats(elems, seed * 131 + layer * 2);
  const auto v = random_floats(elems, seed * 131 + layer * 2 + 1);
  return kvsdk_cache_append(c, layer, pos.size(), k.data(), v.data(), pos.data(), elems * 4);
}

// Per layer: attention of queries at `qpos` (and, for window methods and h2o, observe them
// first; SpeCache: prefetch with the last one); every output byte.
std::vector<float> attend_all(kvsdk_cache* c, const kvsdk_geometry& g, const std::string& spec,
                              const std::vector<int32_t>& qpos, uint32_t seed) {
  std::vector<float> all;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const size_t nq = qpos.size(), elems = nq * g.n_q_heads * g.head_dim;
    const auto q = random_floats(elems, seed * 7 + l);
    EXPECT_EQ(kvsdk_cache_observe(c, l, nq, q.data(), qpos.data(), elems * 4), KVSDK_OK)
        << kvsdk_last_error();
    if (is_specache(spec)) {
      const size_t one = g.n_q_heads * g.head_dim;
      EXPECT_EQ(kvsdk_cache_prefetch(c, l, 1, q.data() + (nq - 1) * one, &qpos.back(), one * 4),
                KVSDK_OK)
          << kvsdk_last_error();
    }
    std::vector<float> out(elems);
    EXPECT_EQ(kvsdk_cache_attend(c, l, nq, q.data(), qpos.data(), elems * 4, out.data(), elems * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

class Positions : public ::testing::TestWithParam<const char*> {
 protected:
  CachePtr make(kvsdk_context* ctx) {
    const kvsdk_policy p = preset(GetParam());
    CachePtr c = make_cache(ctx, g_, &p);
    EXPECT_TRUE(c) << kvsdk_last_error();
    return c;
  }
  kvsdk_geometry g_ = geometry();
};

// Key positions outside the contract, and query positions (for which INT32_MAX is valid).
const int32_t kOutside[] = {-1, INT32_MIN, KVSDK_MAX_POSITION + 1};
const int32_t kOutsideQueries[] = {-1, INT32_MIN};

TEST_P(Positions, AppendRefusesPositionsOutsideTheContractAndChangesNothing) {
  auto ctx = make_context();
  auto c = make(ctx.get());
  ASSERT_TRUE(c);
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    ASSERT_EQ(append(c.get(), g_, l, iota_positions(20, 0), 1), KVSDK_OK) << kvsdk_last_error();
  }
  const std::vector<unsigned char> before = save_buffer(c.get());
  for (int32_t bad : kOutside) {
    for (uint32_t l : {0u, 3u}) {
      std::vector<int32_t> pos = iota_positions(4, 20);
      pos[2] = bad;
      EXPECT_EQ(append(c.get(), g_, l, pos, 2), KVSDK_E_INVALID_ARG) << "position " << bad;
      const std::string err = kvsdk_last_error();
      EXPECT_NE(err.find("positions[2]"), std::string::npos) << err;
      EXPECT_NE(err.find(std::to_string(bad)), std::string::npos) << err;
      EXPECT_EQ(save_buffer(c.get()), before) << "a refused append changed the cache";
    }
  }
  // The cache goes on as if nothing happened.
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    ASSERT_EQ(append(c.get(), g_, l, iota_positions(4, 20), 2), KVSDK_OK) << kvsdk_last_error();
  }
  attend_all(c.get(), g_, GetParam(), {22, 23}, 3);
}

TEST_P(Positions, QueryPositionsOutsideTheContractAreRefused) {
  auto ctx = make_context();
  auto c = make(ctx.get());
  ASSERT_TRUE(c);
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    ASSERT_EQ(append(c.get(), g_, l, iota_positions(20, 0), 1), KVSDK_OK) << kvsdk_last_error();
  }
  const std::vector<unsigned char> before = save_buffer(c.get());
  const size_t nq = 2, elems = nq * g_.n_q_heads * g_.head_dim, one = g_.n_q_heads * g_.head_dim;
  const auto q = random_floats(elems, 4);
  for (int32_t bad : kOutsideQueries) {
    const std::vector<int32_t> qpos = {19, bad};
    std::vector<float> out(elems, 7.0f);
    EXPECT_EQ(kvsdk_cache_attend(c.get(), 1, nq, q.data(), qpos.data(), elems * 4, out.data(),
                                 elems * 4),
              KVSDK_E_INVALID_ARG);
    std::string err = kvsdk_last_error();
    EXPECT_NE(err.find("q_positions[1]"), std::string::npos) << err;
    EXPECT_NE(err.find(std::to_string(bad)), std::string::npos) << err;
    EXPECT_EQ(out, std::vector<float>(elems, 7.0f)) << "out written on error";
    EXPECT_EQ(kvsdk_cache_observe(c.get(), 1, nq, q.data(), qpos.data(), elems * 4),
              KVSDK_E_INVALID_ARG);
    err = kvsdk_last_error();
    EXPECT_NE(err.find("q_positions[1]"), std::string::npos) << err;
    if (is_specache(GetParam())) {
      EXPECT_EQ(kvsdk_cache_prefetch(c.get(), 1, 1, q.data(), &qpos[1], one * 4),
                KVSDK_E_INVALID_ARG);
      err = kvsdk_last_error();
      EXPECT_NE(err.find("q_positions[0]"), std::string::npos) << err;
      EXPECT_NE(err.find(std::to_string(bad)), std::string::npos) << err;
    }
    EXPECT_EQ(save_buffer(c.get()), before) << "a refused call changed the cache";
  }
}

TEST_P(Positions, AQueryAtInt32MaxIsAQueryWithoutAPosition) {
  const std::string spec = GetParam();
  auto ctx = make_context();
  auto a = make(ctx.get()), b = make(ctx.get());
  ASSERT_TRUE(a && b);
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    ASSERT_EQ(append(a.get(), g_, l, iota_positions(20, 0), 1), KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(append(b.get(), g_, l, iota_positions(20, 0), 1), KVSDK_OK) << kvsdk_last_error();
  }
  const size_t nq = 2, elems = nq * g_.n_q_heads * g_.head_dim, one = g_.n_q_heads * g_.head_dim;
  const std::vector<int32_t> unpositioned = {INT32_MAX, INT32_MAX};
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    const auto q = random_floats(elems, 6 + l);
    ASSERT_EQ(kvsdk_cache_observe(a.get(), l, nq, q.data(), unpositioned.data(), elems * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_observe(b.get(), l, nq, q.data(), nullptr, elems * 4), KVSDK_OK)
        << kvsdk_last_error();
    if (is_specache(spec)) {
      ASSERT_EQ(kvsdk_cache_prefetch(a.get(), l, 1, q.data(), unpositioned.data(), one * 4),
                KVSDK_OK)
          << kvsdk_last_error();
      ASSERT_EQ(kvsdk_cache_prefetch(b.get(), l, 1, q.data(), nullptr, one * 4), KVSDK_OK)
          << kvsdk_last_error();
    }
    std::vector<float> out_a(elems), out_b(elems);
    ASSERT_EQ(kvsdk_cache_attend(a.get(), l, nq, q.data(), unpositioned.data(), elems * 4,
                                 out_a.data(), elems * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    ASSERT_EQ(kvsdk_cache_attend(b.get(), l, nq, q.data(), nullptr, elems * 4, out_b.data(),
                                 elems * 4),
              KVSDK_OK)
        << kvsdk_last_error();
    EXPECT_EQ(out_a, out_b) << "layer " << l;
  }
  EXPECT_EQ(save_buffer(a.get()), save_buffer(b.get()));
}

TEST_P(Positions, TheTopOfTheRangeWorksEndToEnd) {
  const std::string spec = GetParam();
  TempDir dir;
  auto ctx = make_context();
  auto a = make(ctx.get());
  ASSERT_TRUE(a);
  const int32_t top = KVSDK_MAX_POSITION;
  // 40 tokens ending two below the top (runs of consecutive positions: SpindleKV's RoPE steps
  // from one to the next), attended at the top.
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    ASSERT_EQ(append(a.get(), g_, l, iota_positions(40, top - 41), 1), KVSDK_OK)
        << kvsdk_last_error();
  }
  attend_all(a.get(), g_, spec, {top - 3, top}, 2);
  const std::string path = dir.file("top.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  // The last two positions of the range, then the top once more (positions may repeat).
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    ASSERT_EQ(append(a.get(), g_, l, {top - 1, top}, 3), KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(append(a.get(), g_, l, {top}, 4), KVSDK_OK) << kvsdk_last_error();
  }
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g_, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(raw);
  EXPECT_EQ(info.journal_frames_applied, 1u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  // Every held position is in the range, the top included.
  bool saw_top = false;
  for (uint32_t l = 0; l < g_.n_layers; ++l) {
    size_t n = 0;
    ASSERT_EQ(kvsdk_cache_read(b.get(), l, 0, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
    std::vector<int32_t> pos(n);
    ASSERT_EQ(kvsdk_cache_read(b.get(), l, 0, nullptr, nullptr, pos.data(), n, &n), KVSDK_OK);
    for (int32_t p : pos) {
      EXPECT_GE(p, top - 41);
      saw_top = saw_top || p == top;
    }
  }
  EXPECT_TRUE(saw_top);
  // Both continue identically at the top.
  const auto out_a = attend_all(a.get(), g_, spec, {top - 1, top}, 5);
  const auto out_b = attend_all(b.get(), g_, spec, {top - 1, top}, 5);
  EXPECT_EQ(out_a, out_b);
  for (float x : out_a) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(Presets, Positions, ::testing::ValuesIn(kPresets),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& ch : s) {
                             if (ch == '+') ch = '_';
                           }
                           return s;
                         });

TEST(PlannerPositions, PositionsOutsideTheContractAreRefused) {
  const kvsdk_geometry g = geometry();
  const kvsdk_policy p = preset("xkv");
  kvsdk_planner* raw = nullptr;
  ASSERT_EQ(kvsdk_planner_create(&raw, &g, &p), KVSDK_OK) << kvsdk_last_error();
  std::unique_ptr<kvsdk_planner, void (*)(kvsdk_planner*)> planner(raw, kvsdk_planner_destroy);
  const size_t n = 8, nq = 2;
  const auto k = random_floats(n * g.n_kv_heads * g.head_dim, 1);
  const auto q = random_floats(nq * g.n_q_heads * g.head_dim, 2);
  for (int32_t bad : kOutside) {
    std::vector<int32_t> pos = iota_positions(n, 0);
    const std::vector<int32_t> qpos = {6, 7};
    pos[5] = bad;
    EXPECT_EQ(kvsdk_planner_feed_layer(planner.get(), 0, n, k.data(), pos.data(), k.size() * 4, nq,
                                       q.data(), qpos.data(), q.size() * 4),
              KVSDK_E_INVALID_ARG);
    const std::string err = kvsdk_last_error();
    EXPECT_NE(err.find("positions[5]"), std::string::npos) << err;
  }
  for (int32_t bad : kOutsideQueries) {
    const std::vector<int32_t> pos = iota_positions(n, 0), qpos = {6, bad};
    EXPECT_EQ(kvsdk_planner_feed_layer(planner.get(), 0, n, k.data(), pos.data(), k.size() * 4, nq,
                                       q.data(), qpos.data(), q.size() * 4),
              KVSDK_E_INVALID_ARG);
    const std::string err = kvsdk_last_error();
    EXPECT_NE(err.find("q_positions[1]"), std::string::npos) << err;
  }
  // At the top of the range the planner works.
  const int32_t top = KVSDK_MAX_POSITION;
  const std::vector<int32_t> pos = iota_positions(n, top - int32_t(n) + 1), qpos = {top - 1, top};
  EXPECT_EQ(kvsdk_planner_feed_layer(planner.get(), 0, n, k.data(), pos.data(), k.size() * 4, nq,
                                     q.data(), qpos.data(), q.size() * 4),
            KVSDK_OK)
      << kvsdk_last_error();
}

}  // namespace
