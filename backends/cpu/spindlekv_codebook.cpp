#include "spindlekv_codebook.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention.h"
#include "target_clones.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

namespace {

float norm(const float* x, size_t n) { return std::sqrt(dot_f32(x, x, n)); }

// Entries scored together by entry_dots: independent sums in flight instead of one dependent
// chain per dot product (which left the decode append latency-bound).
constexpr size_t kEntryBlock = 4;

// For each of n_entries f32 rows c [n_entries][dim]: dot[e] = dot_f32(x, c_e) and
// sq[e] = dot_f32(c_e, c_e), with dot_f32's arithmetic exactly (four partial sums over i mod 4,
// the tail into the first, (s0 + s1) + (s2 + s3)), so the results have dot_f32's bits. The
// decode append compares each new row with every entry; this does the entries in blocks.
// With kSquares false only dot is written. Inlined into each clone of entry_dots, so its loops
// are compiled for that clone's target.
template <bool kSquares>
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
inline void entry_dots_impl(const float* x, const float* c, size_t n_entries, size_t dim, float* dot,
                     float* sq) {
  const size_t body = dim / 4 * 4;
  size_t e0 = 0;
  for (; e0 + kEntryBlock <= n_entries; e0 += kEntryBlock) {
    float sx[kEntryBlock][4] = {}, sc[kEntryBlock][4] = {};
    const float* cb = c + e0 * dim;
#if defined(__GNUC__)
    // dot_f32's four partial sums are the four lanes of one 4-wide vector (GCC vector
    // extension: SSE / NEON mul and add, lane by lane, so the same bits), kept in registers.
    typedef float V4 __attribute__((vector_size(16)));
    V4 ax[kEntryBlock] = {}, ac[kEntryBlock] = {};
    for (size_t i = 0; i < body; i += 4) {
      V4 xv;
      std::memcpy(&xv, x + i, sizeof xv);
      for (size_t e = 0; e < kEntryBlock; ++e) {
        V4 cv;
        std::memcpy(&cv, cb + e * dim + i, sizeof cv);
        ax[e] += xv * cv;
        if (kSquares) ac[e] += cv * cv;
      }
    }
    for (size_t e = 0; e < kEntryBlock; ++e) {
      for (size_t j = 0; j < 4; ++j) {
        sx[e][j] = ax[e][j];
        sc[e][j] = ac[e][j];
      }
    }
#else
    for (size_t i = 0; i < body; i += 4) {
      for (size_t e = 0; e < kEntryBlock; ++e) {
        for (size_t j = 0; j < 4; ++j) {
          const float v = cb[e * dim + i + j];
          sx[e][j] += x[i + j] * v;
          if (kSquares) sc[e][j] += v * v;
        }
      }
    }
#endif
    for (size_t e = 0; e < kEntryBlock; ++e) {
      for (size_t i = body; i < dim; ++i) {
        const float v = cb[e * dim + i];
        sx[e][0] += x[i] * v;
        if (kSquares) sc[e][0] += v * v;
      }
      dot[e0 + e] = (sx[e][0] + sx[e][1]) + (sx[e][2] + sx[e][3]);
      if (kSquares) sq[e0 + e] = (sc[e][0] + sc[e][1]) + (sc[e][2] + sc[e][3]);
    }
  }
  for (; e0 < n_entries; ++e0) {
    dot[e0] = dot_f32(x, c + e0 * dim, dim);
    if (kSquares) sq[e0] = dot_f32(c + e0 * dim, c + e0 * dim, dim);
  }
}

// sq null: the dot products only.
KVSDK_TARGET_CLONES  // the same bits in every clone (no reassociation, no FMA)
void entry_dots(const float* x, const float* c, size_t n_entries, size_t dim, float* dot,
                float* sq) {
  if (sq) {
    entry_dots_impl<true>(x, c, n_entries, dim, dot, sq);
  } else {
    entry_dots_impl<false>(x, c, n_entries, dim, dot, nullptr);
  }
}

}  // namespace

SpindleCodebook::SpindleCodebook(size_t dim, float theta) : dim_(dim), theta_(theta) {
  KVSDK_REQUIRE(dim > 0, "codebook dim must be > 0");
  // Below 1 by a margin: a row must be similar enough to its own f16-rounded direction to be
  // covered by it, or the greedy construction could not terminate.
  KVSDK_REQUIRE(theta > -1.0f && theta <= 0.999f, "codebook threshold ", theta,
                " must lie in (-1, 0.999]");
}

void SpindleCodebook::append(const float* rows, size_t n) {
  SpindleCodebookScratch scratch;
  append(rows, n, scratch);
}

void SpindleCodebook::append(const float* rows, size_t n, SpindleCodebookScratch& s) {
  const size_t first = size();
  if (index_.capacity() < first + n) {
    // Every buffer grows when the rows do, by the same schedule (growth.h): at most one new
    // entry per row, so the entries never need to grow between two growths of the rows, and
    // every codebook of a cache grows at the same appends (not whenever its entry count
    // happens to cross a capacity).
    const size_t cap = grown_capacity(index_.capacity(), first + n);
    index_.reserve(cap);
    magnitude_.reserve(cap);
    entries_.reserve(std::max(entries_.capacity(), entries_.size() + (cap - first) * dim_));
  }
  index_.resize(first + n, 0);
  magnitude_.resize(first + n, 0.0f);
  std::vector<size_t>& leftover = s.leftover;
  leftover.clear();
  // The existing entries, decoded once for this call (transient scratch, not held state).
  const size_t n_entries = entries();
  std::vector<float>& entry = at_least(s.entry, n_entries * dim_);
  std::vector<float>& entry_norm = at_least(s.entry_norm, n_entries);
  // x . entry for every entry, then the row's cosines (scratch beside the norms).
  std::vector<float>& entry_dot = at_least(s.entry_dot, n_entries);
  f16_to_f32_array(entries_.data(), entry.data(), n_entries * dim_);  // exact, in bulk
  bool has_zero_rows = false, have_norms = false;
  for (size_t i = 0; i < n; ++i) {
    const float* x = rows + i * dim_;
    const float xn = norm(x, dim_);
    if (!(xn > 0.0f)) {  // a zero row has no direction: magnitude 0 reconstructs it exactly
      has_zero_rows = true;
      continue;
    }
    // The entry norms come with the first row's dot products (norm()'s bits: sqrt of dot_f32).
    entry_dots(x, entry.data(), n_entries, dim_, entry_dot.data(),
               have_norms ? nullptr : entry_norm.data());
    if (!have_norms) {
      for (size_t e = 0; e < n_entries; ++e) entry_norm[e] = std::sqrt(entry_norm[e]);
      have_norms = true;
    }
    // Decode tokens join the most similar existing entry above θ.
    float best = -2.0f;
    size_t best_e = 0;
    float best_norm = 1.0f;
    for (size_t e = 0; e < n_entries; ++e) {
      if (!(entry_norm[e] > 0.0f)) continue;
      const float c = entry_dot[e] / (xn * entry_norm[e]);
      if (c > best) {
        best = c;
        best_e = e;
        best_norm = entry_norm[e];
      }
    }
    if (best > theta_) {
      index_[first + i] = uint32_t(best_e);
      magnitude_[first + i] = xn / best_norm;
    } else {
      leftover.push_back(i);
    }
  }
  build_greedy(leftover, rows, first, s);
  if (has_zero_rows && entries() == 0) entries_.assign(dim_, 0);  // index 0 must exist
}

void SpindleCodebook::build_greedy(const std::vector<size_t>& rows, const float* data,
                                   size_t first_row, SpindleCodebookScratch& s) {
  const size_t m = rows.size();
  if (m == 0) return;
  // Candidate entries: each row's direction rounded to f16, as it would be stored (Eq. 8).
  std::vector<uint16_t>& cand = at_least(s.cand, m * dim_);
  std::vector<float>& cand_f32 = at_least(s.cand_f32, m * dim_);
  std::vector<float>& cand_norm = at_least(s.cand_norm, m);
  std::vector<float>& row_norm = at_least(s.row_norm, m);
  for (size_t j = 0; j < m; ++j) {
    const float* x = data + rows[j] * dim_;
    row_norm[j] = norm(x, dim_);
    for (size_t d = 0; d < dim_; ++d) {
      cand[j * dim_ + d] = f32_to_f16(x[d] / row_norm[j]);
      cand_f32[j * dim_ + d] = f16_to_f32(cand[j * dim_ + d]);
    }
    cand_norm[j] = norm(&cand_f32[j * dim_], dim_);
  }
  // Cosine graph (Eq. 9): covers[b] lists the rows a with cos(x_a, C_b) > θ; covered_by[a] the
  // reverse, to keep degrees (Eq. 10) current as rows leave the graph (Eq. 13).
  std::vector<std::vector<uint32_t>>& covers = at_least(s.covers, m);
  std::vector<std::vector<uint32_t>>& covered_by = at_least(s.covered_by, m);
  for (size_t j = 0; j < m; ++j) {
    covers[j].clear();
    covered_by[j].clear();
  }
  for (size_t a = 0; a < m; ++a) {
    const float* x = data + rows[a] * dim_;
    for (size_t b = 0; b < m; ++b) {
      const float c = dot_f32(x, &cand_f32[b * dim_], dim_) / (row_norm[a] * cand_norm[b]);
      if (c > theta_) {
        covers[b].push_back(uint32_t(a));
        covered_by[a].push_back(uint32_t(b));
      }
    }
  }
  std::vector<size_t>& degree = at_least(s.degree, m);
  for (size_t b = 0; b < m; ++b) degree[b] = covers[b].size();
  std::vector<char>& alive = at_least(s.alive, m);
  std::fill(alive.begin(), alive.begin() + m, char(1));
  size_t remaining = m;
  while (remaining > 0) {
    size_t pick = m;  // highest degree among rows still in the graph (Eq. 11), lowest index on ties
    for (size_t b = 0; b < m; ++b) {
      if (alive[b] && (pick == m || degree[b] > degree[pick])) pick = b;
    }
    const uint32_t e = uint32_t(entries());
    reserve_for_growth(entries_, entries_.size() + dim_);
    entries_.insert(entries_.end(), cand.begin() + pick * dim_, cand.begin() + (pick + 1) * dim_);
    for (uint32_t a : covers[pick]) {  // Eq. 12: the pick and its neighbours point at the entry
      if (!alive[a]) continue;
      alive[a] = 0;
      --remaining;
      index_[first_row + rows[a]] = e;
      magnitude_[first_row + rows[a]] = row_norm[a] / cand_norm[pick];
      for (uint32_t b : covered_by[a]) --degree[b];  // Eq. 13: a leaves the graph
    }
    if (alive[pick]) {  // unreachable for θ <= 0.999 (a row covers itself); keeps the loop finite
      alive[pick] = 0;
      --remaining;
      index_[first_row + rows[pick]] = e;
      magnitude_[first_row + rows[pick]] = row_norm[pick] / cand_norm[pick];
      for (uint32_t b : covered_by[pick]) --degree[b];
    }
  }
}

SpindleCodebook SpindleCodebook::restore(size_t dim, float theta, std::vector<uint16_t> entries,
                                         std::vector<uint32_t> index,
                                         std::vector<float> magnitude) {
  SpindleCodebook cb(dim, theta);
  if (entries.size() % dim != 0 || index.size() != magnitude.size() ||
      (!index.empty() && entries.empty())) {
    fail(KVSDK_E_CORRUPT, "SpindleKV codebook buffers do not match head_dim ", dim);
  }
  const size_t n_entries = entries.size() / dim;
  for (uint32_t r : index) {
    if (r >= n_entries) {
      fail(KVSDK_E_CORRUPT, "SpindleKV codebook index ", r, " is beyond its ", n_entries,
           " entries");
    }
  }
  cb.entries_ = std::move(entries);
  cb.index_ = std::move(index);
  cb.magnitude_ = std::move(magnitude);
  return cb;
}

void SpindleCodebook::truncate(size_t rows) noexcept {
  if (rows >= size()) return;
  size_t n_entries = 0;
  for (size_t i = 0; i < rows; ++i) n_entries = std::max(n_entries, size_t(index_[i]) + 1);
  index_.resize(rows);
  magnitude_.resize(rows);
  entries_.resize(n_entries * dim_);  // shrinking: no allocation
}

KVSDK_TARGET_CLONES  // elementwise: the same bits in every clone (target_clones.h)
void SpindleCodebook::reconstruct(size_t first, size_t count, float* out) const {
  for (size_t i = 0; i < count; ++i) {
    const uint16_t* c = entries_.data() + size_t(index_[first + i]) * dim_;
    const float m = magnitude_[first + i];
    float* o = out + i * dim_;
    f16_to_f32_array(c, o, dim_);  // exact, as f16_to_f32: the same bits, converted in bulk
    for (size_t d = 0; d < dim_; ++d) o[d] *= m;
  }
}

}  // namespace kvsdk::cpu
