// The CUDA table's SpeCache entries over device buffers (what a device SpeCache store calls: one
// KV head's low-bit copy as a KIVI tier and its residual rows, the fetched full-precision rows
// and their tokens) against the CPU reference backend's entries over the same bytes on the host
// (the oracle), on every KIVI bit width, head dims 64/128/256, GQA groups 1-8, full and ragged
// key blocks (G 32 and 24), with and without residual rows, fetched tokens in both parts of the
// copy or none, and query rows that see everything, a prefix or nothing:
//  - attend_specache_tier: the split-K kernel with the fetched tokens excluded from both tiers
//    and the fetched rows as a third tier, within 2e-4 absolute (the decode kernel's tolerance in
//    cuda_decode_attention_test.cpp: f32 sums in another order, expf). The fetched rows differ
//    from the low-bit ones by far more than that, so attending a fetched token twice (exclusion
//    ignored) or not at full precision (fetched tier dropped) fails;
//  - specache_scores_tier: cuda_column_sums.h's key_scores, the reference's bits (memcmp),
//    -inf included;
//  - specache_select_tier / specache_shares_tier: the selection and the hit rate's share on the
//    device, the reference's tokens, probabilities and shares bit for bit.
// Also: decode_attention refuses an exclusion list over rows that are not shared.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "cuda_decode_attention.h"
#include "cuda_ops.h"
#include "cuda_specache_select.h"
#include "cuda_test_util.h"
#include "kivi_store.h"
#include "specache.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

using test::DeviceBuffer;
using test::some;

struct Case {
  size_t dim, group;
  uint32_t bits;
};

// One KV head's SpeCache buffers, on the host and on the device.
struct SpeCacheHead {
  cpu::KiviHeadStore store;
  bool with_residual;
  std::vector<uint32_t> starts;     // each key block's first quantized token
  std::vector<uint32_t> fetched;    // fetched tokens (ascending, into the copy)
  std::vector<uint16_t> fk, fv;     // their full-precision rows
  std::vector<int32_t> fpos;        // their positions in the copy
  size_t nq() const { return store.quantized_tokens(); }
  size_t nr() const { return with_residual ? store.residual_tokens() : 0; }

  SpeCacheHead(const Case& c, uint32_t G, bool ragged, bool residual, bool with_fetch)
      : store(c.dim, cpu::KiviConfig{c.bits, G, 64}), with_residual(residual) {
    const size_t n = 300;
    const auto kf = test::random_floats(n * c.dim, 50);
    const auto vf = test::random_floats(n * c.dim, 51);
    std::vector<int32_t> pos(n);
    for (size_t t = 0; t < n; ++t) pos[t] = int32_t(2 * t);
    store.append(kf.data(), vf.data(), pos.data(), n);
    if (ragged) {  // every third token and all of the second block go
      std::vector<uint32_t> keep;
      for (uint32_t t = 0; t < n; ++t) {
        if (t % 3 != 1 && (t < G || t >= 2 * G)) keep.push_back(t);
      }
      store.retain(keep);
    }
    uint32_t start = 0;
    for (uint32_t b : store.block_token_counts()) starts.push_back(start), start += b;
    if (!with_fetch) return;
    // Full-precision rows unlike the low-bit ones (other random values).
    const size_t copy = nq() + nr();
    const auto fkf = test::random_floats(copy * c.dim, 52);
    const auto fvf = test::random_floats(copy * c.dim, 53);
    for (uint32_t t = 2; t < copy; t += 11) {
      fetched.push_back(t);
      fpos.push_back(store.positions()[t]);
      for (size_t d = 0; d < c.dim; ++d) {
        fk.push_back(f32_to_f16(fkf[t * c.dim + d]));
        fv.push_back(f32_to_f16(fvf[t * c.dim + d]));
      }
    }
  }
};

// The head's buffers as the table's arguments, pointing at host or device copies.
struct Args {
  backend::KiviTier tier;
  backend::F16Rows residual, fetched;
  const uint32_t* fetched_tokens = nullptr;
};

Args host_args(const SpeCacheHead& h) {
  const cpu::KiviHeadStore& s = h.store;
  Args a;
  a.tier.k_codes = s.key_codes().data(), a.tier.v_codes = s.value_codes().data();
  a.tier.k_scale = s.key_scales().data(), a.tier.k_zero = s.key_zeros().data();
  a.tier.v_scale = s.value_scales().data(), a.tier.v_zero = s.value_zeros().data();
  a.tier.positions = s.positions().data(), a.tier.tokens = h.nq();
  a.tier.bits = s.config().bits, a.tier.group = s.config().group;
  a.tier.residual = s.config().residual;
  if (s.ragged()) a.tier.block_starts = h.starts.data(), a.tier.blocks = h.starts.size();
  a.residual = {s.residual_keys().data(), s.residual_values().data(),
                s.positions().data() + h.nq(), h.nr()};
  a.fetched = {h.fk.data(), h.fv.data(), h.fpos.data(), h.fetched.size()};
  a.fetched_tokens = h.fetched.data();
  return a;
}

// The same buffers uploaded (kept alive by the object).
struct DeviceHead {
  DeviceBuffer<uint8_t> kc, vc;
  DeviceBuffer<uint16_t> ks, kz, vs, vz, rk, rv, fk, fv;
  DeviceBuffer<int32_t> qpos, rpos, fpos;
  DeviceBuffer<uint32_t> starts, tokens;
  Args args;
  explicit DeviceHead(const SpeCacheHead& h)
      : kc(some(h.store.key_codes())), vc(some(h.store.value_codes())),
        ks(some(h.store.key_scales())), kz(some(h.store.key_zeros())),
        vs(some(h.store.value_scales())), vz(some(h.store.value_zeros())),
        rk(some(h.store.residual_keys())), rv(some(h.store.residual_values())),
        fk(some(h.fk)), fv(some(h.fv)),
        qpos(some(std::vector<int32_t>(h.store.positions().begin(),
                                       h.store.positions().begin() + ptrdiff_t(h.nq())))),
        rpos(some(std::vector<int32_t>(h.store.positions().begin() + ptrdiff_t(h.nq()),
                                       h.store.positions().end()))),
        fpos(some(h.fpos)), starts(some(h.starts)), tokens(some(h.fetched)) {
    args = host_args(h);
    args.tier.k_codes = kc.get(), args.tier.v_codes = vc.get();
    args.tier.k_scale = ks.get(), args.tier.k_zero = kz.get();
    args.tier.v_scale = vs.get(), args.tier.v_zero = vz.get();
    args.tier.positions = qpos.get();
    if (args.tier.block_starts) args.tier.block_starts = starts.get();
    args.residual.k = rk.get(), args.residual.v = rv.get(), args.residual.positions = rpos.get();
    args.fetched.k = fk.get(), args.fetched.v = fv.get(), args.fetched.positions = fpos.get();
    args.fetched_tokens = tokens.get();
  }
};

// Three tokens' query heads: one sees everything, one the copy up to its middle token, one
// nothing (before every position).
struct Queries {
  std::vector<float> q;
  std::vector<int32_t> pos;
  backend::QueryRows rows(const Case& c) const {
    backend::QueryRows r{q.data(), pos.data(), pos.size(), c.dim, 1.0f / std::sqrt(float(c.dim))};
    r.group = c.group;
    return r;
  }
};
Queries make_queries(const Case& c, const SpeCacheHead& h) {
  Queries qs;
  const size_t copy = h.nq() + h.nr();
  for (int32_t p : {INT32_MAX, h.store.positions()[copy / 2], -1}) {
    qs.pos.insert(qs.pos.end(), c.group, p);
  }
  qs.q = test::random_floats(qs.pos.size() * c.dim, 54);
  return qs;
}

std::string name(uint32_t G, bool ragged, bool residual, bool fetch) {
  return "G " + std::to_string(G) + (ragged ? " ragged" : "") +
         (residual ? " residual" : " no residual") + (fetch ? " fetched" : " none fetched");
}

class CudaSpeCacheTier : public ::testing::TestWithParam<Case> {};

TEST_P(CudaSpeCacheTier, AttentionMatchesTheReferenceBackend) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  for (uint32_t G : {32u, 24u})
  for (bool ragged : {false, true})
  for (bool residual : {true, false})
  for (bool fetch : {true, false}) {
    SCOPED_TRACE(name(G, ragged, residual, fetch));
    const SpeCacheHead h(c, G, ragged, residual, fetch);
    ASSERT_EQ(h.store.ragged(), ragged);
    ASSERT_GT(h.nq(), 0u);
    if (fetch) {  // fetched tokens in the quantized part, and in the residual
      ASSERT_LT(h.fetched.front(), h.nq());
      if (residual) ASSERT_GE(h.fetched.back(), h.nq());
    }
    const Queries qs = make_queries(c, h);
    const size_t out_size = qs.q.size();
    const Args host = host_args(h);
    std::vector<float> want(out_size), plain(out_size);
    backend::WorkspaceHandle ref_ws(ref);
    ref.attend_specache_tier(qs.rows(c), host.tier, host.residual, host.fetched,
                             host.fetched_tokens, ref_ws.get(), want.data());
    // The fetched rows matter far beyond the tolerance (so neither half of the substitution can
    // be lost unnoticed).
    ref.attend_kivi_tier(qs.rows(c), host.tier, host.residual, ref_ws.get(), plain.data());
    float moved = 0.0f;
    for (size_t i = 0; i < out_size; ++i) moved = std::max(moved, std::fabs(want[i] - plain[i]));
    if (fetch) ASSERT_GT(moved, 1e-2f);

    const DeviceHead d(h);
    DeviceBuffer<float> dq(qs.q), dout(std::vector<float>(out_size, NAN));
    DeviceBuffer<int32_t> dpos(qs.pos);
    backend::QueryRows got_q = qs.rows(c);
    got_q.q = dq.get(), got_q.positions = dpos.get();
    backend::WorkspaceHandle ws(ops);
    ops.attend_specache_tier(got_q, d.args.tier, d.args.residual, d.args.fetched,
                             d.args.fetched_tokens, ws.get(), dout.get());
    const std::vector<float> got = dout.download();
    for (size_t i = 0; i < out_size; ++i) ASSERT_NEAR(got[i], want[i], 2e-4) << "element " << i;
    for (size_t i = 2 * c.group * c.dim; i < out_size; ++i) ASSERT_EQ(got[i], 0.0f);  // sees none
  }
}

TEST_P(CudaSpeCacheTier, ScoresAreTheReferenceBackendsBits) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  for (uint32_t G : {32u, 24u})
  for (bool ragged : {false, true})
  for (bool residual : {true, false})
  for (bool positions : {true, false}) {  // without query positions every key is seen
    SCOPED_TRACE(name(G, ragged, residual, false) + (positions ? "" : " no query positions"));
    const SpeCacheHead h(c, G, ragged, residual, false);
    const Queries qs = make_queries(c, h);
    const size_t n = h.nq() + h.nr(), rows = qs.pos.size();
    const Args host = host_args(h);
    backend::QueryRows want_q = qs.rows(c);
    if (!positions) want_q.positions = nullptr;
    std::vector<float> want(rows * n, NAN);
    backend::WorkspaceHandle ref_ws(ref);
    ref.specache_scores_tier(want_q, host.tier, host.residual, ref_ws.get(), want.data());
    size_t masked = 0;
    for (float s : want) masked += std::isinf(s) && s < 0;
    if (positions) {
      ASSERT_GE(masked, c.group * n);  // the rows that see nothing at least
    } else {
      ASSERT_EQ(masked, 0u);
    }

    const DeviceHead d(h);
    DeviceBuffer<float> dq(qs.q), dscores(std::vector<float>(rows * n, NAN));
    DeviceBuffer<int32_t> dpos(qs.pos);
    backend::QueryRows got_q = want_q;
    got_q.q = dq.get();
    if (positions) got_q.positions = dpos.get();
    backend::WorkspaceHandle ws(ops);
    ops.specache_scores_tier(got_q, d.args.tier, d.args.residual, ws.get(), dscores.get());
    const std::vector<float> got = dscores.download();
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSpeCacheTier,
                         ::testing::Values(Case{128, 4, 2}, Case{128, 1, 1}, Case{64, 8, 4},
                                           Case{256, 2, 8}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return "dim" + std::to_string(c.dim) + "_group" +
                                  std::to_string(c.group) + "_bits" + std::to_string(c.bits);
                         });

// The selection and the hit rate's share where the scores are (cuda_specache_select.h) against
// the reference backend's own functions: specache_select_scored (cpu::specache_select_from_scores)
// gives the same tokens and averaged probabilities bit for bit (memcmp), specache_fetched_shares
// the same shares. Scores with masked tokens (-inf), a row that sees nothing, ties of equal
// scores (the lower index wins), k above the token count, and lengths that are not multiples of
// a block.
TEST(CudaSpeCacheSelect, TheReferenceBackendsTokensAndShares) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const backend::Ops& ref = backend::cpu_reference();
  const backend::Ops& ops = *device_backend().ops;
  uint32_t seed = 5;
  for (size_t group : {1u, 4u, 8u})
  for (size_t n : {1u, 37u, 300u, 1100u})
  for (size_t k : {1u, 16u, 2000u}) {
    SCOPED_TRACE("group " + std::to_string(group) + " n " + std::to_string(n) + " k " +
                 std::to_string(k));
    std::vector<float> scores = kvsdk_test::random_floats(group * n, seed++);
    for (size_t i = 0; i < scores.size(); ++i) {
      scores[i] *= 8.0f;
      if (i % 7 == 3) scores[i] = -INFINITY;   // masked tokens
      if (i % 11 == 5) scores[i] = 1.5f;       // ties
    }
    if (group > 1) std::fill_n(scores.begin() + ptrdiff_t(n), n, -INFINITY);  // sees nothing
    // The reference: the table's entry over a copy (it overwrites its scores).
    std::vector<float> work = scores, want_avg;
    std::vector<uint32_t> want;
    backend::WorkspaceHandle ref_ws(ref);
    ref.specache_select_scored(work.data(), group, n, k, ref_ws.get(), want, &want_avg);
    ASSERT_EQ(want.size(), std::min(k, n));

    DeviceBuffer<float> d_scores(scores);
    DeviceBuffer<uint32_t> d_tokens(std::max<size_t>(want.size(), 1));
    backend::WorkspaceHandle ws(ops);
    ops.specache_select_tier(d_scores.get(), group, n, k, ws.get(), d_tokens.get());
    std::vector<uint32_t> got = d_tokens.download();
    got.resize(want.size());
    EXPECT_EQ(got, want);
    // The exponentials it left in the scores are the reference's too.
    const std::vector<float> left = d_scores.download();
    ASSERT_EQ(std::memcmp(left.data(), work.data(), left.size() * sizeof(float)), 0);
    // And the averaged probabilities it ranked (the kernel's own entry, which hands them out).
    DeviceBuffer<float> d_again(scores), d_avg(n);
    DeviceBuffer<uint8_t> d_work(specache_select_work_bytes(group));
    specache_select_tokens(d_again.get(), group, n, k, d_work.get(), d_avg.get(), d_tokens.get(),
                           nullptr);
    const std::vector<float> avg = d_avg.download();
    ASSERT_EQ(want_avg.size(), n);
    ASSERT_EQ(std::memcmp(avg.data(), want_avg.data(), n * sizeof(float)), 0);

    // The share of each row's softmax on some tokens (the hit rate), scores unchanged.
    std::vector<uint32_t> fetched;
    for (uint32_t t = 0; t < n; t += 3) fetched.push_back(t);
    std::vector<float> want_shares(group);
    cpu::specache_fetched_shares(scores.data(), group, n, fetched, want_shares.data());
    DeviceBuffer<float> d_plain(scores), d_shares(group);
    DeviceBuffer<uint32_t> d_fetched(some(fetched));
    ops.specache_shares_tier(d_plain.get(), group, n, d_fetched.get(), fetched.size(),
                             d_shares.get());
    const std::vector<float> got_shares = d_shares.download();
    ASSERT_EQ(std::memcmp(got_shares.data(), want_shares.data(), group * sizeof(float)), 0);
    if (group > 1) EXPECT_EQ(got_shares[1], 0.0f) << "a row that sees nothing";
  }
}

// One exclusion list serves every head only when they read the same rows.
TEST(CudaSpeCacheTierArgs, ExclusionNeedsSharedRows) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  DecodeShape sh;
  sh.batch = 2, sh.kv_heads = 1, sh.group = 1, sh.dim = 64;
  const size_t tokens = 8;
  DeviceBuffer<uint16_t> k(std::vector<uint16_t>(2 * tokens * 64, 0x3c00)), v(k.size());
  v.upload(std::vector<uint16_t>(k.size(), 0x3c00));
  DeviceBuffer<uint32_t> list(std::vector<uint32_t>{1, 5});
  DeviceBuffer<float> q(std::vector<float>(2 * 64, 0.5f)), out(2 * 64);
  ExactTierView exact{k.get(), v.get(), tokens, tokens};
  exact.skip = TokenExclusion{list.get(), 2, 0};
  const DecodePlan plan = plan_decode(sh, 0, tokens, 64);
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  const auto status = [&] {
    try {
      decode_attention(q.get(), sh, nullptr, &exact, plan, ws.get(), out.get(), nullptr);
    } catch (const Error& e) {
      return e.status();
    }
    return KVSDK_OK;
  };
  EXPECT_EQ(status(), KVSDK_E_INVALID_ARG);
  sh.shared_rows = true;  // every sequence reads head 0's rows: one list fits
  EXPECT_EQ(status(), KVSDK_OK);
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kvsdk::cuda
