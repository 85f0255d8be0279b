// Decode attention on the device vs the CPU backend on the same stored data:
//  - exact tier vs cpu::OnlineAttention over the f16 rows;
//  - KIVI tier + exact residual (split-K partials of both tiers merged by the reduction kernel)
//    vs cpu::kivi_attend over a cpu::KiviHeadStore, whose buffers are uploaded unchanged (so the
//    test also proves the device reads the CPU's layout).
// Tolerance: 2e-4 absolute on outputs (values ~N(0,1); f32 sums in another order, expf).
#include "cuda_decode_attention.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <string>

#include "attention.h"
#include "backend_ops.h"
#include "cuda_ops.h"
#include "cuda_test_util.h"
#include "kivi_attention.h"
#include "kivi_store.h"
#include "util/error.h"
#include "util/half.h"

namespace kvsdk::cuda {
namespace {

using test::DeviceBuffer;

template <class T>
void append(std::vector<T>& dst, const std::vector<T>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

std::vector<float> run(const DecodeShape& sh, const std::vector<float>& q, const KiviTierView* kivi,
                       const ExactTierView* exact, size_t split_tokens,
                       const std::vector<int32_t>& q_positions = {}) {
  const DecodePlan plan = plan_decode(sh, kivi ? kivi->tokens : 0, exact ? exact->tokens : 0,
                                      split_tokens);
  DeviceBuffer<float> dq(q), dout(q.size());
  DeviceBuffer<int32_t> dpos(q_positions);
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  decode_attention(dq.get(), sh, kivi, exact, plan, ws.get(), dout.get(), nullptr,
                   q_positions.empty() ? nullptr : dpos.get());
  return dout.download();
}

struct Case {
  size_t dim, group;
  uint32_t bits;
};

class CudaDecodeAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDecodeAttention, ExactTierMatchesCpu) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  DecodeShape sh;
  sh.batch = 2, sh.kv_heads = 2, sh.group = c.group, sh.dim = c.dim;
  sh.scale = 1.0f / std::sqrt(float(c.dim));
  const size_t tokens = 333, capacity = 340, heads = sh.batch * sh.kv_heads;
  const auto kf = test::random_floats(heads * capacity * c.dim, 1);
  const auto vf = test::random_floats(heads * capacity * c.dim, 2);
  const auto q = test::random_floats(heads * c.group * c.dim, 3);
  std::vector<uint16_t> k(kf.size()), v(vf.size());
  std::vector<float> kr(kf.size()), vr(vf.size());  // the f16 rows as f32
  for (size_t i = 0; i < kf.size(); ++i) {
    k[i] = f32_to_f16(kf[i]);
    v[i] = f32_to_f16(vf[i]);
    kr[i] = f16_to_f32(k[i]);
    vr[i] = f16_to_f32(v[i]);
  }
  DeviceBuffer<uint16_t> dk(k), dv(v);
  ExactTierView view{dk.get(), dv.get(), tokens, capacity};
  std::vector<int32_t> pos(tokens);
  for (size_t t = 0; t < tokens; ++t) pos[t] = int32_t(t);
  const std::vector<int32_t> qpos(c.group, INT32_MAX);
  for (size_t split : {size_t(64), size_t(1000), size_t(0)}) {
    const auto out = run(sh, q, nullptr, &view, split);
    for (size_t h = 0; h < heads; ++h) {
      cpu::OnlineAttention attn(&q[h * c.group * c.dim], qpos.data(), c.group, c.dim, sh.scale);
      attn.add_chunk(&kr[h * capacity * c.dim], &vr[h * capacity * c.dim], pos.data(), tokens);
      std::vector<float> want(c.group * c.dim);
      attn.finish(want.data());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(out[h * want.size() + i], want[i], 2e-4) << "split " << split << " head " << h;
      }
    }
  }
}

TEST_P(CudaDecodeAttention, KiviTierWithResidualMatchesCpu) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  DecodeShape sh;
  sh.batch = 2, sh.kv_heads = 2, sh.group = c.group, sh.dim = c.dim;
  sh.scale = 1.0f / std::sqrt(float(c.dim));
  const size_t tokens = 300, heads = sh.batch * sh.kv_heads;
  cpu::KiviConfig cfg;
  cfg.bits = c.bits, cfg.group = 32, cfg.residual = 32;
  std::vector<cpu::KiviHeadStore> stores;
  std::vector<int32_t> pos(tokens);
  for (size_t t = 0; t < tokens; ++t) pos[t] = int32_t(t);
  for (size_t h = 0; h < heads; ++h) {
    stores.emplace_back(c.dim, cfg);
    const auto kf = test::random_floats(tokens * c.dim, 10 + h);
    const auto vf = test::random_floats(tokens * c.dim, 20 + h);
    stores.back().append(kf.data(), vf.data(), pos.data(), 200);  // two appends: a flush between
    stores.back().append(&kf[200 * c.dim], &vf[200 * c.dim], &pos[200], tokens - 200);
  }
  const size_t nq = stores[0].quantized_tokens(), nr = stores[0].residual_tokens();
  ASSERT_GT(nq, 0u);
  ASSERT_GT(nr, 0u);
  std::vector<uint8_t> kc, vc;
  std::vector<uint16_t> ks, kz, vs, vz, rk, rv;
  for (const auto& s : stores) {
    append(kc, s.key_codes()), append(vc, s.value_codes());
    append(ks, s.key_scales()), append(kz, s.key_zeros());
    append(vs, s.value_scales()), append(vz, s.value_zeros());
    append(rk, s.residual_keys()), append(rv, s.residual_values());
  }
  DeviceBuffer<uint8_t> dkc(kc), dvc(vc);
  DeviceBuffer<uint16_t> dks(ks), dkz(kz), dvs(vs), dvz(vz), drk(rk), drv(rv);
  KiviTierView kivi;
  kivi.k_codes = dkc.get(), kivi.v_codes = dvc.get();
  kivi.k_scale = dks.get(), kivi.k_zero = dkz.get(), kivi.v_scale = dvs.get();
  kivi.v_zero = dvz.get(), kivi.bits = c.bits, kivi.group = 32, kivi.tokens = nq;
  kivi.capacity = nq;
  ExactTierView residual{drk.get(), drv.get(), nr, nr};
  const auto q = test::random_floats(heads * c.group * c.dim, 3);
  const std::vector<int32_t> qpos(c.group, INT32_MAX);
  for (size_t split : {size_t(64), size_t(0)}) {
    const auto out = run(sh, q, &kivi, &residual, split);
    for (size_t h = 0; h < heads; ++h) {
      cpu::OnlineAttention attn(&q[h * c.group * c.dim], qpos.data(), c.group, c.dim, sh.scale);
      cpu::kivi_attend(stores[h], attn);
      std::vector<float> want(c.group * c.dim);
      attn.finish(want.data());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(out[h * want.size() + i], want[i], 2e-4) << "split " << split << " head " << h;
      }
    }
  }
}

// The CUDA table's attend_kivi_tier (what a device KIVI cache calls: one KV head, query rows in
// runs of the GQA group, each masked by its position) against the CPU reference backend's own
// attend_kivi over the KiviHeadStore whose buffers it reads.
// Also with ragged key blocks (an eviction's retain() over the store: the '+kiviN' overlays), where
// the tier carries each block's start and the kernel searches them.
TEST_P(CudaDecodeAttention, TableKiviTierMatchesTheReferenceBackend) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  // G = 24: no power of two; G = 1: every channel its own value group (lanes of 2-8 channels span
  // several), key blocks of one token (never ragged).
  for (uint32_t G : {32u, 24u, 1u})
  for (bool ragged : {false, true}) {
    if (G == 1 && ragged) continue;
    SCOPED_TRACE(std::string(ragged ? "ragged blocks" : "full blocks") + ", G " +
                 std::to_string(G));
    cpu::KiviConfig cfg;
    cfg.bits = c.bits, cfg.group = G, cfg.residual = 32;
    cpu::KiviHeadStore store(c.dim, cfg);
    const size_t tokens = 250;
    const auto kf = test::random_floats(tokens * c.dim, 40);
    const auto vf = test::random_floats(tokens * c.dim, 41);
    std::vector<int32_t> pos(tokens);
    for (size_t t = 0; t < tokens; ++t) pos[t] = int32_t(2 * t);
    store.append(kf.data(), vf.data(), pos.data(), tokens);
    if (ragged) {  // every third token and all of the second block go
      std::vector<uint32_t> keep;
      for (uint32_t t = 0; t < tokens; ++t) {
        if (t % 3 != 1 && (t < 32 || t >= 64)) keep.push_back(t);
      }
      store.retain(keep);
      ASSERT_TRUE(store.ragged());
    }
    const size_t nq = store.quantized_tokens(), nr = store.residual_tokens();
    ASSERT_GT(nq, 0u);
    ASSERT_GT(nr, 0u);
    const std::vector<int32_t>& held = store.positions();
    std::vector<uint32_t> starts;  // each key block's first quantized token
    uint32_t start = 0;
    for (uint32_t n : store.block_token_counts()) {
      starts.push_back(start);
      start += n;
    }
    DeviceBuffer<uint8_t> dkc(store.key_codes()), dvc(store.value_codes());
    DeviceBuffer<uint16_t> dks(store.key_scales()), dkz(store.key_zeros());
    DeviceBuffer<uint16_t> dvs(store.value_scales()), dvz(store.value_zeros());
    DeviceBuffer<uint16_t> drk(store.residual_keys()), drv(store.residual_values());
    DeviceBuffer<int32_t> dqp(std::vector<int32_t>(held.begin(), held.begin() + ptrdiff_t(nq)));
    DeviceBuffer<int32_t> drp(std::vector<int32_t>(held.begin() + ptrdiff_t(nq), held.end()));
    DeviceBuffer<uint32_t> dstarts(ragged ? starts : std::vector<uint32_t>{0});
    backend::KiviTier tier;
    tier.k_codes = dkc.get(), tier.v_codes = dvc.get();
    tier.k_scale = dks.get(), tier.k_zero = dkz.get();
    tier.v_scale = dvs.get(), tier.v_zero = dvz.get();
    tier.positions = dqp.get(), tier.tokens = nq;
    tier.bits = c.bits, tier.group = cfg.group, tier.residual = cfg.residual;
    if (ragged) tier.block_starts = dstarts.get(), tier.blocks = starts.size();
    const backend::F16Rows residual{drk.get(), drv.get(), drp.get(), nr};
    // Three tokens' query heads: one sees a prefix of the quantized blocks, one part of the
    // residual, one everything.
    const size_t rows = 3 * c.group;
    std::vector<int32_t> qpos(rows);
    for (size_t r = 0; r < rows; ++r) {
      qpos[r] = r < c.group ? 101 : r < 2 * c.group ? held[nq + nr / 2] : INT32_MAX;
    }
    const auto q = test::random_floats(rows * c.dim, 42);
    backend::QueryRows want_q{q.data(), qpos.data(), rows, c.dim, 1.0f / std::sqrt(float(c.dim))};
    want_q.group = c.group;
    std::vector<float> want(rows * c.dim);
    backend::WorkspaceHandle ref_ws(backend::cpu_reference());
    backend::cpu_reference().attend_kivi(want_q, store, ref_ws.get(), want.data());
    const backend::Ops& ops = *device_backend().ops;
    DeviceBuffer<float> dq(q), dout(want.size());
    DeviceBuffer<int32_t> dpos(qpos);
    backend::QueryRows got_q = want_q;
    got_q.q = dq.get(), got_q.positions = dpos.get();
    backend::WorkspaceHandle ws(ops);
    ops.attend_kivi_tier(got_q, tier, residual, ws.get(), dout.get());
    const std::vector<float> got = dout.download();
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-4) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeAttention,
                         ::testing::Values(Case{128, 4, 2}, Case{128, 1, 1}, Case{64, 8, 4},
                                           Case{256, 2, 8}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return "dim" + std::to_string(c.dim) + "_group" +
                                  std::to_string(c.group) + "_bits" + std::to_string(c.bits);
                         });

// The query tokens of one conversation (chunked prefill): every token is a sequence of the batch
// reading the same rows (shared_rows), masked by position, against the CPU reference's
// OnlineAttention with the same query positions. Rows are appended out of order on purpose, and
// one query sees no row at all (zeros).
TEST_P(CudaDecodeAttention, SharedRowsWithCausalMaskMatchCpu) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  DecodeShape sh;
  sh.batch = 5, sh.kv_heads = 2, sh.group = c.group, sh.dim = c.dim, sh.shared_rows = true;
  sh.scale = 1.0f / std::sqrt(float(c.dim));
  const size_t tokens = 150, capacity = 160;
  const auto kf = test::random_floats(sh.kv_heads * capacity * c.dim, 4);
  const auto vf = test::random_floats(sh.kv_heads * capacity * c.dim, 5);
  std::vector<uint16_t> k(kf.size()), v(vf.size());
  std::vector<float> kr(kf.size()), vr(vf.size());
  for (size_t i = 0; i < kf.size(); ++i) {
    k[i] = f32_to_f16(kf[i]), v[i] = f32_to_f16(vf[i]);
    kr[i] = f16_to_f32(k[i]), vr[i] = f16_to_f32(v[i]);
  }
  std::vector<int32_t> pos(sh.kv_heads * capacity, 0);
  for (size_t h = 0; h < sh.kv_heads; ++h) {
    for (size_t t = 0; t < tokens; ++t) pos[h * capacity + t] = int32_t(10 + (t * 37) % tokens);
  }
  // Query rows [batch][kv_heads][group]: token b at position 9 (sees nothing), 40, 80, 159, max.
  const int32_t token_pos[5] = {9, 40, 80, 159, INT32_MAX};
  std::vector<int32_t> qpos;
  for (size_t b = 0; b < sh.batch; ++b) qpos.insert(qpos.end(), sh.kv_heads * c.group, token_pos[b]);
  const auto q = test::random_floats(qpos.size() * c.dim, 6);
  DeviceBuffer<uint16_t> dk(k), dv(v);
  DeviceBuffer<int32_t> dp(pos);
  ExactTierView view{dk.get(), dv.get(), tokens, capacity, dp.get()};
  for (size_t split : {size_t(64), size_t(0)}) {
    const auto out = run(sh, q, nullptr, &view, split, qpos);
    for (size_t b = 0; b < sh.batch; ++b) {
      for (size_t h = 0; h < sh.kv_heads; ++h) {
        const size_t row = (b * sh.kv_heads + h) * c.group;
        cpu::OnlineAttention attn(&q[row * c.dim], &qpos[row], c.group, c.dim, sh.scale);
        attn.add_chunk(&kr[h * capacity * c.dim], &vr[h * capacity * c.dim], &pos[h * capacity],
                       tokens);
        std::vector<float> want(c.group * c.dim);
        attn.finish(want.data());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(out[row * c.dim + i], want[i], 2e-4)
              << "split " << split << " token " << b << " head " << h;
        }
        if (b == 0) {
          for (float x : want) ASSERT_EQ(x, 0.0f);
        }
      }
    }
  }
}

TEST(CudaDecodeAttentionEdge, NoTokensGivesZeros) {
  KVSDK_REQUIRE_CUDA_DEVICE();
  DecodeShape sh;
  sh.kv_heads = 1, sh.group = 2, sh.dim = 64;
  ExactTierView empty{nullptr, nullptr, 0, 0};
  const auto out = run(sh, test::random_floats(2 * 64, 1), nullptr, &empty, 64);
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

TEST(CudaDecodeAttentionArgs, BadShapesAreInvalidArguments) {
  const auto status = [](DecodeShape sh) {
    try {
      plan_decode(sh, 10, 10, 64);
    } catch (const Error& e) {
      return e.status();
    }
    return KVSDK_OK;
  };
  DecodeShape sh;
  sh.kv_heads = 8, sh.group = 4, sh.dim = 128;
  EXPECT_EQ(status(sh), KVSDK_OK);
  sh.dim = 96;
  EXPECT_EQ(status(sh), KVSDK_E_INVALID_ARG);
  sh.dim = 128, sh.group = kDecodeMaxGroup + 1;
  EXPECT_EQ(status(sh), KVSDK_E_INVALID_ARG);
  sh.group = 4, sh.kv_heads = 0;
  EXPECT_EQ(status(sh), KVSDK_E_INVALID_ARG);
}

}  // namespace
}  // namespace kvsdk::cuda
