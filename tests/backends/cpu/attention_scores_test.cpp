// The SIMD scoring kernel (backends/cpu/attention_scores_simd.cpp) against its scalar oracle
// (attention_column_sums_reference): BIT equality (tolerance 0), on every compiled Highway target,
// over random shapes (rows, ragged key counts around the 256-key chunks, head dims 64/128/256 and
// odd ones), GQA groups 1-8 through policy::window_scores, causal masks, rows that see nothing,
// extreme logits (exp underflow) and non-finite keys; its exp against pmath::exp_f32; reused
// scratch that never grows; and a digest pinned to a constant so x86-64 and aarch64 (ctest under
// qemu-aarch64) are checked to agree bit for bit.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_scores.h"
#include "core/geometry.h"
#include "fast_attention.h"  // available_targets / force_target (Highway's process-wide choice)
#include "policy/importance.h"
#include "portable_math.h"
#include "test_util.h"

namespace kvsdk::cpu {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Same bits, or NaN on both sides (NaN payloads are not portable: x86 and ARM make different
// default NaNs, in the reference as well).
bool same(float a, float b) { return bits_of(a) == bits_of(b) || (a != a && b != b); }

void expect_same(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(same(got[i], want[i])) << what << " at " << i << ": " << got[i] << " (0x"
                                       << std::hex << bits_of(got[i]) << ") vs " << want[i]
                                       << " (0x" << bits_of(want[i]) << ")";
  }
}

std::vector<float> gaussian(size_t n, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (float& f : x) f = d(rng);
  return x;
}

// One kernel call's inputs; the loader checks the chunk contract (consecutive, <= 256 keys).
struct Case {
  size_t n_rows, dim, n_keys;
  float scale;
  std::vector<float> q, k, init;
  std::vector<int32_t> row_pos, key_pos;

  std::vector<float> run(bool reference, ColumnSumsScratch* scratch = nullptr) const {
    std::vector<float> out = init;
    size_t next = 0;
    const KeyChunkLoader load = [&](size_t first, size_t n, float* dst) {
      EXPECT_EQ(first, next);
      EXPECT_LE(n, 256u);
      next = first + n;
      std::copy_n(k.data() + first * dim, n * dim, dst);
    };
    if (reference) {
      attention_column_sums_reference(q.data(), row_pos.data(), n_rows, dim, scale, load,
                                      key_pos.data(), n_keys, out.data());
    } else if (scratch) {
      attention_column_sums(q.data(), row_pos.data(), n_rows, dim, scale, load, key_pos.data(),
                            n_keys, out.data(), *scratch);
    } else {
      attention_column_sums(q.data(), row_pos.data(), n_rows, dim, scale, load, key_pos.data(),
                            n_keys, out.data());
    }
    return out;
  }
};

// Keys at increasing positions with gaps; rows that see everything (INT32_MAX), a causal prefix,
// or nothing (-1).
Case random_case(std::mt19937& rng, size_t n_rows, size_t dim, size_t n_keys, float sigma) {
  Case c{n_rows, dim, n_keys, 1.0f / std::sqrt(float(dim)), gaussian(n_rows * dim, rng, sigma),
         gaussian(n_keys * dim, rng, 1.0f), gaussian(n_keys, rng, 0.1f), {}, {}};
  c.key_pos.resize(n_keys);
  int32_t p = int32_t(rng() % 5);
  for (size_t t = 0; t < n_keys; ++t) c.key_pos[t] = p, p += 1 + int32_t(rng() % 3);
  c.row_pos.resize(n_rows);
  std::uniform_int_distribution<int32_t> pos(-1, p);
  for (size_t r = 0; r < n_rows; ++r) c.row_pos[r] = r % 4 == 0 ? INT32_MAX : pos(rng);
  return c;
}

// Runs f() once per compiled Highway target this CPU runs (the scalar fallback included).
template <class F>
void for_each_target(F&& f) {
  const std::vector<fast::Target> targets = fast::available_targets();
  ASSERT_GE(targets.size(), 2u);
  for (const fast::Target& t : targets) {
    fast::force_target(t.bits);
    f(std::string(t.name));
  }
  fast::force_target(0);
}

TEST(AttentionScores, SameBitsAsReferenceOnRandomShapes) {
  std::mt19937 rng(15);
  for (int trial = 0; trial < 24; ++trial) {
    const size_t dims[] = {64, 128, 256, 1, 3, 5, 13, 67};
    const size_t dim = dims[trial % 8];
    const size_t n_rows = 1 + rng() % 40;
    // Ragged key counts: below, at and around the 256-key chunks and the vector widths.
    const size_t keys[] = {1, 7, 16, 31, 255, 256, 257, 700, 1023};
    const size_t n_keys = keys[rng() % 9];
    const float sigma = trial % 3 == 2 ? 8.0f : 1.0f;  // wide logits: many exp underflows
    const Case c = random_case(rng, n_rows, dim, n_keys, sigma);
    const std::vector<float> want = c.run(true);
    for_each_target([&](const std::string& target) {
      expect_same(c.run(false), want,
                  target + " trial " + std::to_string(trial) + " dim " + std::to_string(dim) +
                      " rows " + std::to_string(n_rows) + " keys " + std::to_string(n_keys));
    });
  }
}

TEST(AttentionScores, SameBitsAsReferenceWithNonFiniteKeys) {
  std::mt19937 rng(16);
  Case c = random_case(rng, 9, 16, 300, 1.0f);
  c.k[5 * 16 + 3] = INFINITY;       // key 5: +inf or -inf logits depending on the row
  c.k[40 * 16 + 0] = NAN;           // key 40: NaN logits (NaN sums for rows that see it)
  c.k[200 * 16 + 7] = -INFINITY;
  const std::vector<float> want = c.run(true);
  for_each_target([&](const std::string& target) { expect_same(c.run(false), want, target); });
}

// policy::window_scores (gather the group's rows, the kernel, average over the group) against
// the same steps on the reference kernel, for GQA groups 1-8 and head dims 64/128/256.
TEST(AttentionScores, WindowScoresSameBitsAsReferenceAcrossGqa) {
  std::mt19937 rng(17);
  for (uint32_t group : {1u, 2u, 4u, 8u}) {
    for (uint32_t dim : {64u, 128u, 256u}) {
      Geometry g;
      g.n_layers = 1;
      g.n_kv_heads = 2;
      g.n_q_heads = 2 * group;
      g.head_dim = dim;
      g.attn_scale = 1.0f / std::sqrt(float(dim));
      const size_t nq = 1 + rng() % 12, nk = 300 + rng() % 600;
      const std::vector<float> q = gaussian(nq * g.q_elems_per_token(), rng, 1.0f);
      const std::vector<float> k = gaussian(nk * dim, rng, 1.0f);
      std::vector<int32_t> kpos(nk), qpos(nq);
      for (size_t t = 0; t < nk; ++t) kpos[t] = int32_t(t);
      for (size_t i = 0; i < nq; ++i) qpos[i] = int32_t(nk - nq + i);
      const KeyChunkLoader load = [&](size_t first, size_t n, float* dst) {
        std::copy_n(k.data() + first * dim, n * dim, dst);
      };
      for (uint32_t h = 0; h < 2; ++h) {
        // Oracle: the group's rows [query][head of the group][dim], the reference kernel.
        std::vector<float> rows;
        std::vector<int32_t> rpos;
        for (size_t i = 0; i < nq; ++i) {
          for (uint32_t j = 0; j < group; ++j) {
            const float* src = q.data() + i * g.q_elems_per_token() + (h * group + j) * dim;
            rows.insert(rows.end(), src, src + dim);
            rpos.push_back(qpos[i]);
          }
        }
        std::vector<float> sums(nk, 0.0f), want(nk, 0.0f);
        attention_column_sums_reference(rows.data(), rpos.data(), rpos.size(), dim, g.attn_scale,
                                        load, kpos.data(), nk, sums.data());
        const float inv_group = 1.0f / float(group);
        for (size_t t = 0; t < nk; ++t) want[t] += sums[t] * inv_group;
        const policy::QueryBlock qb{q.data(), qpos.data(), nq};
        for_each_target([&](const std::string& target) {
          expect_same(policy::window_scores(qb, g, h, load, kpos.data(), nk), want,
                      target + " group " + std::to_string(group) + " dim " + std::to_string(dim));
        });
      }
    }
  }
}

// The SIMD exp gives pmath::exp_f32's bits: every 4099th bit pattern of the whole f32 range,
// every 997th where softmax arguments live ([-120, 0]), and the edges of its branches.
TEST(AttentionScores, ExpSameBitsAsPortableExp) {
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    float f;
    const uint32_t b = uint32_t(u);
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  for (uint32_t b = bits_of(-0.0f); b <= bits_of(-120.0f); b += 997) {  // [-120, -0]
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 1e-30f, -1e-30f, 0x1p-28f, -0x1p-28f, 0.34657359f, -0.34657359f,
                  -87.3f, -103.97f, -104.0f, -149.0f, -200.0f, -200.1f, 88.72f, 88.73f, 200.5f,
                  INFINITY, -INFINITY, NAN}) {
    x.push_back(f);
  }
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = pmath::exp_f32(x[i]);
  for_each_target([&](const std::string& target) {
    std::vector<float> got(x.size());
    portable_exp_f32_array(x.data(), x.size(), got.data());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(same(got[i], want[i])) << target << " exp(" << x[i] << ") = " << got[i]
                                         << " vs " << want[i];
    }
  });
}

// Repeated calls of one shape, then smaller ones, reuse the scratch: no growth, same bits as a
// call with fresh working memory.
TEST(AttentionScores, ScratchIsReusedWithoutGrowth) {
  std::mt19937 rng(18);
  const Case big = random_case(rng, 64, 128, 2000, 1.0f);
  ColumnSumsScratch s;
  const std::vector<float> first = big.run(false, &s);
  const size_t caps[] = {s.logits.capacity(), s.keys.capacity(), s.keys_t.capacity(),
                         s.key_pos.capacity(), s.row_max.capacity()};
  const float* logits = s.logits.data();
  expect_same(big.run(false, &s), first, "second call");
  const Case small = random_case(rng, 17, 64, 999, 1.0f);
  expect_same(small.run(false, &s), small.run(true), "smaller shape");
  const size_t after[] = {s.logits.capacity(), s.keys.capacity(), s.keys_t.capacity(),
                          s.key_pos.capacity(), s.row_max.capacity()};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(after[i], caps[i]) << "buffer " << i;
  EXPECT_EQ(s.logits.data(), logits);
}

// Fixed inputs (integer hash, no library distribution) whose scores are pinned below.
std::vector<float> fixed_scores(bool reference) {
  uint32_t state = 12345;
  const auto next = [&state] {  // uniform in [-1, 1)
    state = state * 1664525u + 1013904223u;
    return float(int32_t(state >> 8) - (1 << 23)) / float(1 << 23);
  };
  std::vector<float> all;
  for (size_t dim : {64, 128, 256, 40}) {
    for (size_t n_keys : {37, 256, 600}) {
      Case c{12, dim, n_keys, 1.0f / std::sqrt(float(dim)), {}, {}, {}, {}, {}};
      c.q.resize(c.n_rows * dim);
      for (float& f : c.q) f = 3.0f * next();
      c.k.resize(n_keys * dim);
      for (float& f : c.k) f = next();
      c.init.assign(n_keys, 0.0f);
      for (size_t t = 0; t < n_keys; ++t) c.key_pos.push_back(int32_t(2 * t));
      for (size_t r = 0; r < c.n_rows; ++r) {
        c.row_pos.push_back(r % 3 == 0 ? INT32_MAX : int32_t((r * 97) % (2 * n_keys)));
      }
      const std::vector<float> s = c.run(reference);
      all.insert(all.end(), s.begin(), s.end());
    }
  }
  return all;
}

// The same digest on every architecture and target, and from the reference: recorded on x86-64
// (AVX-512); the test passes unchanged on aarch64 (NEON) under qemu, so both compute the same
// bits.
TEST(AttentionScores, DigestMatchesAcrossArchitectures) {
  constexpr uint64_t kDigest = 0xa98502a018af9ffbull;
  EXPECT_EQ(kvsdk_test::float_digest(fixed_scores(true)), kDigest) << "reference";
  for_each_target([&](const std::string& target) {
    EXPECT_EQ(kvsdk_test::float_digest(fixed_scores(false)), kDigest) << target;
  });
}

}  // namespace
}  // namespace kvsdk::cpu
