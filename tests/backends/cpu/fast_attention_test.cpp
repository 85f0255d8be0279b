// The optimized decode attention (backends/cpu/fast_attention.h) against the reference backend
// (cpu::OnlineAttention, fed the rows the f16 tier or KiviHeadStore::read_rows gives), its same
// bits on every compiled SIMD target, and a digest of fixed inputs pinned to a constant so x86-64
// and aarch64 (ctest under qemu-aarch64) are checked to agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.h"
#include "fast_attention.h"
#include "test_util.h"
#include "kivi_attention.h"
#include "kivi_quant.h"
#include "kivi_store.h"
#include "portable_math.h"
#include "util/half.h"

namespace kvsdk::cpu {
namespace {

// Tolerances. Both kernels compute exact softmax attention over the same (dequantized) rows; they
// differ only in rounding: the dot products sum channels in another order (16 lanes + tree vs the
// reference's 4 partial sums), KIVI keys are split as q.z + sum (q s) code (cancellation against
// q.z adds about eps * sum|q z|), KIVI values as (p s) code + p z, and exp is a different ~1-2 ulp
// implementation. Each is a relative error of a few eps (6e-8) on a score of magnitude
// sum|q_c k_c| * scale (<= ~100 for the data below), i.e. score errors below ~1e-5, and an output
// error of that times max|v|, plus a few eps of |out|. The bound below is ~10x the largest gap
// seen over these cases (max |diff| / max|v| ~ 2e-6) and far below any real bug (a wrong code,
// scale, mask or rescale moves outputs by > 1e-2 of max|v|).
constexpr float kRelTol = 1e-5f;  // of |reference|
constexpr float kAbsTol = 3e-5f;  // of max |v| of the head
// KIVI runs its dot products on integers (fast_attention.h): per block and row the query times
// the key scales is rounded to 15-bit codes, and per segment, row and value group the weights
// p * value scale to 14-bit codes, i.e. each term is off by at most 2^-15 of the largest term of
// its sum (finer than the f16 storage of the scales themselves, 2^-11 relative). The largest
// effect is on sharp softmaxes (q_sigma 3 below) with an outlier key channel setting the block's
// step: worst seen over these cases ~8.4e-4 of max|v| (x86-64 and aarch64 alike: the integers
// are exact), bounded here with ~2.4x margin; a wrong code, scale, mask or rescale moves outputs
// by > 1e-2 of max|v|. KIVI-2's own quantization error is ~1e-1 of max|v|.
constexpr float kKiviAbsTol = 2e-3f;  // of max |v| of the head
// With 7-bit value weights (KiviConfig::weight_bits 7, the default of caches with 1- and 2-bit
// codes) a weight is off by up to 2^-8 of the largest weight of its segment's row and value
// group: worst seen over these cases ~2.3e-2 of max|v| (1.7e-2 to 2.3e-2 for every code width;
// the same sharp-softmax cases), bounded with ~2.2x margin. KIVI-2's own error is ~1e-1.
constexpr float kKiviByteAbsTol = 5e-2f;  // of max |v| of the head
float kivi_tol(uint32_t weight_bits) { return weight_bits == 7 ? kKiviByteAbsTol : kKiviAbsTol; }

std::vector<float> gaussian(size_t n, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (float& f : x) f = d(rng);
  return x;
}

struct Rows {
  std::vector<float> q;
  std::vector<int32_t> qpos;
  size_t n_rows, dim;
  float scale;
  fast::Queries queries() const { return {q.data(), qpos.data(), n_rows, dim, scale}; }
};

// Rows of one GQA group; positions mix "sees all", causal cut-offs and "sees nothing" (-1).
Rows make_rows(size_t n_rows, size_t dim, size_t n_tokens, std::mt19937& rng, float q_sigma) {
  Rows r{gaussian(n_rows * dim, rng, q_sigma), std::vector<int32_t>(n_rows), n_rows, dim,
         1.0f / std::sqrt(float(dim))};
  std::uniform_int_distribution<int32_t> pos(-1, int32_t(n_tokens) + 1);
  for (size_t i = 0; i < n_rows; ++i) r.qpos[i] = i % 3 == 0 ? INT32_MAX : pos(rng);
  return r;
}

// Largest |diff| / max|v| seen (printed by the tests, to keep the bounds honest).
float g_worst = 0;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float v_max,
                  const std::string& what, float abs_tol = kAbsTol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    g_worst = std::max(g_worst, std::fabs(got[i] - want[i]) / v_max);
    const float tol = abs_tol * v_max + kRelTol * std::fabs(want[i]);
    ASSERT_LE(std::fabs(got[i] - want[i]), tol) << what << " at " << i << ": " << got[i]
                                                << " vs " << want[i];
  }
}

float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float f : x) m = std::max(m, std::fabs(f));
  return m;
}

// The exact tier's reference path: f16 rows widened to f32 chunks, then OnlineAttention.
std::vector<float> reference_f16(const Rows& r, const std::vector<uint16_t>& k,
                                 const std::vector<uint16_t>& v, const std::vector<int32_t>& pos) {
  OnlineAttention att(r.q.data(), r.qpos.data(), r.n_rows, r.dim, r.scale);
  const size_t n = pos.size(), chunk = 256;
  std::vector<float> kf(chunk * r.dim), vf(chunk * r.dim);
  for (size_t t0 = 0; t0 < n; t0 += chunk) {
    const size_t m = std::min(chunk, n - t0);
    for (size_t i = 0; i < m * r.dim; ++i) {
      kf[i] = f16_to_f32(k[t0 * r.dim + i]);
      vf[i] = f16_to_f32(v[t0 * r.dim + i]);
    }
    att.add_chunk(kf.data(), vf.data(), pos.data() + t0, m);
  }
  std::vector<float> out(r.n_rows * r.dim);
  att.finish(out.data());
  return out;
}

std::vector<float> reference_kivi(const Rows& r, const KiviHeadStore& s) {
  OnlineAttention att(r.q.data(), r.qpos.data(), r.n_rows, r.dim, r.scale);
  kivi_attend(s, att);  // read_rows chunk by chunk, then OnlineAttention
  std::vector<float> out(r.n_rows * r.dim);
  att.finish(out.data());
  return out;
}

struct F16Head {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> pos;
  float v_max;
};

F16Head make_f16_head(size_t n, size_t dim, std::mt19937& rng) {
  F16Head h;
  const std::vector<float> k = gaussian(n * dim, rng, 1.0f), v = gaussian(n * dim, rng, 2.0f);
  for (float f : k) h.k.push_back(f32_to_f16(f));
  for (float f : v) h.v.push_back(f32_to_f16(f));
  // Ascending positions with gaps (evicted tokens leave holes).
  for (size_t t = 0; t < n; ++t) h.pos.push_back(int32_t(t + t / 5));
  h.v_max = 0;
  for (uint16_t x : h.v) h.v_max = std::max(h.v_max, std::fabs(f16_to_f32(x)));
  return h;
}

TEST(FastAttention, F16MatchesReference) {
  std::mt19937 rng(11);
  fast::Scratch scratch;
  for (size_t group : {1, 4, 8}) {
    for (size_t dim : {64, 128, 256, 40}) {  // 40: channels past the last 16-lane chunk
      for (size_t n : {0, 1, 7, 63, 64, 65, 200, 333}) {
        const F16Head h = make_f16_head(n, dim, rng);
        // q_sigma 3: scores spread wide, so the running max changes and rescales happen.
        const Rows r = make_rows(group, dim, n + n / 5, rng, group == 4 ? 3.0f : 1.0f);
        std::vector<float> got(group * dim, -1.0f);
        fast::attend_f16(r.queries(), h.k.data(), h.v.data(), h.pos.data(), n, scratch,
                         got.data());
        expect_close(got, reference_f16(r, h.k, h.v, h.pos), h.v_max,
                     "f16 group " + std::to_string(group) + " dim " + std::to_string(dim) +
                         " n " + std::to_string(n));
      }
    }
  }
}

// f16_scores gives attend_f16's scores: masked tokens exactly -inf, the others within the
// kernels' score error of the reference's dot products, a softmax of them over the f16 values
// reproduces attend_f16's output, and every compiled target gives the same bits.
TEST(FastAttention, F16ScoresAreTheAttentionsScores) {
  std::mt19937 rng(12);
  fast::Scratch scratch;
  const std::vector<fast::Target> targets = fast::available_targets();
  for (size_t group : {1, 2, 5}) {
    for (size_t dim : {64, 128, 40}) {
      for (size_t n : {1, 15, 64, 65, 300}) {
        const F16Head h = make_f16_head(n, dim, rng);
        const Rows r = make_rows(group, dim, n + n / 5, rng, 2.0f);
        const std::string what =
            "group " + std::to_string(group) + " dim " + std::to_string(dim) + " n " +
            std::to_string(n);
        const size_t stride = n + 3;
        std::vector<float> first;
        for (const fast::Target& t : targets) {
          fast::force_target(t.bits);
          std::vector<float> sc(group * stride, 7.0f);
          fast::f16_scores(r.queries(), h.k.data(), h.pos.data(), n, scratch, sc.data(), stride);
          if (first.empty()) {
            first = sc;
            continue;
          }
          ASSERT_EQ(0, std::memcmp(sc.data(), first.data(), sc.size() * sizeof(float)))
              << what << ": " << t.name << " differs from " << targets[0].name;
        }
        fast::force_target(0);
        std::vector<float> out(group * dim);
        fast::attend_f16(r.queries(), h.k.data(), h.v.data(), h.pos.data(), n, scratch,
                         out.data());
        std::vector<float> from_scores(group * dim, 0.0f);
        for (size_t row = 0; row < group; ++row) {
          const float* s = first.data() + row * stride;
          EXPECT_EQ(s[n], 7.0f) << what << ": wrote past the row";
          double mx = -INFINITY, z = 0;
          for (size_t t = 0; t < n; ++t) {
            if (h.pos[t] > r.qpos[row]) {
              ASSERT_EQ(s[t], -INFINITY) << what << " row " << row << " token " << t;
              continue;
            }
            double ref = 0, mag = 0;
            for (size_t c = 0; c < dim; ++c) {
              const double x = double(r.q[row * dim + c]) * f16_to_f32(h.k[t * dim + c]);
              ref += x;
              mag += std::fabs(x);
            }
            ref *= r.scale;
            mag *= r.scale;
            ASSERT_NEAR(s[t], ref, 1e-6 * mag + 1e-6) << what << " row " << row << " token " << t;
            mx = std::max(mx, double(s[t]));
          }
          if (mx == -INFINITY) continue;  // the row sees nothing: attend_f16 gives zeros
          for (size_t t = 0; t < n; ++t) z += h.pos[t] > r.qpos[row] ? 0.0 : std::exp(s[t] - mx);
          for (size_t t = 0; t < n; ++t) {
            if (h.pos[t] > r.qpos[row]) continue;
            const double p = std::exp(s[t] - mx) / z;
            for (size_t c = 0; c < dim; ++c) {
              from_scores[row * dim + c] += float(p * f16_to_f32(h.v[t * dim + c]));
            }
          }
        }
        expect_close(out, from_scores, h.v_max, "f16_scores' softmax vs attend_f16, " + what);
      }
    }
  }
}

struct KiviCase {
  uint32_t bits, G, R;
  size_t dim, n;
  bool ragged;
  uint32_t weight_bits = 14;
};

KiviHeadStore make_store(const KiviCase& c, std::mt19937& rng, float* v_max) {
  KiviHeadStore s(c.dim, {c.bits, c.G, c.R, c.weight_bits});
  std::vector<float> k = gaussian(c.n * c.dim, rng, 1.0f), v = gaussian(c.n * c.dim, rng, 2.0f);
  for (size_t t = 0; t < c.n; ++t) k[t * c.dim + 3 % c.dim] *= 8.0f;  // an outlier key channel
  std::vector<int32_t> pos(c.n);
  for (size_t t = 0; t < c.n; ++t) pos[t] = int32_t(2 * t);
  // Two appends, so flushes happen across calls.
  const size_t half = c.n / 2;
  s.append(k.data(), v.data(), pos.data(), half);
  s.append(k.data() + half * c.dim, v.data() + half * c.dim, pos.data() + half, c.n - half);
  if (c.ragged) {  // drop about a third of the tokens: ragged key blocks, shorter residual
    std::vector<uint32_t> keep;
    for (uint32_t t = 0; t < s.size(); ++t) {
      if (rng() % 3 != 0) keep.push_back(t);
    }
    s.retain(keep);
  }
  std::vector<float> vr(s.size() * c.dim);
  s.read_rows(0, s.size(), nullptr, vr.data());
  *v_max = max_abs(vr);
  return s;
}

TEST(FastAttention, KiviMatchesReference) {
  fast::Scratch scratch;
  size_t cases = 0, ragged_blocks = 0;
  for (uint32_t wbits : {14u, 7u}) {
    std::mt19937 rng(12);  // the same stores and queries for both code widths
    for (uint32_t bits : {1u, 2u, 4u, 8u}) {
      g_worst = 0;
      for (size_t dim : {64, 128, 256, 40}) {
        // G 32 (one weight per 16 channels), 24 (a value group ends inside a 16-lane chunk),
        // 100 (key blocks longer than a softmax segment).
        for (uint32_t G : {32u, 24u, 100u}) {
          for (size_t n : {0, 1, 7, 65, 333}) {
            for (bool ragged : {false, true}) {
              const KiviCase c{bits, G, 16, dim, n, ragged, wbits};
              float v_max = 0;
              const KiviHeadStore s = make_store(c, rng, &v_max);
              if (s.ragged()) ++ragged_blocks;
              for (size_t group : {1, 4, 8}) {
                const Rows r = make_rows(group, dim, 2 * n, rng, group == 4 ? 3.0f : 1.0f);
                std::vector<float> got(group * dim, -1.0f);
                fast::attend_kivi(r.queries(), s, scratch, got.data());
                expect_close(got, reference_kivi(r, s), v_max,
                             "kivi bits " + std::to_string(bits) + " weight bits " +
                                 std::to_string(wbits) + " dim " + std::to_string(dim) + " G " +
                                 std::to_string(G) + " n " + std::to_string(n) +
                                 (ragged ? " ragged" : "") + " group " + std::to_string(group),
                             kivi_tol(wbits));
                ++cases;
              }
            }
          }
        }
      }
      std::printf("kivi %u-bit codes, %u-bit weights: worst |diff| / max|v| %g\n", bits, wbits,
                  g_worst);
    }
  }
  EXPECT_GT(ragged_blocks, 40u);  // the ragged path really ran
  EXPECT_EQ(cases, 2u * 4 * 4 * 3 * 5 * 2 * 3);
}

// A Llama-like decode shape where the quantized part dominates: the same check, bigger.
TEST(FastAttention, KiviLongHeadMatchesReference) {
  std::mt19937 rng(13);
  fast::Scratch scratch;
  for (uint32_t bits : {2u, 4u}) {
    float v_max = 0;
    const KiviHeadStore s = make_store({bits, 32, 128, 128, 3000, false}, rng, &v_max);
    ASSERT_GT(s.quantized_tokens(), 2800u);
    const Rows r = make_rows(4, 128, 6000, rng, 1.0f);
    std::vector<float> got(4 * 128);
    fast::attend_kivi(r.queries(), s, scratch, got.data());
    expect_close(got, reference_kivi(r, s), v_max, "kivi long bits " + std::to_string(bits),
                 kKiviAbsTol);
  }
}

TEST(FastAttention, ExpIsAccurate) {
  std::vector<float> x;
  for (float f = -87.0f; f <= 0.0f; f += 0.0137f) x.push_back(f);
  x.push_back(0.0f);
  x.push_back(-1e-30f);
  std::vector<float> got(x.size());
  fast::exp_f32(x.data(), x.size(), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = pmath::exp_f32(x[i]);
    // Within 2 ulp of the (nearly correctly rounded) portable exp.
    ASSERT_LE(std::fabs(got[i] - want), 2.0f * (std::nextafter(want, 2 * want + 1) - want))
        << "exp(" << x[i] << ")";
  }
  const float edge[] = {-INFINITY, -88.0f, -1000.0f};
  float out[3];
  fast::exp_f32(edge, 3, out);
  for (float o : out) EXPECT_EQ(o, 0.0f);
  EXPECT_EQ(got[got.size() - 2], 1.0f);
}

TEST(FastAttention, ScratchReservedMeansNoReallocation) {
  std::mt19937 rng(14);
  fast::Scratch scratch;
  scratch.reserve(8, 128, kivi_value_groups(128, 32));
  const size_t cap = scratch.capacity_floats();
  const float* buf = scratch.data(1);
  float v_max = 0;
  const KiviHeadStore s = make_store({2, 32, 128, 128, 500, false}, rng, &v_max);
  const F16Head h = make_f16_head(300, 128, rng);
  for (size_t group : {8, 4, 1}) {
    const Rows r = make_rows(group, 128, 1000, rng, 1.0f);
    std::vector<float> out(group * 128);
    fast::attend_kivi(r.queries(), s, scratch, out.data());
    fast::attend_f16(r.queries(), h.k.data(), h.v.data(), h.pos.data(), 300, scratch, out.data());
    EXPECT_EQ(scratch.capacity_floats(), cap);
    EXPECT_EQ(scratch.data(1), buf);  // same buffer: nothing was reallocated
  }
}

// --- split-K ----------------------------------------------------------------------------------

// Partial states for the ranges cut at `cuts` (ascending, inside [0, n]), merged in order.
struct Parts {
  std::vector<std::vector<float>> mem;
  std::vector<fast::PartialState> st;
  std::vector<std::pair<size_t, size_t>> ranges;
  Parts(size_t n_rows, size_t dim, size_t n, const std::vector<size_t>& cuts) {
    size_t at = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
      const size_t end = i < cuts.size() ? cuts[i] : n;
      ranges.push_back({at, end - at});
      at = end;
    }
    mem.resize(ranges.size(), std::vector<float>(n_rows * (dim + 2)));
    for (auto& m : mem) st.push_back({m.data(), m.data() + n_rows, m.data() + 2 * n_rows});
  }
};

std::vector<float> split_f16(const Rows& r, const F16Head& h, const std::vector<size_t>& cuts,
                             fast::Scratch& scratch) {
  Parts p(r.n_rows, r.dim, h.pos.size(), cuts);
  for (size_t i = 0; i < p.ranges.size(); ++i) {
    fast::attend_f16_partial(r.queries(), h.k.data(), h.v.data(), h.pos.data(),
                             p.ranges[i].first, p.ranges[i].second, scratch, p.st[i]);
  }
  std::vector<float> out(r.n_rows * r.dim, -1.0f);
  fast::merge_partials(p.st.data(), p.st.size(), r.n_rows, r.dim, out.data());
  return out;
}

std::vector<float> split_kivi(const Rows& r, const KiviHeadStore& s,
                              const std::vector<size_t>& cuts, fast::Scratch& scratch) {
  Parts p(r.n_rows, r.dim, s.size(), cuts);
  for (size_t i = 0; i < p.ranges.size(); ++i) {
    fast::attend_kivi_partial(r.queries(), s, p.ranges[i].first, p.ranges[i].second, scratch,
                              p.st[i]);
  }
  std::vector<float> out(r.n_rows * r.dim, -1.0f);
  fast::merge_partials(p.st.data(), p.st.size(), r.n_rows, r.dim, out.data());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Splitting a range changes only rounding (segments and lane sums restart at each range): the
// split result stays within the reference tolerance of the whole-range one, a one-part split is
// the whole-range call bit for bit, and a given split repeats bit for bit.
TEST(FastAttention, SplitKMatchesWholeRange) {
  std::mt19937 rng(21);
  fast::Scratch scratch;
  for (size_t group : {1, 4}) {
    const F16Head h = make_f16_head(333, 128, rng);
    const Rows r = make_rows(group, 128, 400, rng, group == 4 ? 3.0f : 1.0f);
    std::vector<float> whole(group * 128);
    fast::attend_f16(r.queries(), h.k.data(), h.v.data(), h.pos.data(), 333, scratch,
                     whole.data());
    EXPECT_TRUE(same_bits(split_f16(r, h, {}, scratch), whole));
    for (const std::vector<size_t>& cuts :
         std::vector<std::vector<size_t>>{{100}, {1, 64, 65, 200}, {0, 333}, {7, 7, 300}}) {
      const std::vector<float> split = split_f16(r, h, cuts, scratch);
      expect_close(split, whole, h.v_max, "f16 split " + std::to_string(cuts.size()));
      EXPECT_TRUE(same_bits(split, split_f16(r, h, cuts, scratch)));
    }
  }
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    for (bool ragged : {false, true}) {
      float v_max = 0;
      const KiviHeadStore s = make_store({bits, 32, 40, 128, 700, ragged}, rng, &v_max);
      const size_t n = s.size(), nq = s.quantized_tokens();
      const Rows r = make_rows(4, 128, 1400, rng, 1.0f);
      std::vector<float> whole(4 * 128);
      fast::attend_kivi(r.queries(), s, scratch, whole.data());
      EXPECT_TRUE(same_bits(split_kivi(r, s, {}, scratch), whole));
      // Cuts inside key blocks, on the quantized/residual boundary and inside the residual.
      for (const std::vector<size_t>& cuts : std::vector<std::vector<size_t>>{
               {n / 2}, {13, 45, nq, nq + 5}, {nq - 1, n - 1}, {1, 2, 3, 100, 101, 400}}) {
        const std::vector<float> split = split_kivi(r, s, cuts, scratch);
        // Each range quantizes its own segments' weights, hence the KIVI tolerance.
        expect_close(split, whole, v_max, "kivi split bits " + std::to_string(bits),
                     kKiviAbsTol);
        expect_close(split, reference_kivi(r, s), v_max, "kivi split vs reference", kKiviAbsTol);
        EXPECT_TRUE(same_bits(split, split_kivi(r, s, cuts, scratch)));
      }
    }
  }
  float v_max = 0;
  const KiviHeadStore s = make_store({2, 32, 16, 64, 50, false}, rng, &v_max);
  const Rows r = make_rows(1, 64, 100, rng, 1.0f);
  Parts p(1, 64, 50, {});
  EXPECT_ANY_THROW(fast::attend_kivi_partial(r.queries(), s, 40, 11, scratch, p.st[0]));
}

// --- determinism ------------------------------------------------------------------------------

// Outputs of a fixed mix of calls (f16 and KIVI 1/2/4/8, ragged, several group sizes and dims,
// whole ranges and split-K merges)
// from integer-generated inputs (no <random> distributions, whose algorithms are library-defined).
struct Lcg {
  uint64_t s;
  float next() {  // uniform in [-2, 2), exact dyadic values
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return float(int32_t(s >> 40) - (1 << 23)) / float(1 << 22);
  }
};

std::vector<float> fixed_outputs(uint32_t weight_bits) {
  Lcg g{42};
  std::vector<float> all;
  fast::Scratch scratch;
  const auto rows = [&g](size_t n_rows, size_t dim, int32_t limit) {
    Rows r{{}, {}, n_rows, dim, 1.0f / std::sqrt(float(dim))};
    for (size_t i = 0; i < n_rows * dim; ++i) r.q.push_back(g.next());
    for (size_t i = 0; i < n_rows; ++i) r.qpos.push_back(i == 1 ? limit : INT32_MAX);
    return r;
  };
  for (size_t dim : {64, 128, 40}) {
    const size_t n = 150;
    std::vector<float> k(n * dim), v(n * dim);
    for (float& f : k) f = g.next();
    for (float& f : v) f = g.next();
    std::vector<uint16_t> kh(n * dim), vh(n * dim);
    for (size_t i = 0; i < n * dim; ++i) kh[i] = f32_to_f16(k[i]), vh[i] = f32_to_f16(v[i]);
    std::vector<int32_t> pos(n);
    for (size_t t = 0; t < n; ++t) pos[t] = int32_t(t);
    for (size_t group : {1, 4, 8}) {
      const Rows r = rows(group, dim, 90);
      std::vector<float> out(group * dim);
      fast::attend_f16(r.queries(), kh.data(), vh.data(), pos.data(), n, scratch, out.data());
      all.insert(all.end(), out.begin(), out.end());
      const F16Head h{kh, vh, pos, 0.0f};
      const std::vector<float> split = split_f16(r, h, {37, 90}, scratch);
      all.insert(all.end(), split.begin(), split.end());
    }
    for (uint32_t bits : {1u, 2u, 4u, 8u}) {
      for (uint32_t G : {32u, 24u}) {
        KiviHeadStore s(dim, {bits, G, 16, weight_bits});
        s.append(k.data(), v.data(), pos.data(), n);
        if (bits == 2) {
          std::vector<uint32_t> keep;
          for (uint32_t t = 0; t < n; t += 1 + t % 3) keep.push_back(t);
          s.retain(keep);
        }
        const Rows r = rows(4, dim, 100);
        std::vector<float> out(4 * dim);
        fast::attend_kivi(r.queries(), s, scratch, out.data());
        all.insert(all.end(), out.begin(), out.end());
        const std::vector<float> split = split_kivi(r, s, {37, s.size() - 20}, scratch);
        all.insert(all.end(), split.begin(), split.end());
      }
    }
  }
  return all;
}

TEST(FastAttention, SameBitsOnEveryCompiledTarget) {
  const std::vector<fast::Target> targets = fast::available_targets();
  ASSERT_FALSE(targets.empty());
  std::vector<std::string> names;
  std::vector<float> first;
  for (const fast::Target& t : targets) {
    fast::force_target(t.bits);
    std::vector<float> out = fixed_outputs(14);
    const std::vector<float> out7 = fixed_outputs(7);  // KiviConfig::weight_bits 7
    out.insert(out.end(), out7.begin(), out7.end());
    names.push_back(t.name);
    if (first.empty()) {
      first = out;
      continue;
    }
    ASSERT_EQ(out.size(), first.size());
    EXPECT_EQ(0, std::memcmp(out.data(), first.data(), out.size() * sizeof(float)))
        << t.name << " differs from " << targets[0].name;
  }
  fast::force_target(0);
  std::string all;
  for (const std::string& n : names) all += n + " ";
  std::printf("targets compared: %s\n", all.c_str());
  // A real SIMD target and the scalar fallback are both among them on x86-64 and aarch64.
  EXPECT_GE(targets.size(), 2u) << all;
  EXPECT_NE(all.find("SCALAR"), std::string::npos) << all;
}

// The same digest on every architecture: this constant was recorded on x86-64 (AVX-512) and the
// test passes unchanged on aarch64 (NEON) under qemu, so both compute the same bits.
TEST(FastAttention, DigestMatchesAcrossArchitectures) {
  EXPECT_EQ(kvsdk_test::float_digest(fixed_outputs(14)), 0x4962daa7ca9b2418ull);
  EXPECT_EQ(kvsdk_test::float_digest(fixed_outputs(7)), 0xac0a8673e1ed4f63ull);
}

}  // namespace
}  // namespace kvsdk::cpu
