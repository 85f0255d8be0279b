#include "spindlekv_codebook.h"

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "spindlekv_entry_dots.h"
#include "target_clones.h"
#include "util/error.h"
#include "util/growth.h"
#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

namespace {

float norm(const float* x, size_t n) { return std::sqrt(dot_f32(x, x, n)); }

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
  // The existing entries are read in place (spindle_entry_dots converts them in registers).
  const size_t n_entries = entries();
  std::vector<float>& entry_norm = at_least(s.entry_norm, n_entries);
  // x . entry for every entry, then the row's cosines (scratch beside the norms).
  std::vector<float>& entry_dot = at_least(s.entry_dot, n_entries);
  bool has_zero_rows = false, have_norms = false;
  for (size_t i = 0; i < n; ++i) {
    const float* x = rows + i * dim_;
    const float xn = norm(x, dim_);
    if (!(xn > 0.0f)) {  // a zero row has no direction: magnitude 0 reconstructs it exactly
      has_zero_rows = true;
      continue;
    }
    // The entry norms come with the first row's dot products (norm()'s bits: sqrt of dot_f32).
    spindle_entry_dots(x, entries_.data(), n_entries, dim_, entry_dot.data(),
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
