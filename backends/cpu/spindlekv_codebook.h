// SpindleKV codebook replacement for shallow layers (Tang et al.; SpindleKV (docs/papers.md) §3.4,
// Algorithm 1 and Eqs. 8-14): rows are normalised (Eq. 8, magnitude m = ||x||), a cosine graph
// links rows whose similarity exceeds θ (Eq. 9; θ_K = 0.98, θ_V = 0.95), and the codebook is built
// greedily: take the row of highest degree (Eq. 10) as an entry (Eq. 11), point it and all its
// neighbours at that entry (Eq. 12), drop them from the graph (Eq. 13), repeat until every row is
// covered. A row is stored as (entry index, magnitude) and reconstructed as C[r] · m (Eq. 14).
// Rows added later (decode) first join the most similar existing entry if its cosine exceeds θ;
// the rest run the same greedy construction and extend the codebook (§3.4, last paragraph).
//
// Storage: entries are f16 unit vectors (2·dim bytes each); per row a uint32 index and an f32
// magnitude. The graph is built against the f16-rounded entries themselves, so the coverage
// guarantee (cos(x, C[r]) > θ) holds for what is stored, and the magnitude is ||x|| / ||C[r]||
// so the reconstruction has exactly the row's norm (to f32 rounding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::cpu {

constexpr float kSpindleThetaK = 0.98f;
constexpr float kSpindleThetaV = 0.95f;

// Working memory of SpindleCodebook::append (transient, not state): reused across calls by a
// caller that keeps one, so a decode append allocates nothing but the codebook's own growth.
struct SpindleCodebookScratch {
  std::vector<size_t> leftover;
  std::vector<float> entry_norm;         // the existing entries' norms
  std::vector<float> entry_dot;          // one row's dot product with each entry
  std::vector<uint16_t> cand;
  std::vector<float> cand_f32, cand_norm, row_norm;
  std::vector<std::vector<uint32_t>> covers, covered_by;  // never shrunk: inner capacity stays
  std::vector<size_t> degree;
  std::vector<char> alive;
};

class SpindleCodebook {
 public:
  // Throws kvsdk::Error (KVSDK_E_INVALID_ARG) for dim 0 or θ outside (-1, 1).
  SpindleCodebook(size_t dim, float theta);

  // Encodes `n` rows [n][dim] (appended after the rows already held).
  void append(const float* rows, size_t n);
  void append(const float* rows, size_t n, SpindleCodebookScratch& scratch);

  // Reconstructs rows [first, first + count) into out [count][dim] (Eq. 14).
  void reconstruct(size_t first, size_t count, float* out) const;

  size_t size() const { return index_.size(); }
  size_t entries() const { return entries_.size() / dim_; }
  size_t dim() const { return dim_; }
  float theta() const { return theta_; }
  const std::vector<uint16_t>& entry_data() const { return entries_; }  // [entries][dim] f16
  const std::vector<uint32_t>& index() const { return index_; }         // [size]
  const std::vector<float>& magnitude() const { return magnitude_; }    // [size]

  // Snapshot support: a codebook rebuilt from saved buffers. Throws kvsdk::Error
  // (KVSDK_E_CORRUPT) when sizes disagree with dim or an index points past the entries.
  static SpindleCodebook restore(size_t dim, float theta, std::vector<uint16_t> entries,
                                 std::vector<uint32_t> index, std::vector<float> magnitude);

  // Truncation: keeps rows [0, rows) and drops the entries no kept row uses. Exact (the codebook
  // of a history that never appended the dropped rows) only when rows [rows, size()) came in
  // appends of their own, after every kept row: an append adds its new entries at the end, and
  // every entry is the direction of a row of the append that created it (Algorithm 1 points the
  // picked row at its own entry; an all-zero append's entry 0 is used by its zero rows), so the
  // entries the kept appends created are exactly [0, largest kept index + 1). Which appends the
  // rows came in is the caller's to know (SpindleHeadStore). No allocation, no throw.
  void truncate(size_t rows) noexcept;

  // Codebook entries + per-row index and magnitude.
  uint64_t bytes() const {
    return 2 * uint64_t(entries_.size()) + 4 * uint64_t(index_.size()) +
           4 * uint64_t(magnitude_.size());
  }

 private:
  // Algorithm 1 over rows[i] of `data` (row numbers relative to `data`, stored at first_row + i).
  void build_greedy(const std::vector<size_t>& rows, const float* data, size_t first_row,
                    SpindleCodebookScratch& s);

  size_t dim_;
  float theta_;
  std::vector<uint16_t> entries_;   // f16 unit vectors (the only copy: no hidden f32 cache)
  std::vector<uint32_t> index_;
  std::vector<float> magnitude_;
};

}  // namespace kvsdk::cpu
