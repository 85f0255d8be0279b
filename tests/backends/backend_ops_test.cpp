// Every op of every backend against the reference backend (the oracle), in the manner of ggml's
// test-backend-ops: random shapes, GQA ratios 1/4/8, head dims 64/128/256, every KIVI bit width,
// ragged lengths (token counts that are not multiples of anything, KIVI stores with ragged key
// blocks), each op with its stated tolerance. The optimized CPU backend runs once per SIMD target
// this machine has (AVX-512, AVX2, SSE4 / NEON, scalar), forced one at a time.
//
// Tolerances: ops that the optimized backend takes from the reference table, ops whose kernels
// are exact (conversions, quantization, gathers, selection), and window scoring (whose SIMD
// kernel repeats the reference's arithmetic: scores decide evictions, which must not depend on
// the machine) must match bit for bit. The
// SIMD attention kernels compute the same softmax attention over the same rows in another order
// of summation (see fast_attention.h), so they match within kAttendRel of |reference| plus
// kAttendAbs of max |v| (KIVI: kAttendKiviAbs, below): ~10x the largest gap measured, far below what a wrong code, scale, mask
// or rescale does (> 1e-2 of max |v|). That holds for the chunk-fed tiers too (attend_spindle,
// attend_minicache(_kivi): fast_chunk_attention.h). SpeCache's attention (attend_specache and
// attend_specache_scored: specache_attention.h) runs the fused KIVI kernel over its low-bit copy,
// so it has the KIVI tolerance; its selection scores come from the same kernel (integer query
// codes, each key term off by up to 2^-15 of the largest: kSpeCacheScoreRel of the row's largest
// |score|) and the SIMD exp: its probabilities match within kSpeCacheProbRel of the reference's
// plus kProbAbs, and its top-k set wherever a probability is farther than that from the k-th
// largest (a near-tie may pick either token). SmallKV's proxy softmax (smallkv_softmax) matches
// within the same kProbRel/kProbAbs, and its Eq. 6 attention (attend_smallkv) within the attention
// tolerances; attend_smallkv without marginal rows followed by smallkv_add_marginal gives the one
// call's bits on each backend. Every optimized SIMD target must give the same bits
// as the first one tried (snapshots continue identically on any machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "fast_attention.h"
#include "kivi_quant.h"
#include "kivi_store.h"
#include "kivi_tier.h"
#include "minicache_kivi.h"
#include "minicache_merge.h"
#include "specache.h"
#include "spindlekv_store.h"
#include "util/error.h"

namespace kvsdk::backend {
namespace {

constexpr float kAttendRel = 1e-5f;
constexpr float kAttendAbs = 3e-5f;
// The optimized KIVI kernel rounds query x key scale (per block) and the value weights (per
// segment) to 15- and 14-bit integer codes so the sums over codes are exact integer dot products
// (fast_attention.h): each term is off by at most 2^-15 of the largest in its sum, finer than the
// f16 storage of the scales (2^-11). Largest gap measured: 8.2e-4 of max |v|.
constexpr float kAttendKiviAbs = 2e-3f;
// With 7-bit value weights (KiviConfig::weight_bits 7) a weight is off by up to 2^-8 of the
// largest of its segment's row and value group; tests/backends/cpu/fast_attention_test.cpp
// measures the worst case (kKiviByteAbsTol there); this bound keeps its margin.
constexpr float kAttendKiviByteAbs = 5e-2f;
float attend_kivi_abs(uint32_t weight_bits) {
  return weight_bits == 7 ? kAttendKiviByteAbs : kAttendKiviAbs;
}
constexpr float kProbRel = 1e-5f;
constexpr float kProbAbs = 1e-7f;
// A probability moves by exp(score error) - 1 relative: scores within 1e-3 of the row's largest
// |score| (a few units here) move it by ~1e-2 at most; measured: 1.5e-4.
constexpr float kSpeCacheProbRel = 1e-2f;

const size_t kDims[] = {64, 128, 256};
const size_t kGroups[] = {1, 4, 8};      // query heads per KV head
const size_t kTokens[] = {1, 37, 300, 613};
const uint32_t kBits[] = {1, 2, 4, 8};

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (float& f : x) f = d(rng);
  return x;
}

std::vector<int32_t> iota_positions(size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = int32_t(i);
  return p;
}

// Query rows of one KV head: `group` heads x 2 queries; the first query sees everything
// (decode), the second a causal prefix (ragged visibility, possibly nothing at all).
struct Queries {
  std::vector<float> q;
  std::vector<int32_t> pos;
  QueryRows rows(size_t dim) const {
    return {q.data(), pos.data(), pos.size(), dim, 1.0f / std::sqrt(float(dim))};
  }
};
Queries make_queries(size_t group, size_t dim, size_t n_tokens, uint32_t seed) {
  Queries qs;
  qs.q = gaussian(2 * group * dim, seed);
  for (size_t r = 0; r < 2 * group; ++r) {
    qs.pos.push_back(r < group ? INT32_MAX : int32_t((n_tokens * 2) / 3) - 1);
  }
  return qs;
}

// A backend under test: its table and the SIMD target it is forced to (0 = any).
struct Candidate {
  const Ops* ops;
  int64_t target;
  std::string name;
};
std::vector<Candidate> candidates() {
  std::vector<Candidate> c{{&cpu_reference(), 0, "cpu-reference"}};
  for (const cpu::fast::Target& t : cpu::fast::available_targets()) {
    c.push_back({&cpu_optimized(), t.bits, std::string("cpu-optimized/") + t.name});
  }
  return c;
}

// Runs `body` once per candidate with its target forced, and restores dispatch afterwards.
void for_each_backend(const std::function<void(const Candidate&)>& body) {
  for (const Candidate& c : candidates()) {
    cpu::fast::force_target(c.target);
    SCOPED_TRACE(c.name);
    body(c);
  }
  cpu::fast::force_target(0);
}

void expect_bits(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << what << ": element " << i << ": " << got[i] << " vs reference " << want[i];
  }
}

void expect_attention(const std::vector<float>& got, const std::vector<float>& want,
                      float max_abs_v, const std::string& what, float abs_tol = kAttendAbs) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = kAttendRel * std::fabs(want[i]) + abs_tol * max_abs_v;
    ASSERT_NEAR(got[i], want[i], tol) << what << ": element " << i;
  }
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Attention over a tier: reference and candidate outputs of `attend(ops, ws, out)`.
template <class Attend>
void check_attend(const Candidate& c, size_t out_size, float max_v, bool exact,
                  const std::string& what, Attend&& attend, float abs_tol = kAttendAbs) {
  WorkspaceHandle ref_ws(cpu_reference()), ws(*c.ops);
  std::vector<float> want(out_size, NAN), got(out_size, NAN);
  attend(cpu_reference(), ref_ws.get(), want.data());
  attend(*c.ops, ws.get(), got.data());
  if (exact || c.ops == &cpu_reference()) {
    expect_bits(got, want, what);
  } else {
    expect_attention(got, want, max_v, what, abs_tol);
    // Every SIMD target gives the bits of the first target tried for this case.
    static std::map<std::string, std::vector<float>> first_target;
    const auto [it, inserted] = first_target.emplace(what, got);
    if (!inserted) expect_bits(got, it->second, what + " (same bits on every SIMD target)");
  }
  // A reused workspace gives the same bits (no state leaks from one call into the next).
  std::vector<float> again(out_size, NAN);
  attend(*c.ops, ws.get(), again.data());
  expect_bits(again, got, what + " (reused workspace)");
}

// ---- memory ----------------------------------------------------------------------------------

TEST(BackendOps, MemoryRoundTripsThroughBackendBuffers) {
  for_each_backend([](const Candidate& c) {
    const std::vector<float> host = gaussian(1000, 1);
    void* buf = c.ops->alloc(host.size() * 4);
    ASSERT_NE(buf, nullptr);
    c.ops->to_backend(buf, host.data(), host.size() * 4);
    std::vector<float> back(host.size());
    c.ops->to_host(back.data(), buf, back.size() * 4);
    c.ops->free(buf);
    c.ops->free(nullptr);
    expect_bits(back, host, "round trip");
  });
}

// ---- append / convert, quantize / dequantize -------------------------------------------------

TEST(BackendOps, ConversionsMatchTheReferenceExactly) {
  std::vector<float> x = gaussian(4099, 2, 100.0f);
  x[0] = 65520.0f, x[1] = -1e-8f, x[2] = INFINITY, x[3] = 6.1e-5f;  // overflow, subnormal, inf
  for_each_backend([&](const Candidate& c) {
    std::vector<uint16_t> h(x.size()), href(x.size());
    c.ops->f32_to_f16(x.data(), x.size(), h.data());
    cpu_reference().f32_to_f16(x.data(), x.size(), href.data());
    ASSERT_EQ(h, href);
    for (size_t n : {size_t(1), size_t(15), size_t(4099)}) {  // ragged tails
      std::vector<float> f(n), fref(n);
      c.ops->f16_to_f32(h.data(), n, f.data());
      cpu_reference().f16_to_f32(h.data(), n, fref.data());
      expect_bits(f, fref, "f16_to_f32");
    }
  });
}

TEST(BackendOps, KiviQuantizationMatchesTheReferenceExactly) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      for (uint32_t bits : kBits) {
        const size_t n = 37, group = 32, ng = cpu::kivi_value_groups(dim, group);
        const size_t rb = cpu::kivi_packed_bytes(dim, bits);
        const std::vector<float> x = gaussian(n * dim, uint32_t(dim + bits));
        const Ops* both[] = {c.ops, &cpu_reference()};
        std::vector<uint8_t> codes[2];
        std::vector<uint16_t> ks[2], kz[2], vs[2], vz[2];
        std::vector<float> kd[2], vd[2];
        for (int i = 0; i < 2; ++i) {
          codes[i].resize(n * rb), ks[i].resize(dim), kz[i].resize(dim);
          both[i]->kivi_quantize_keys(x.data(), n, dim, bits, codes[i].data(), ks[i].data(),
                                      kz[i].data());
          kd[i].resize(5 * dim);
          both[i]->kivi_dequantize_keys(codes[i].data(), ks[i].data(), kz[i].data(), 30, 5, dim,
                                        bits, kd[i].data());
          std::vector<uint8_t> vcodes(n * rb);
          vs[i].resize(n * ng), vz[i].resize(n * ng), vd[i].resize(n * dim);
          both[i]->kivi_quantize_values(x.data(), n, dim, group, bits, vcodes.data(),
                                        vs[i].data(), vz[i].data());
          both[i]->kivi_dequantize_values(vcodes.data(), vs[i].data(), vz[i].data(), n, dim,
                                          group, bits, vd[i].data());
        }
        ASSERT_EQ(codes[0], codes[1]);
        ASSERT_EQ(ks[0], ks[1]);
        ASSERT_EQ(kz[0], kz[1]);
        ASSERT_EQ(vs[0], vs[1]);
        ASSERT_EQ(vz[0], vz[1]);
        expect_bits(kd[0], kd[1], "dequantized keys");
        expect_bits(vd[0], vd[1], "dequantized values");
      }
    }
  });
}

// ---- attention over each tier ----------------------------------------------------------------

TEST(BackendOps, AttendF16WithinToleranceOfTheReference) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      for (size_t group : kGroups) {
        for (size_t n : kTokens) {
          const uint32_t seed = uint32_t(dim * 7 + group * 3 + n);
          std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1, 3.0f);
          std::vector<uint16_t> k16(k.size()), v16(v.size());
          cpu_reference().f32_to_f16(k.data(), k.size(), k16.data());
          cpu_reference().f32_to_f16(v.data(), v.size(), v16.data());
          const std::vector<int32_t> pos = iota_positions(n);
          const Queries qs = make_queries(group, dim, n, seed + 2);
          const F16Rows rows{k16.data(), v16.data(), pos.data(), n};
          check_attend(c, qs.q.size(), max_abs(v), false,
                       "attend_f16 dim " + std::to_string(dim) + " group " +
                           std::to_string(group) + " tokens " + std::to_string(n),
                       [&](const Ops& o, Workspace& ws, float* out) {
                         o.attend_f16(qs.rows(dim), rows, ws, out);
                       });
        }
      }
    }
  });
}

// attend_kivi_tier (a KIVI store's buffers without the store object: what a device store hands
// its backend) is attend_kivi of the store whose buffers they are: bit for bit on the reference,
// within attend_kivi's tolerance elsewhere.
// Also over ragged key blocks (a retain()ed store, the tier giving each block's start).
TEST(BackendOps, AttendKiviTierIsAttendKiviOfTheSameBuffers) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : {size_t(64), size_t(128)}) {
      for (uint32_t bits : kBits) {
        for (uint32_t wbits : {14u, 7u}) {
          for (bool ragged : {false, true}) {
            const uint32_t seed = uint32_t(7 * dim + bits);
            const size_t n = 170;
            cpu::KiviHeadStore s(dim, cpu::KiviConfig{bits, 32, 64, wbits});
            const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
            const std::vector<int32_t> pos = iota_positions(n);
            s.append(k.data(), v.data(), pos.data(), n);
            ASSERT_GT(s.quantized_tokens(), 0u);
            std::vector<uint32_t> starts;  // each key block's first quantized token
            if (ragged) {
              std::vector<uint32_t> keep;
              for (uint32_t t = 0; t < n; ++t) {
                if (t % 4 != 2) keep.push_back(t);
              }
              s.retain(keep);
              uint32_t start = 0;
              for (uint32_t b : s.block_token_counts()) starts.push_back(start), start += b;
            }
            const size_t nq = s.quantized_tokens();
            KiviTier tier;
            tier.k_codes = s.key_codes().data(), tier.v_codes = s.value_codes().data();
            tier.k_scale = s.key_scales().data(), tier.k_zero = s.key_zeros().data();
            tier.v_scale = s.value_scales().data(), tier.v_zero = s.value_zeros().data();
            tier.positions = s.positions().data(), tier.tokens = nq;
            tier.bits = bits, tier.group = 32, tier.residual = 64, tier.weight_bits = wbits;
            if (ragged) tier.block_starts = starts.data(), tier.blocks = starts.size();
            const F16Rows residual{s.residual_keys().data(), s.residual_values().data(),
                                   s.positions().data() + nq, s.residual_tokens()};
            const Queries qs = make_queries(4, dim, n, seed + 2);
            const std::string what = "attend_kivi_tier dim " + std::to_string(dim) + " bits " +
                                     std::to_string(bits) + " weight bits " +
                                     std::to_string(wbits) + (ragged ? " ragged" : "");
            // The reference's entry against the reference's attend_kivi of the store itself.
            std::vector<float> tier_out(qs.q.size()), store_out(qs.q.size());
            WorkspaceHandle ws(cpu_reference());
            cpu_reference().attend_kivi_tier(qs.rows(dim), tier, residual, ws.get(),
                                             tier_out.data());
            cpu_reference().attend_kivi(qs.rows(dim), s, ws.get(), store_out.data());
            expect_bits(tier_out, store_out, what + " (reference: attend_kivi's bits)");
            check_attend(c, qs.q.size(), max_abs(v), false, what,
                         [&](const Ops& o, Workspace& w, float* out) {
                           o.attend_kivi_tier(qs.rows(dim), tier, residual, w, out);
                         },
                         attend_kivi_abs(wbits));
          }
        }
      }
    }
  });
}

TEST(BackendOps, AttendKiviWithinToleranceOfTheReference) {
  for_each_backend([](const Candidate& c) {
    // (192: a multiple of 64 without a VNNI key kernel of its own, which must take the general
    // path rather than read query codes that were never written.)
    for (size_t dim : {size_t(64), size_t(128), size_t(192), size_t(256)}) {
      for (uint32_t bits : kBits) {
        for (size_t n : {size_t(37), size_t(300)}) {
          for (uint32_t wbits : {14u, 7u}) {
            for (bool ragged : {false, true}) {
              const uint32_t seed = uint32_t(dim + bits * 11 + n + ragged);
              cpu::KiviHeadStore s(dim, cpu::KiviConfig{bits, 32, 64, wbits});
              const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
              const std::vector<int32_t> pos = iota_positions(n);
              s.append(k.data(), v.data(), pos.data(), n);
              if (ragged) {  // drop every third token: ragged key blocks and a shorter residual
                std::vector<uint32_t> keep;
                for (uint32_t i = 0; i < n; ++i) {
                  if (i % 3 != 1) keep.push_back(i);
                }
                s.retain(keep);
              }
              for (size_t group : kGroups) {
                if (dim != 128 && group != 4) continue;  // every GQA ratio at one head dim
                const Queries qs = make_queries(group, dim, n, seed + 2);
                check_attend(c, qs.q.size(), max_abs(v), false,
                             "attend_kivi dim " + std::to_string(dim) + " bits " +
                                 std::to_string(bits) + " group " + std::to_string(group) +
                                 " tokens " + std::to_string(n) + " weight bits " +
                                 std::to_string(wbits) + (ragged ? " ragged" : ""),
                             [&](const Ops& o, Workspace& ws, float* out) {
                               o.attend_kivi(qs.rows(dim), s, ws, out);
                             },
                             attend_kivi_abs(wbits));
              }
            }
          }
        }
      }
    }
  });
}

// ---- split-K: token ranges of one head, merged ----------------------------------------------

// The attention of a head as ranges cut at `cuts` (ascending, in [0, n]; equal cuts give empty
// ranges), each through `range(ops, ws, first, count, state)`, merged by the backend's
// merge_partials.
template <class Range>
std::vector<float> split_attend(const Ops& o, Workspace& ws, size_t n_rows, size_t dim, size_t n,
                                const std::vector<size_t>& cuts, Range&& range) {
  std::vector<std::vector<float>> mem;
  std::vector<PartialState> parts;
  size_t first = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t end = i < cuts.size() ? cuts[i] : n;
    mem.emplace_back(n_rows * (dim + 2), NAN);  // every float must be written by the range op
    float* m = mem.back().data();
    parts.push_back({m, m + n_rows, m + 2 * n_rows});
    range(o, ws, first, end - first, parts.back());
    first = end;
  }
  std::vector<float> out(n_rows * dim, NAN);
  o.merge_partials(parts.data(), parts.size(), n_rows, dim, out.data());
  return out;
}

// attend_f16_range / attend_kivi_range + merge_partials on every backend: within the attention
// tolerance of the reference's whole-head attend (the reference's own split too: a split only
// rounds differently), the same bits on every SIMD target, and one range over everything merged
// alone is the backend's attend_f16 / attend_kivi bit for bit. Cuts fall inside KIVI key blocks
// and in the residual window, some ranges are empty, and the causal row sees none of the last
// ranges (a state of max -inf).
TEST(BackendOps, SplitKRangesMergeWithinToleranceOfTheReference) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : {size_t(64), size_t(128)}) {
      for (int tier = 0; tier < 3; ++tier) {  // f16, KIVI-2, KIVI-4 (ragged key blocks)
        const size_t n = 613;
        const uint32_t seed = uint32_t(dim * 5 + tier);
        const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1, 2.0f);
        const std::vector<int32_t> pos = iota_positions(n);
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        cpu_reference().f32_to_f16(k.data(), k.size(), k16.data());
        cpu_reference().f32_to_f16(v.data(), v.size(), v16.data());
        const F16Rows rows{k16.data(), v16.data(), pos.data(), n};
        cpu::KiviHeadStore s(dim, cpu::KiviConfig{tier == 1 ? 2u : 4u, 32, 64, 14});
        s.append(k.data(), v.data(), pos.data(), n);
        if (tier == 2) {
          std::vector<uint32_t> keep;
          for (uint32_t t = 0; t < n; ++t) {
            if (t % 5 != 3) keep.push_back(t);
          }
          s.retain(keep);
        }
        const size_t tokens = tier == 0 ? n : s.size();
        const Queries qs = make_queries(4, dim, tokens, seed + 2);
        const size_t n_rows = qs.pos.size();
        const auto range = [&](const Ops& o, Workspace& ws, size_t first, size_t count,
                               const PartialState& st) {
          if (tier == 0) return o.attend_f16_range(qs.rows(dim), rows, first, count, ws, st);
          o.attend_kivi_range(qs.rows(dim), s, first, count, ws, st);
        };
        const auto whole = [&](const Ops& o, Workspace& ws, float* out) {
          if (tier == 0) return o.attend_f16(qs.rows(dim), rows, ws, out);
          o.attend_kivi(qs.rows(dim), s, ws, out);
        };
        const std::string what =
            std::string(tier == 0 ? "f16" : tier == 1 ? "kivi2" : "kivi4 ragged") + " dim " +
            std::to_string(dim);
        WorkspaceHandle ref_ws(cpu_reference()), ws(*c.ops);
        std::vector<float> want(n_rows * dim);
        whole(cpu_reference(), ref_ws.get(), want.data());
        const float abs_tol = tier == 0 ? kAttendAbs : kAttendKiviAbs;
        // Inside the first key block, at a block boundary, an empty range, the residual window.
        const std::vector<size_t> cuts = {13, 64, 64, 200, tokens - 40, tokens - 3};
        const std::vector<float> got =
            split_attend(*c.ops, ws.get(), n_rows, dim, tokens, cuts, range);
        expect_attention(got, want, max_abs(v), what + " split", abs_tol);
        if (c.ops != &cpu_reference()) {
          static std::map<std::string, std::vector<float>> first_target;
          const auto [it, inserted] = first_target.emplace(what, got);
          if (!inserted) expect_bits(got, it->second, what + " split (same bits on every target)");
        }
        // One range over everything is the whole-head op.
        std::vector<float> own(n_rows * dim);
        whole(*c.ops, ws.get(), own.data());
        expect_bits(split_attend(*c.ops, ws.get(), n_rows, dim, tokens, {}, range), own,
                    what + " one range");
        // A range past the end is refused.
        std::vector<float> mem(n_rows * (dim + 2));
        PartialState st{mem.data(), mem.data() + n_rows, mem.data() + 2 * n_rows};
        try {
          range(*c.ops, ws.get(), tokens - 10, 11, st);
          ADD_FAILURE() << what << ": a range past the end was accepted";
        } catch (const Error& e) {
          EXPECT_EQ(e.status(), KVSDK_E_INVALID_ARG) << e.what();
        }
      }
    }
  });
}

// SpeCache selection of `k` tokens: probabilities within kSpeCacheProbRel / kProbAbs of the
// reference's
// (bit for bit for the reference itself), the same top-k set wherever a probability is farther
// than that from the k-th largest, the same bits from a reused workspace and on every SIMD target.
// `select(ops, ws, tokens, probs)` runs one backend's selection (specache_select, or
// attend_specache_scored then specache_select_scored).
using SelectFn = std::function<void(const Ops&, Workspace&, std::vector<uint32_t>&,
                                    std::vector<float>&)>;
void check_selection(const Candidate& c, size_t k, const std::string& what,
                     const SelectFn& select) {
  std::vector<uint32_t> want, got, again;
  std::vector<float> want_p, got_p, again_p;
  WorkspaceHandle ref_ws(cpu_reference()), ws(*c.ops);
  select(cpu_reference(), ref_ws.get(), want, want_p);
  select(*c.ops, ws.get(), got, got_p);
  select(*c.ops, ws.get(), again, again_p);
  EXPECT_EQ(again, got) << what << " (reused workspace)";
  expect_bits(again_p, got_p, what + " probabilities (reused workspace)");
  ASSERT_EQ(got.size(), want.size()) << what;
  if (c.ops == &cpu_reference()) {
    EXPECT_EQ(got, want) << what;
    expect_bits(got_p, want_p, what + " probabilities");
    return;
  }
  ASSERT_EQ(got_p.size(), want_p.size()) << what;
  for (size_t t = 0; t < want_p.size(); ++t) {
    ASSERT_NEAR(got_p[t], want_p[t], kSpeCacheProbRel * std::fabs(want_p[t]) + kProbAbs)
        << what << ": probability of token " << t;
  }
  if (k > 0 && !want.empty()) {
    std::vector<float> sorted = want_p;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float kth = sorted[std::min(k, sorted.size()) - 1];
    const float gap = 2.0f * (kSpeCacheProbRel * kth + kProbAbs);
    std::vector<char> in_want(want_p.size(), 0), in_got(want_p.size(), 0);
    for (uint32_t t : want) in_want[t] = 1;
    for (uint32_t t : got) in_got[t] = 1;
    for (size_t t = 0; t < want_p.size(); ++t) {
      if (std::fabs(want_p[t] - kth) > gap) {
        EXPECT_EQ(in_got[t], in_want[t]) << what << ": token " << t << " (probability "
                                         << want_p[t] << ", k-th " << kth << ")";
      }
    }
  }
  static std::map<std::string, std::pair<std::vector<uint32_t>, std::vector<float>>> first;
  const auto [it, inserted] = first.emplace(what, std::make_pair(got, got_p));
  if (!inserted) {
    EXPECT_EQ(got, it->second.first) << what << " (same selection on every SIMD target)";
    expect_bits(got_p, it->second.second, what + " probabilities (same bits on every target)");
  }
}

void check_specache_select(const Candidate& c, const QueryRows& r,
                           const cpu::KiviHeadStore& lowbit, size_t k, const std::string& what) {
  check_selection(c, k, what,
                  [&](const Ops& o, Workspace& ws, std::vector<uint32_t>& t, std::vector<float>& p) {
                    o.specache_select(r, lowbit, k, ws, t, &p);
                  });
}

// SpeCache's one-pass decode step (attend_specache_scored, then specache_select_scored on the
// scores of one query's rows): its attention is the same backend's attend_specache bit for bit,
// and its selection is the same backend's specache_select bit for bit, so both inherit those
// ops' tolerances against the reference (checked here too: attention within kAttendRel /
// the KIVI tolerance, selection within kSpeCacheProbRel / kProbAbs, on every SIMD target). The
// scores themselves: within kSpeCacheScoreRel of the row's largest |score| of the reference's
// (the fused KIVI kernel's integer query codes; measured: 5e-5).
constexpr float kSpeCacheScoreRel = 1e-3f;
void check_specache_scored(const Candidate& c, const Queries& qs, size_t group, size_t dim,
                           const cpu::KiviHeadStore& lowbit, const cpu::SpeCacheFetched& fetched,
                           const std::string& d) {
  const size_t n = lowbit.size(), rows = qs.pos.size();
  const auto scored = [&](const Ops& o, Workspace& ws, QueryRows r, float* out, float* scores,
                          float* shares = nullptr) {
    o.attend_specache_scored(r, lowbit, fetched, ws, out, scores, shares);
  };
  std::vector<float> scores(rows * n, NAN), want_scores(rows * n, NAN);
  check_attend(c, qs.q.size(), 2.0f, false, "attend_specache_scored" + d,
               [&](const Ops& o, Workspace& ws, float* out) {
                 scored(o, ws, qs.rows(dim), out, scores.data());
               },
               attend_kivi_abs(lowbit.config().weight_bits));
  {
    WorkspaceHandle ws(*c.ops), ref_ws(cpu_reference());
    std::vector<float> out(qs.q.size()), plain(qs.q.size());
    scored(*c.ops, ws.get(), qs.rows(dim), out.data(), scores.data());
    c.ops->attend_specache(qs.rows(dim), lowbit, fetched, ws.get(), plain.data());
    expect_bits(out, plain, "attend_specache_scored" + d + " = attend_specache");
    // The fetched rows' shares: the same attention with them asked for, and each row's share
    // within kSpeCacheProbRel of the reference's (its softmax over its own scores, in double).
    std::vector<float> shares(rows, NAN), want_shares(rows, NAN);
    scored(*c.ops, ws.get(), qs.rows(dim), out.data(), scores.data(), shares.data());
    expect_bits(out, plain, "attend_specache_scored" + d + " with shares = attend_specache");
    scored(cpu_reference(), ref_ws.get(), qs.rows(dim), out.data(), want_scores.data(),
           want_shares.data());
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_NEAR(shares[r], want_shares[r], kSpeCacheProbRel * want_shares[r] + 1e-6f)
          << "attend_specache_scored" << d << " fetched share of row " << r;
      if (!fetched.tokens.empty()) ASSERT_GT(want_shares[r], 0.0f) << d << " row " << r;
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    float largest = 0.0f;
    for (size_t t = 0; t < n; ++t) {
      if (std::isfinite(want_scores[r * n + t])) {
        largest = std::max(largest, std::fabs(want_scores[r * n + t]));
      }
    }
    for (size_t t = 0; t < n; ++t) {
      const float w = want_scores[r * n + t], g = scores[r * n + t];
      if (std::isinf(w)) {  // masked: the same -inf
        ASSERT_EQ(g, w) << "attend_specache_scored" << d << " score " << r << "," << t;
      } else {
        ASSERT_NEAR(g, w, kSpeCacheScoreRel * largest) << "attend_specache_scored" << d << " score "
                                               << r << "," << t;
      }
    }
  }
  // Each query's rows (group rows at one position) select as specache_select does.
  for (size_t first_row : {size_t(0), group}) {
    QueryRows r = qs.rows(dim);
    r.q += first_row * dim;
    r.positions += first_row;
    r.n_rows = group;
    const std::string what =
        "specache_select_scored" + d + (first_row ? " causal" : " decode");
    for (size_t k : {size_t(16), size_t(0)}) {
      const std::string wk = what + " k=" + std::to_string(k);
      const SelectFn from_scores = [&](const Ops& o, Workspace& ws, std::vector<uint32_t>& t,
                                       std::vector<float>& p) {
        std::vector<float> out(r.n_rows * dim), s(r.n_rows * n);
        scored(o, ws, r, out.data(), s.data());
        o.specache_select_scored(s.data(), group, n, k, ws, t, &p);
      };
      check_selection(c, k, wk, from_scores);
      WorkspaceHandle ws(*c.ops);
      std::vector<uint32_t> t1, t2;
      std::vector<float> p1, p2;
      from_scores(*c.ops, ws.get(), t1, p1);
      c.ops->specache_select(r, lowbit, k, ws.get(), t2, &p2);
      EXPECT_EQ(t1, t2) << wk << " = specache_select";
      expect_bits(p1, p2, wk + " = specache_select");
    }
  }
}

// SpindleKV's fused kernel (spindlekv_attention.cpp) beyond the case above: every RoPE style, a
// head dim that is no multiple of 16, GQA groups of 1, 3 and 8 (8: 17 rows, two row blocks),
// token counts that end mid-group and mid-block, tokens that share codebook entries (every third
// key and every second value a scaled copy of an older one, so entries hold several tokens with
// their own magnitudes), positions with gaps and going back (offsets outside the kernel's
// rotation table), and a query row that sees no token. The attention tolerances hold with room:
// the largest gap measured here is 2.7e-7 of max |v| (under 1% of the tolerance).
TEST(BackendOps, AttendSpindleStylesSharedEntriesAndGaps) {
  for_each_backend([](const Candidate& c) {
    for (kvsdk_rope_style style : {KVSDK_ROPE_INTERLEAVED, KVSDK_ROPE_HALF, KVSDK_ROPE_NONE}) {
      for (size_t dim : {size_t(40), size_t(64), size_t(128)}) {  // 40: channels past 16 lanes
        for (size_t n : {size_t(37), size_t(300)}) {
          for (bool gaps : {false, true}) {
            const uint32_t seed = uint32_t(dim + n + style);
            std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
            std::vector<int32_t> pos(n);
            for (size_t t = 0; t < n; ++t) {
              pos[t] = gaps ? int32_t(t + (t >= 20 ? 1000 : 0) + (t >= 150 ? 37 * (t % 5) : 0))
                            : int32_t(t + 5000);
            }
            const cpu::Rope rope(dim, 10000.0f, style);
            for (size_t t = 0; t < n; ++t) {
              if (t >= 2 && t % 3 == 2) {
                for (size_t d = 0; d < dim; ++d) k[t * dim + d] = 1.7f * k[(t - 2) * dim + d];
              }
              if (t % 2 == 1) {
                for (size_t d = 0; d < dim; ++d) v[t * dim + d] = 0.6f * v[(t - 1) * dim + d];
              }
            }
            for (size_t t = 0; t < n; ++t) rope.apply(&k[t * dim], pos[t]);  // the host's RoPE
            cpu::SpindleHeadStore spindle(dim, 10000.0f, style);
            spindle.append(k.data(), v.data(), pos.data(), n);
            ASSERT_LT(spindle.keys().entries(), n);
            ASSERT_LT(spindle.values().entries(), n);
            for (size_t group : {size_t(1), size_t(3), size_t(8)}) {
              Queries qs = make_queries(group, dim, n, seed + 2);
              for (size_t r = group; r < 2 * group; ++r) qs.pos[r] = pos[n / 2];
              const std::vector<float> blind = gaussian(dim, seed + 3);
              qs.q.insert(qs.q.end(), blind.begin(), blind.end());
              qs.pos.push_back(-1);  // before every token: zeros
              const std::string what = "attend_spindle style " + std::to_string(style) + " dim " +
                                       std::to_string(dim) + " tokens " + std::to_string(n) +
                                       " group " + std::to_string(group) +
                                       (gaps ? " gaps" : "");
              check_attend(c, qs.q.size(), max_abs(v), false, what,
                           [&](const Ops& o, Workspace& ws, float* out) {
                             o.attend_spindle(qs.rows(dim), spindle, ws, out);
                           });
            }
          }
        }
      }
    }
  });
}

TEST(BackendOps, AttendOverCodebookMergedAndSpeculativeTiers) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      const size_t n = 300, group = 4;
      const uint32_t seed = uint32_t(dim);
      const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
      const std::vector<float> k2 = gaussian(n * dim, seed + 2), v2 = gaussian(n * dim, seed + 3);
      const std::vector<int32_t> pos = iota_positions(n);
      const Queries qs = make_queries(group, dim, n, seed + 4);
      const std::string d = " dim " + std::to_string(dim);

      cpu::SpindleHeadStore spindle(dim, 10000.0f, KVSDK_ROPE_HALF);
      spindle.append(k.data(), v.data(), pos.data(), n);
      check_attend(c, qs.q.size(), max_abs(v), false, "attend_spindle" + d,
                   [&](const Ops& o, Workspace& ws, float* out) {
                     o.attend_spindle(qs.rows(dim), spindle, ws, out);
                   });

      cpu::MiniCacheHeadPair pair(dim, cpu::MiniCacheConfig{});
      pair.append(k.data(), v.data(), k2.data(), v2.data(), pos.data(), n);
      cpu::MiniCacheKiviPair kpair(dim, cpu::MiniCacheConfig{}, cpu::KiviConfig{4, 32, 64});
      kpair.append(k.data(), v.data(), k2.data(), v2.data(), pos.data(), n);
      // The layer's rows waiting for its partner: 37 exact rows after the pair's (positions
      // n.., so the causal rows of make_queries see none of them and the decode rows all).
      const size_t n_pend = 37;
      std::vector<uint16_t> pk(n_pend * dim), pv(n_pend * dim);
      cpu_reference().f32_to_f16(k2.data(), pk.size(), pk.data());
      cpu_reference().f32_to_f16(v2.data(), pv.size(), pv.data());
      std::vector<int32_t> ppos(n_pend);
      for (size_t i = 0; i < n_pend; ++i) ppos[i] = int32_t(n + i);
      for (int layer : {0, 1}) {
        for (bool with_pending : {false, true}) {
          const F16Rows pending =
              with_pending ? F16Rows{pk.data(), pv.data(), ppos.data(), n_pend} : F16Rows{};
          const std::string p = with_pending ? " pending" : "";
          const std::string l = " layer " + std::to_string(layer);
          check_attend(c, qs.q.size(), max_abs(v), false, "attend_minicache" + d + l + p,
                       [&](const Ops& o, Workspace& ws, float* out) {
                         o.attend_minicache(qs.rows(dim), pair, layer, pending, ws, out);
                       });
          check_attend(c, qs.q.size(), max_abs(v), false, "attend_minicache_kivi" + d + l + p,
                       [&](const Ops& o, Workspace& ws, float* out) {
                         o.attend_minicache_kivi(qs.rows(dim), kpair, layer, pending, ws, out);
                       });
        }
      }

      // 7-bit value weights: what a 'specache' policy resolves for its 2-bit copy (the 14-bit
      // kernel is the attend_kivi cases').
      cpu::KiviHeadStore lowbit(dim, cpu::KiviConfig{2, 32, 64, 7});
      lowbit.append(k.data(), v.data(), pos.data(), n);
      cpu::SpeCacheFetched fetched;
      for (uint32_t t = 3; t < n; t += 17) {
        fetched.tokens.push_back(t);
        for (size_t i = 0; i < dim; ++i) {
          fetched.k.push_back(0x3c00);  // 1.0 in f16: visibly different from the low-bit row
          fetched.v.push_back(0xc000);  // -2.0
        }
      }
      check_attend(c, qs.q.size(), 2.0f, false, "attend_specache" + d,
                   [&](const Ops& o, Workspace& ws, float* out) {
                     o.attend_specache(qs.rows(dim), lowbit, fetched, ws, out);
                   },
                   attend_kivi_abs(lowbit.config().weight_bits));

      // SpeCache selection: the group's rows of one query position (the decode query, which sees
      // everything, and a causal one that sees 2/3 of the tokens).
      const Queries sel = make_queries(group, dim, n, seed + 5);
      for (size_t first_row : {size_t(0), group}) {
        QueryRows r = sel.rows(dim);
        r.q += first_row * dim;
        r.positions += first_row;
        r.n_rows = group;
        const std::string what = "specache_select" + d + (first_row ? " causal" : " decode");
        check_specache_select(c, r, lowbit, 16, what);
        check_specache_select(c, r, lowbit, 0, what + " k=0");  // probabilities only (hit rate)
      }
      check_specache_scored(c, sel, group, dim, lowbit, fetched, d);
    }
  });
}

// ---- SpeCache over raw buffers ---------------------------------------------------------------
// attend_specache_tier / specache_scores_tier: a device SpeCache store's low-bit copy as a KIVI
// tier and its residual rows, the fetched rows and their tokens as buffers. Over every KIVI bit
// width, head dims 64/128/256, full and ragged key blocks, with and without residual rows, with
// fetched tokens in both parts of the copy or none, and query rows that see everything, a prefix
// or nothing. Attention: the reference entry is the reference's attend_specache of the same copy
// and rows bit for bit; the optimized one is within the KIVI tolerance (it is its own
// attend_specache, the fused KIVI kernel). Scores: the reference's are its
// attend_specache_scored's bit for bit (cpu::specache_score_chunk); the optimized table's are its
// own attend_specache_scored's bit for bit (fast::kivi_scores) and within kSpeCacheScoreRel of
// the row's largest |score| of the reference's, with -inf in the same places.

// A store's buffers as a tier (`with_residual` false: the quantized tokens alone are the copy).
struct TierBuffers {
  KiviTier tier;
  F16Rows residual;
  std::vector<uint32_t> starts;  // each key block's first quantized token (ragged stores)
};
void tier_buffers(const cpu::KiviHeadStore& s, bool with_residual, TierBuffers& b) {
  const size_t nq = s.quantized_tokens();
  b.starts.clear();
  uint32_t start = 0;
  for (uint32_t n : s.block_token_counts()) b.starts.push_back(start), start += n;
  KiviTier& t = b.tier;
  t.k_codes = s.key_codes().data(), t.v_codes = s.value_codes().data();
  t.k_scale = s.key_scales().data(), t.k_zero = s.key_zeros().data();
  t.v_scale = s.value_scales().data(), t.v_zero = s.value_zeros().data();
  t.positions = s.positions().data(), t.tokens = nq;
  t.bits = s.config().bits, t.group = s.config().group, t.residual = s.config().residual;
  t.weight_bits = s.config().weight_bits;
  t.block_starts = s.ragged() ? b.starts.data() : nullptr;
  t.blocks = s.ragged() ? b.starts.size() : 0;
  b.residual = with_residual ? F16Rows{s.residual_keys().data(), s.residual_values().data(),
                                       s.positions().data() + nq, s.residual_tokens()}
                             : F16Rows{};
}

// One SpeCache case: the store, the copy its tier makes, the fetched rows (as buffers and as the
// CPU's SpeCacheFetched) and query rows.
struct SpeCacheTierCase {
  cpu::KiviHeadStore store{64, cpu::KiviConfig{}};  // (replaced by make_specache_tier_case)
  TierBuffers b;
  cpu::SpeCacheFetched fetched;
  std::vector<int32_t> fetched_pos;  // the fetched tokens' positions in the copy
  Queries qs;
  float max_v = 0.0f;
  size_t copy_tokens() const { return b.tier.tokens + b.residual.n_tokens; }
  F16Rows fetched_rows() const {
    return {fetched.k.data(), fetched.v.data(), fetched_pos.data(), fetched.tokens.size()};
  }
};

void make_specache_tier_case(size_t dim, uint32_t bits, bool ragged, bool with_residual,
                             bool with_fetch, SpeCacheTierCase& c) {
  const uint32_t seed = uint32_t(11 * dim + bits);
  const uint32_t wbits = bits == 2 ? 7 : 14;  // 7: what a 'specache' policy resolves for 2 bits
  const size_t n = 170, group = 4;
  c.store = cpu::KiviHeadStore(dim, cpu::KiviConfig{bits, 32, 64, wbits});
  const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
  const std::vector<int32_t> pos = iota_positions(n);
  c.store.append(k.data(), v.data(), pos.data(), n);
  if (ragged) {
    std::vector<uint32_t> keep;
    for (uint32_t t = 0; t < n; ++t) {
      if (t % 4 != 2) keep.push_back(t);
    }
    c.store.retain(keep);
  }
  tier_buffers(c.store, with_residual, c.b);
  const size_t copy = c.copy_tokens();
  c.fetched = cpu::SpeCacheFetched{};
  c.fetched_pos.clear();
  if (with_fetch) {
    // Rows unlike the low-bit ones (other values, larger keys), so a substitution shows.
    const std::vector<float> fk = gaussian(copy * dim, seed + 2, 2.0f);
    const std::vector<float> fv = gaussian(copy * dim, seed + 3, 3.0f);
    for (uint32_t t = 3; t < copy; t += 13) {
      c.fetched.tokens.push_back(t);
      c.fetched_pos.push_back(c.store.positions()[t]);
      std::vector<uint16_t> row(dim);
      cpu_reference().f32_to_f16(&fk[t * dim], dim, row.data());
      c.fetched.k.insert(c.fetched.k.end(), row.begin(), row.end());
      cpu_reference().f32_to_f16(&fv[t * dim], dim, row.data());
      c.fetched.v.insert(c.fetched.v.end(), row.begin(), row.end());
    }
    c.max_v = max_abs(fv);
  }
  c.max_v = std::max(c.max_v, max_abs(v));
  // Query rows: the group at the end (decode), at the copy's middle token, and before every
  // token (sees nothing).
  c.qs.q = gaussian(3 * group * dim, seed + 4);
  c.qs.pos.clear();
  for (int32_t p : {INT32_MAX, c.store.positions()[copy / 2], -1}) {
    c.qs.pos.insert(c.qs.pos.end(), group, p);
  }
}

std::string specache_tier_name(size_t dim, uint32_t bits, bool ragged, bool with_residual,
                               bool with_fetch) {
  return "dim " + std::to_string(dim) + " bits " + std::to_string(bits) +
         (ragged ? " ragged" : "") + (with_residual ? " residual" : " no residual") +
         (with_fetch ? " fetched" : " none fetched");
}

TEST(BackendOps, AttendSpecacheTierIsAttendSpecacheOfTheSameBuffers) {
  for_each_backend([](const Candidate& c) {
    SpeCacheTierCase sc;
    // Every head_dim and width; the corners (ragged key blocks, no residual rows, nothing
    // fetched) one at a time, for the test's time (each case runs every SIMD target).
    const struct {
      bool ragged, with_residual, with_fetch;
    } corners[] = {{false, true, true}, {true, true, true}, {false, false, true},
                   {false, true, false}};
    for (size_t dim : kDims) {
      for (uint32_t bits : kBits) {
        for (const auto& corner : corners) {
          const bool ragged = corner.ragged, with_residual = corner.with_residual;
          const bool with_fetch = corner.with_fetch;
          make_specache_tier_case(dim, bits, ragged, with_residual, with_fetch, sc);
          const std::string what = "attend_specache_tier " +
                                   specache_tier_name(dim, bits, ragged, with_residual,
                                                      with_fetch);
          ASSERT_GT(sc.b.tier.tokens, 0u) << what;
          if (with_fetch) {  // fetched tokens in the quantized part, and in the residual
            ASSERT_LT(sc.fetched.tokens.front(), sc.b.tier.tokens) << what;
            if (with_residual) ASSERT_GE(sc.fetched.tokens.back(), sc.b.tier.tokens) << what;
          }
          const QueryRows rows = sc.qs.rows(dim);
          const F16Rows fetched = sc.fetched_rows();
          // The reference's entry: its attend_specache of the copy the buffers make.
          const cpu::KiviHeadStore copy =
              with_residual ? cpu::KiviHeadStore::restore(dim, sc.store.config(),
                                                          sc.store.buffers())
                            : cpu::kivi_store_from_tier(sc.b.tier, F16Rows{}, dim);
          std::vector<float> tier_out(sc.qs.q.size()), store_out(sc.qs.q.size());
          WorkspaceHandle ws(cpu_reference());
          cpu_reference().attend_specache_tier(rows, sc.b.tier, sc.b.residual, fetched,
                                               sc.fetched.tokens.data(), ws.get(),
                                               tier_out.data());
          cpu_reference().attend_specache(rows, copy, sc.fetched, ws.get(), store_out.data());
          expect_bits(tier_out, store_out, what + " (reference: attend_specache's bits)");
          for (size_t i = 2 * 4 * dim; i < tier_out.size(); ++i) {  // sees nothing: zeros
            ASSERT_EQ(tier_out[i], 0.0f) << what;
          }
          check_attend(c, sc.qs.q.size(), sc.max_v, false, what,
                       [&](const Ops& o, Workspace& w, float* out) {
                         o.attend_specache_tier(rows, sc.b.tier, sc.b.residual, fetched,
                                                sc.fetched.tokens.data(), w, out);
                       },
                       attend_kivi_abs(sc.store.config().weight_bits));
        }
      }
    }
  });
}

// The CPU tables check the fetched tokens (a device table cannot read them): strictly
// ascending, within the copy.
TEST(BackendOps, AttendSpecacheTierRejectsBadFetchedTokens) {
  SpeCacheTierCase sc;
  make_specache_tier_case(64, 2, false, true, true, sc);
  const size_t copy = sc.copy_tokens();
  for (const Ops* ops : {&cpu_reference(), &cpu_optimized()}) {
    for (const std::vector<uint32_t>& tokens :
         {std::vector<uint32_t>{5, 3}, std::vector<uint32_t>{3, 3},
          std::vector<uint32_t>{3, uint32_t(copy)}}) {
      std::vector<uint16_t> rows(tokens.size() * 64, 0x3c00);
      const std::vector<int32_t> pos(tokens.size(), 0);
      const F16Rows fetched{rows.data(), rows.data(), pos.data(), tokens.size()};
      std::vector<float> out(sc.qs.q.size());
      WorkspaceHandle ws(*ops);
      kvsdk_status status = KVSDK_OK;
      try {
        ops->attend_specache_tier(sc.qs.rows(64), sc.b.tier, sc.b.residual, fetched,
                                  tokens.data(), ws.get(), out.data());
      } catch (const Error& e) {
        status = e.status();
      }
      EXPECT_EQ(status, KVSDK_E_INVALID_ARG) << ops->name << " tokens " << tokens[0] << ", "
                                             << tokens[1];
    }
  }
}

TEST(BackendOps, SpecacheScoresTierAreTheSelectionsScores) {
  for_each_backend([](const Candidate& c) {
    SpeCacheTierCase sc;
    const struct {
      bool ragged, with_residual;
    } corners[] = {{false, true}, {true, true}, {false, false}};  // (for the test's time)
    for (size_t dim : kDims) {
      for (uint32_t bits : kBits) {
        for (const auto& corner : corners) {
          const bool ragged = corner.ragged, with_residual = corner.with_residual;
          make_specache_tier_case(dim, bits, ragged, with_residual, false, sc);
          const std::string what =
              "specache_scores_tier " +
              specache_tier_name(dim, bits, ragged, with_residual, false);
          const QueryRows rows = sc.qs.rows(dim);
          const size_t n = sc.copy_tokens(), nr = rows.n_rows;
          const cpu::KiviHeadStore copy =
              cpu::kivi_store_from_tier(sc.b.tier, sc.b.residual, dim);
          // Each table's scores over the copy: its attend_specache_scored's.
          const auto scores_of = [&](const Ops& o, bool tier) {
            WorkspaceHandle ws(o);
            std::vector<float> s(nr * n, NAN), out(nr * dim);
            if (tier) {
              o.specache_scores_tier(rows, sc.b.tier, sc.b.residual, ws.get(), s.data());
            } else {
              o.attend_specache_scored(rows, copy, sc.fetched, ws.get(), out.data(), s.data(),
                                       nullptr);
            }
            return s;
          };
          const std::vector<float> got = scores_of(*c.ops, true);
          expect_bits(got, scores_of(*c.ops, false), what + " (= attend_specache_scored's)");
          const std::vector<float> want = scores_of(cpu_reference(), true);
          for (size_t r = 0; r < nr; ++r) {
            float largest = 0.0f;
            size_t visible = 0;
            for (size_t t = 0; t < n; ++t) {
              const float w = want[r * n + t];
              if (std::isfinite(w)) largest = std::max(largest, std::fabs(w)), ++visible;
            }
            if (sc.qs.pos[r] == INT32_MAX) ASSERT_EQ(visible, n) << what << " row " << r;
            if (sc.qs.pos[r] < 0) ASSERT_EQ(visible, 0u) << what << " row " << r;
            for (size_t t = 0; t < n; ++t) {
              const float w = want[r * n + t], g = got[r * n + t];
              if (std::isinf(w)) {
                ASSERT_EQ(g, w) << what << " score " << r << "," << t;
              } else {
                ASSERT_NEAR(g, w, kSpeCacheScoreRel * largest)
                    << what << " score " << r << "," << t;
              }
            }
          }
        }
      }
    }
  });
}

// MiniCache's fused kernel (fast::attend_scaled_f16: merged tokens read as f16 direction times
// magnitude, retained tokens as f16 rows, never restored to f32) on the shapes the loop above
// leaves out: dims that are not a multiple of 16 (the dot products' tail channels) or of the
// vector width, GQA groups of 1, 3 (the demo model's) and 8, token counts across the 64-token
// segments, pairs grown by a prefill and then decode appends (retained tokens interleaved with
// merged ones by the threshold), an empty pair with only pending rows, and nothing at all. Same
// tolerance as the other attention kernels: the fused kernel's score m * (q . e) differs from the
// reference's q . (m * e) only by rounding.
TEST(BackendOps, AttendMiniCacheFusedOnRaggedShapes) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : {size_t(72), size_t(100)}) {
      for (size_t group : {size_t(1), size_t(3), size_t(8)}) {
        for (size_t n : {size_t(0), size_t(1), size_t(37), size_t(613)}) {
          const uint32_t seed = uint32_t(7 * dim + 3 * group + n);
          const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
          const std::vector<float> k2 = gaussian(n * dim, seed + 2);
          const std::vector<float> v2 = gaussian(n * dim, seed + 3, 3.0f);
          const std::vector<int32_t> pos = iota_positions(n);
          cpu::MiniCacheHeadPair pair(dim, cpu::MiniCacheConfig{0.6f, 0.2f});
          const size_t prefill = n / 2;  // then decode appends of one token each
          pair.append(k.data(), v.data(), k2.data(), v2.data(), pos.data(), prefill);
          for (size_t t = prefill; t < n; ++t) {
            pair.append(k.data() + t * dim, v.data() + t * dim, k2.data() + t * dim,
                        v2.data() + t * dim, pos.data() + t, 1);
          }
          const Queries qs = make_queries(group, dim, n, seed + 4);
          const size_t n_pend = 5;
          const std::vector<float> pkf = gaussian(n_pend * dim, seed + 5);
          const std::vector<float> pvf = gaussian(n_pend * dim, seed + 6);
          std::vector<uint16_t> pk(n_pend * dim), pv(n_pend * dim);
          cpu_reference().f32_to_f16(pkf.data(), pk.size(), pk.data());
          cpu_reference().f32_to_f16(pvf.data(), pv.size(), pv.data());
          std::vector<int32_t> ppos(n_pend);
          for (size_t i = 0; i < n_pend; ++i) ppos[i] = int32_t(n + i);
          const float max_v = std::max({max_abs(v), max_abs(v2), max_abs(pvf)});
          for (int layer : {0, 1}) {
            for (bool with_pending : {false, true}) {
              const F16Rows pending =
                  with_pending ? F16Rows{pk.data(), pv.data(), ppos.data(), n_pend} : F16Rows{};
              const std::string what = "attend_minicache dim " + std::to_string(dim) +
                                       " group " + std::to_string(group) + " tokens " +
                                       std::to_string(n) + " layer " + std::to_string(layer) +
                                       (with_pending ? " pending" : "");
              check_attend(c, qs.q.size(), max_v, false, what,
                           [&](const Ops& o, Workspace& ws, float* out) {
                             o.attend_minicache(qs.rows(dim), pair, layer, pending, ws, out);
                           });
            }
          }
        }
      }
    }
  });
}

// ---- window scoring, pooling, top-k, gather ---------------------------------------------------

TEST(BackendOps, WindowScoringMatchesTheReferenceExactly) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      for (size_t group : kGroups) {
        for (size_t n : kTokens) {
          const uint32_t seed = uint32_t(dim + group + n);
          const std::vector<float> k = gaussian(n * dim, seed);
          const std::vector<int32_t> pos = iota_positions(n);
          const Queries qs = make_queries(group, dim, n, seed + 1);
          const cpu::KeyChunkLoader src = [&](size_t first, size_t cnt, float* out) {
            std::memcpy(out, k.data() + first * dim, cnt * dim * 4);
          };
          std::vector<float> want(n, 0.5f), got(n, 0.5f);  // sums add to what is there
          WorkspaceHandle ref_ws(cpu_reference()), ws(*c.ops);
          cpu_reference().column_sums(qs.rows(dim), src, pos.data(), n, ref_ws.get(), want.data());
          c.ops->column_sums(qs.rows(dim), src, pos.data(), n, ws.get(), got.data());
          expect_bits(got, want, "column_sums");
        }
      }
    }
  });
}

TEST(BackendOps, PoolingSelectionAndGatherMatchTheReferenceExactly) {
  for_each_backend([](const Candidate& c) {
    WorkspaceHandle ref_ws(cpu_reference()), ws(*c.ops);
    for (size_t n : kTokens) {
      const std::vector<float> s = gaussian(n, uint32_t(n));
      for (int kernel : {1, 3, 7}) {
        for (kvsdk_pool_kind kind : {KVSDK_POOL_MAX, KVSDK_POOL_AVG}) {
          std::vector<float> want(n), got(n);
          cpu_reference().pool(s.data(), n, kernel, kind, want.data());
          c.ops->pool(s.data(), n, kernel, kind, got.data());
          expect_bits(got, want, "pool");
        }
      }
      for (size_t k : {size_t(0), n / 2, n}) {
        std::vector<uint32_t> want, got;
        cpu_reference().select_keep(n, k, 4, 8, s.data(), ref_ws.get(), want);
        c.ops->select_keep(n, k, 4, 8, s.data(), ws.get(), got);
        EXPECT_EQ(got, want);
        cpu_reference().select_keep(n, k, 4, 8, nullptr, ref_ws.get(), want);
        c.ops->select_keep(n, k, 4, 8, nullptr, ws.get(), got);
        EXPECT_EQ(got, want);
        // Compaction in place, as the stores do it.
        std::vector<float> a = s, b = s;
        cpu_reference().gather_rows(a.data(), 4, got.data(), got.size(), a.data());
        c.ops->gather_rows(b.data(), 4, got.data(), got.size(), b.data());
        expect_bits(b, a, "gather_rows");
      }
    }
  });
}

// ---- codebook reconstruction, merge / restore -------------------------------------------------

TEST(BackendOps, ReconstructionAndMergeMatchTheReferenceExactly) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      const size_t entries = 5, rows = 37;
      const std::vector<float> e = gaussian(entries * dim, uint32_t(dim));
      std::vector<uint16_t> e16(e.size());
      cpu_reference().f32_to_f16(e.data(), e.size(), e16.data());
      std::vector<uint32_t> index(rows);
      std::vector<float> mag(rows);
      for (size_t i = 0; i < rows; ++i) index[i] = uint32_t(i * 7 % entries), mag[i] = 0.5f + i;
      std::vector<float> want(rows * dim), got(rows * dim);
      cpu_reference().codebook_reconstruct(e16.data(), index.data(), mag.data(), rows, dim,
                                           want.data());
      c.ops->codebook_reconstruct(e16.data(), index.data(), mag.data(), rows, dim, got.data());
      expect_bits(got, want, "codebook_reconstruct");

      std::vector<float> w1(dim), g1(dim);
      cpu_reference().restore_row(e16.data(), 3.25f, dim, w1.data());
      c.ops->restore_row(e16.data(), 3.25f, dim, g1.data());
      expect_bits(g1, w1, "restore_row");
      for (float t : {0.0f, 0.6f, 1.0f}) {
        cpu_reference().merge_slerp(e.data(), e.data() + dim, dim, t, w1.data());
        c.ops->merge_slerp(e.data(), e.data() + dim, dim, t, g1.data());
        expect_bits(g1, w1, "merge_slerp");
      }
    }
  });
}

// ---- SmallKV (Eq. 6) -----------------------------------------------------------------------------

// The proxy's softmax: probabilities within kProbRel of the reference's plus kProbAbs (the SIMD
// dot product and exp round differently from the reference's double softmax with the portable
// exp), the same bits on every SIMD target, and a reused workspace changes nothing.
TEST(BackendOps, SmallKvSoftmaxWithinToleranceOfTheReference) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      for (size_t group : kGroups) {
        for (size_t n : kTokens) {
          const uint32_t seed = uint32_t(dim * 5 + group * 11 + n);
          const std::vector<float> k = gaussian(n * dim, seed, 2.0f);
          std::vector<uint16_t> k16(k.size());
          cpu_reference().f32_to_f16(k.data(), k.size(), k16.data());
          std::vector<int32_t> pos = iota_positions(n);
          std::reverse(pos.begin(), pos.end());  // the op must not assume position order
          const Queries qs = make_queries(group, dim, n, seed + 1);
          const std::string what = "smallkv_softmax dim " + std::to_string(dim) + " group " +
                                   std::to_string(group) + " tokens " + std::to_string(n);
          const size_t size = qs.pos.size() * n;
          WorkspaceHandle ref_ws(cpu_reference()), ws(*c.ops);
          std::vector<float> want(size, NAN), got(size, NAN), again(size, NAN);
          cpu_reference().smallkv_softmax(qs.rows(dim), k16.data(), pos.data(), n, ref_ws.get(),
                                          want.data());
          c.ops->smallkv_softmax(qs.rows(dim), k16.data(), pos.data(), n, ws.get(), got.data());
          c.ops->smallkv_softmax(qs.rows(dim), k16.data(), pos.data(), n, ws.get(),
                                 again.data());
          expect_bits(again, got, what + " (reused workspace)");
          // Each row alone gives its row's bits of the call with every row.
          for (size_t r = 0; r < qs.pos.size(); ++r) {
            const QueryRows one{qs.q.data() + r * dim, qs.pos.data() + r, 1, dim,
                                qs.rows(dim).scale};
            std::vector<float> row(n, NAN);
            c.ops->smallkv_softmax(one, k16.data(), pos.data(), n, ws.get(), row.data());
            expect_bits(row, std::vector<float>(got.begin() + long(r * n),
                                                got.begin() + long((r + 1) * n)),
                        what + " row " + std::to_string(r) + " alone");
          }
          if (c.ops == &cpu_reference()) {
            expect_bits(got, want, what);
            continue;
          }
          for (size_t i = 0; i < size; ++i) {
            ASSERT_NEAR(got[i], want[i], kProbRel * want[i] + kProbAbs) << what << " " << i;
            // Masked tokens are exactly 0 in both.
            ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0f) << what << " " << i;
          }
          static std::map<std::string, std::vector<float>> first_target;
          const auto [it, inserted] = first_target.emplace(what, got);
          if (!inserted) expect_bits(got, it->second, what + " (same bits on every SIMD target)");
        }
      }
    }
  });
}

// Eq. 6: full rows (even positions) with the large model's softmax rescaled by the mass the proxy
// leaves them, and value-only rows (odd positions) weighted by given proxy probabilities (rows of
// a wider stride). The softmax over the full rows is the SIMD attention's: kAttendRel/kAttendAbs.
TEST(BackendOps, AttendSmallKvWithinToleranceOfTheReference) {
  for_each_backend([](const Candidate& c) {
    for (size_t dim : kDims) {
      for (size_t group : kGroups) {
        for (size_t n : kTokens) {
          const size_t nm = n / 2 + 1, stride = nm + 3;
          const uint32_t seed = uint32_t(dim * 3 + group * 13 + n);
          const std::vector<float> k = gaussian(n * dim, seed), v = gaussian(n * dim, seed + 1);
          const std::vector<float> vm = gaussian(nm * dim, seed + 2, 3.0f);
          std::vector<uint16_t> k16(k.size()), v16(v.size()), vm16(vm.size());
          cpu_reference().f32_to_f16(k.data(), k.size(), k16.data());
          cpu_reference().f32_to_f16(v.data(), v.size(), v16.data());
          cpu_reference().f32_to_f16(vm.data(), vm.size(), vm16.data());
          std::vector<int32_t> pos(n), mpos(nm);
          for (size_t t = 0; t < n; ++t) pos[t] = int32_t(2 * t);
          for (size_t t = 0; t < nm; ++t) mpos[t] = int32_t(2 * t + 1);
          const Queries qs = make_queries(group, dim, 2 * n, seed + 3);
          std::vector<float> w = gaussian(qs.pos.size() * stride, seed + 4);
          for (float& x : w) x = std::fabs(x) / float(2 * nm);  // a mass of about 0.4
          const F16Rows full{k16.data(), v16.data(), pos.data(), n};
          const SmallKvMarginal marg{vm16.data(), mpos.data(), nm, w.data(), stride};
          check_attend(c, qs.q.size(), std::max(max_abs(v), max_abs(vm)), false,
                       "attend_smallkv dim " + std::to_string(dim) + " group " +
                           std::to_string(group) + " tokens " + std::to_string(n),
                       [&](const Ops& o, Workspace& ws, float* out) {
                         o.attend_smallkv(qs.rows(dim), full, marg, ws, out);
                       });
          // The two halves (the full rows before the proxy's probabilities exist, then the
          // marginal term) give the one call's bits on the same backend.
          const std::string what = "smallkv_add_marginal after attend_smallkv without marginal "
                                   "rows, dim " + std::to_string(dim) + " group " +
                                   std::to_string(group) + " tokens " + std::to_string(n) +
                                   " on " + c.name;
          WorkspaceHandle ws(*c.ops);
          std::vector<float> one(qs.q.size(), NAN), halves(qs.q.size(), NAN);
          c.ops->attend_smallkv(qs.rows(dim), full, marg, ws.get(), one.data());
          c.ops->attend_smallkv(qs.rows(dim), full, SmallKvMarginal{}, ws.get(), halves.data());
          c.ops->smallkv_add_marginal(qs.rows(dim), marg, ws.get(), halves.data());
          expect_bits(halves, one, what);
        }
      }
    }
  });
}

// The table names its backend, and every context backend kind maps to its table.
TEST(BackendOps, ContextKindsSelectTheirTables) {
  EXPECT_EQ(ops_for(KVSDK_BACKEND_CPU), &cpu_optimized());
  EXPECT_EQ(ops_for(KVSDK_BACKEND_CPU_REFERENCE), &cpu_reference());
  // CUDA: the build's own table (a device one), or none in a build without CUDA.
  const DeviceBackend* cuda = cuda_backend();
  EXPECT_EQ(ops_for(KVSDK_BACKEND_CUDA), cuda ? cuda->ops : nullptr);
  if (cuda) EXPECT_TRUE(cuda->ops->device_memory);
  EXPECT_STREQ(cpu_reference().name, "cpu-reference");
  EXPECT_STREQ(cpu_optimized().name, "cpu-optimized");
  EXPECT_FALSE(cpu_reference().device_memory);
  EXPECT_FALSE(cpu_optimized().device_memory);
}

}  // namespace
}  // namespace kvsdk::backend
