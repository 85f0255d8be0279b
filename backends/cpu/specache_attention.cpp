#include "specache_attention.h"

#include <algorithm>
#include <climits>
#include <limits>

#include "target_clones.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk::cpu {

namespace {

// q with positions: the kernels take one per row (NULL means every token is visible).
fast::Queries with_positions(const fast::Queries& q, SpeCacheSelectScratch& sc) {
  fast::Queries out = q;
  if (!q.positions) {
    int32_t* p = at_least(sc.q_positions, q.n_rows).data();
    std::fill_n(p, q.n_rows, INT32_MAX);
    out.positions = p;
  }
  return out;
}

// Each row's share of the low-bit softmax on the fetched tokens: their scores' max mf and sum of
// exp(s - mf) against the KIVI part's max m0 and sum l0 over the others (the same exp, the
// fast::exp_f32 of the kernels, so the same bits on every target).
void shares(const float* scores, size_t n, const std::vector<uint32_t>& tokens,
            const fast::PartialState& rest, size_t rows, SpeCacheSelectScratch& sc, float* out) {
  const size_t nf = tokens.size();
  float* e = at_least(sc.fetched_exp, nf).data();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    const float* s = scores + r * n;
    float mf = neg_inf;
    for (size_t i = 0; i < nf; ++i) mf = std::max(mf, s[tokens[i]]);
    const float m = std::max(mf, rest.max[r]);
    out[r] = 0.0f;
    if (mf == neg_inf) continue;  // no fetched token visible (or none at all)
    for (size_t i = 0; i < nf; ++i) e[i] = s[tokens[i]] - mf;
    fast::exp_f32(e, nf, e);
    float lf = 0.0f;
    for (size_t i = 0; i < nf; ++i) lf += e[i];
    float a[2] = {mf - m, rest.max[r] == neg_inf ? neg_inf : rest.max[r] - m};
    fast::exp_f32(a, 2, a);
    const float fetched_mass = lf * a[0], other_mass = rest.sum[r] * a[1];
    out[r] = fetched_mass / (fetched_mass + other_mass);
  }
}

}  // namespace

KVSDK_TARGET_CLONES  // the elementwise loops (subtract, sums, scaling) vectorize wider
void specache_select_fast(float* scores, size_t group, size_t n, size_t k,
                          SpeCacheSelectScratch& sc, std::vector<uint32_t>& tokens,
                          std::vector<float>* avg_probs) {
  tokens.clear();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float>& avg = avg_probs ? *avg_probs : sc.avg;
  reserve_for_growth(avg, n);
  avg.assign(n, 0.0f);
  if (n == 0) return;
  for (size_t h = 0; h < group; ++h) {
    float* s = scores + h * n;
    // The max in 16 independent lanes (exact in any order; a serial max chain was ~1/5 of this
    // function).
    float m16[16];
    std::fill_n(m16, 16, neg_inf);
    size_t t0 = 0;
    for (; t0 + 16 <= n; t0 += 16) {
      for (size_t j = 0; j < 16; ++j) m16[j] = m16[j] < s[t0 + j] ? s[t0 + j] : m16[j];
    }
    float mx = neg_inf;
    for (size_t j = 0; j < 16; ++j) mx = mx < m16[j] ? m16[j] : mx;
    for (; t0 < n; ++t0) mx = mx < s[t0] ? s[t0] : mx;
    if (mx == neg_inf) continue;  // nothing visible to this head
    for (size_t t = 0; t < n; ++t) s[t] -= mx;
    fast::exp_f32(s, n, s);  // -inf -> 0
    // z in double, 4 lanes by t mod 4 summed (0 + 1) + (2 + 3), then the tail in order: one
    // fixed order (the reference sums in token order; the difference is ~1e-16 relative).
    double z4[4] = {0, 0, 0, 0};
    size_t t = 0;
    for (; t + 4 <= n; t += 4) {
      for (size_t j = 0; j < 4; ++j) z4[j] += s[t + j];
    }
    double z = (z4[0] + z4[1]) + (z4[2] + z4[3]);
    for (; t < n; ++t) z += s[t];
    // One multiply per token (two double divisions per token were a fifth of this function);
    // the reference divides, which differs by an ulp.
    const float inv = float(1.0 / (z * double(group)));
    for (size_t u = 0; u < n; ++u) avg[u] += s[u] * inv;
  }
  if (k > 0) specache_topk(avg.data(), n, k, sc, tokens);
}

void specache_scores_fast(const fast::Queries& q, const KiviHeadStore& lowbit,
                          SpeCacheSelectScratch& sc, fast::Scratch& kernel, float* scores) {
  fast::kivi_scores(with_positions(q, sc), lowbit, kernel, scores, lowbit.size());
}

void specache_attend_fast(const fast::Queries& q_in, const KiviHeadStore& lowbit,
                          const SpeCacheFetched& fetched, SpeCacheSelectScratch& sc,
                          fast::Scratch& kernel, float* out, float* lowbit_scores,
                          float* fetched_share) {
  const size_t n = lowbit.size(), dim = q_in.dim, rows = q_in.n_rows;
  const size_t nf = fetched.tokens.size();
  KVSDK_REQUIRE(!fetched_share || lowbit_scores,
                "specache_attend_fast: fetched_share needs lowbit_scores");
  if (fetched_share) std::fill_n(fetched_share, rows, 0.0f);
  if (n == 0 || rows == 0) {
    std::fill_n(out, rows * dim, 0.0f);
    return;
  }
  const fast::Queries q = with_positions(q_in, sc);
  // Part 0: the low-bit copy without the fetched tokens; part 1: the fetched rows.
  float* st = at_least(sc.partials, 2 * rows * (2 + dim)).data();
  fast::PartialState parts[2];
  for (size_t i = 0; i < 2; ++i) {
    float* p = st + i * rows * (2 + dim);
    parts[i] = {p, p + rows, p + 2 * rows};
  }
  uint8_t* exclude = at_least(sc.exclude, n).data();
  std::fill_n(exclude, n, uint8_t{0});
  for (uint32_t t : fetched.tokens) exclude[t] = 1;
  fast::KiviTaps taps;
  taps.scores = lowbit_scores;
  taps.scores_stride = n;
  taps.exclude = nf ? exclude : nullptr;
  fast::attend_kivi_partial(q, lowbit, 0, n, kernel, parts[0], &taps);
  if (nf == 0) return fast::merge_partials(parts, 1, rows, dim, out);
  if (fetched_share) shares(lowbit_scores, n, fetched.tokens, parts[0], rows, sc, fetched_share);
  int32_t* fpos = at_least(sc.fetched_positions, nf).data();
  const int32_t* pos = lowbit.positions().data();
  for (size_t i = 0; i < nf; ++i) fpos[i] = pos[fetched.tokens[i]];
  fast::attend_f16_partial(q, fetched.k.data(), fetched.v.data(), fpos, 0, nf, kernel, parts[1]);
  fast::merge_partials(parts, 2, rows, dim, out);
}

}  // namespace kvsdk::cpu
