// One KV head of a SpindleKV shallow layer (SpindleKV (docs/papers.md) §3.4): keys and values each
// in their own codebook (θ_K = 0.98, θ_V = 0.95). The codebook compares keys before RoPE, so the
// rotation the host applied is removed on append and re-applied at the token's position on
// reconstruction.
//
// Algorithm 1's cosine graph is quadratic in the rows it covers, so a long prefill is encoded in
// blocks of kSpindlePrefillBlock tokens: each block first joins existing entries above θ (as
// decode tokens do), and the rest of the block runs the greedy construction. This bounds the
// graph to ~block² pairs (a few MB) and the work to O(n · (block + entries) · head_dim).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention.h"
#include "rope.h"
#include "spindlekv_codebook.h"
#include "util/growth.h"

namespace kvsdk::cpu {

constexpr size_t kSpindlePrefillBlock = 1024;
// Tokens reconstructed per attention chunk.
constexpr size_t kSpindleAttendChunk = 256;

struct SpindleBytes {
  uint64_t key_codebook = 0;    // key entries + key indices + key magnitudes
  uint64_t value_codebook = 0;  // value entries + value indices + value magnitudes
  uint64_t positions = 0;       // int32 per token
  uint64_t total() const { return key_codebook + value_codebook + positions; }
};

// Working memory of SpindleHeadStore::append, reused across calls (one per cache).
struct SpindleScratch {
  std::vector<float> pre_rope;  // keys with RoPE removed
  SpindleCodebookScratch codebook;
};

class SpindleHeadStore {
 public:
  SpindleHeadStore(size_t head_dim, float rope_theta, kvsdk_rope_style rope_style,
                   float theta_k = kSpindleThetaK, float theta_v = kSpindleThetaV);

  // Appends `n` tokens: post-RoPE keys and values [n][head_dim] (f32) with their positions.
  void append(const float* k, const float* v, const int32_t* positions, size_t n);
  // The same over caller-owned scratch (reused across calls: the decode path allocates nothing
  // besides the amortized growth of the stored rows).
  void append(const float* k, const float* v, const int32_t* positions, size_t n,
              SpindleScratch& scratch);

  // Reconstructed rows [first, first + count): keys with RoPE re-applied.
  void read_rows(size_t first, size_t count, float* k, float* v) const;
  // The keys of read_rows alone (the same bits).
  void read_keys(size_t first, size_t count, float* k) const;

  size_t size() const { return positions_.size(); }
  size_t head_dim() const { return keys_.dim(); }
  const std::vector<int32_t>& positions() const { return positions_; }
  const SpindleCodebook& keys() const { return keys_; }
  const SpindleCodebook& values() const { return values_; }
  const Rope& rope() const { return rope_; }
  SpindleBytes bytes() const;

  // Truncation (kvsdk_cache_truncate): removing every token at a position >= `position`, so
  // that the store is exactly one that never appended them. Every codebook decision about a row
  // (joining an entry, or the greedy construction of SpindleKV (docs/papers.md) §3.4 Algorithm 1
  // over the leftovers of its batch)
  // depends only on the rows appended before it and on the rows of its own batch (one append, or
  // one kSpindlePrefillBlock of a longer one), so the tokens can go exactly when they are the
  // newest rows and no multi-row batch holds both some of them and older ones. Rows held when
  // the store was restored (snapshot load, fork) came in batches the snapshot does not record:
  // they can only all go together (removing every row gives the empty store back, whatever the
  // history). Returns null when the removal is exact (or removes nothing), else why not.
  const char* removal_refusal(int32_t position) const;
  // Removes them (only after removal_refusal() returned null): rows, positions and the codebook
  // entries only they used. No allocation, no throw.
  void remove_from(int32_t position) noexcept;

  // Snapshot support: a store rebuilt from its two codebooks (SpindleCodebook::restore) and the
  // tokens' positions. Throws kvsdk::Error KVSDK_E_CORRUPT when the codebooks do not both hold
  // one row per position or their dimension differs from head_dim.
  static SpindleHeadStore restore(size_t head_dim, float rope_theta, kvsdk_rope_style rope_style,
                                  SpindleCodebook keys, SpindleCodebook values,
                                  std::vector<int32_t> positions);

 private:
  Rope rope_;
  SpindleCodebook keys_, values_;
  std::vector<int32_t> positions_;
  // Truncation history: the row ranges [first, end) encoded together (batches of more than one
  // row; a single row is a batch of its own), oldest first, since the store was made or
  // restored; and the rows it was restored with (their batches are unknown).
  struct Batch {
    size_t first, end;
  };
  std::vector<Batch> batches_;
  size_t restored_rows_ = 0;
  // The rows that stay when every token at a position >= `position` goes.
  size_t rows_before(int32_t position) const;
};

// Adds every token of `store` to `attn`, reconstructing bounded chunks.
void spindlekv_attend(const SpindleHeadStore& store, OnlineAttention& attn);

// The same into any sink with add_chunk(k, v, positions, n) (OnlineAttention, or the optimized
// backend's accumulator), through caller-owned chunk buffers k, v (grown once, then reused).
template <class Sink>
void spindlekv_attend(const SpindleHeadStore& store, Sink& attn, std::vector<float>& k,
                      std::vector<float>& v) {
  const size_t dim = store.head_dim();
  const size_t chunk = std::min(kSpindleAttendChunk, store.size()) * dim;
  at_least(k, chunk);
  at_least(v, chunk);
  for (size_t first = 0; first < store.size(); first += kSpindleAttendChunk) {
    const size_t n = std::min(kSpindleAttendChunk, store.size() - first);
    store.read_rows(first, n, k.data(), v.data());
    attn.add_chunk(k.data(), v.data(), store.positions().data() + first, n);
  }
}

// The optimized attention over every token of `store` (spindlekv_attention.cpp, Highway SIMD):
// keys scored from their codebook entries in place, gathered, converted and rotated 16 tokens at
// a time into L1 (the rotation split into a per-block query rotation and a per-offset table,
// Rope::offset_table), and the values summed per codebook entry (SpindleKV (docs/papers.md)
// Eq. 14, moved past the softmax: sum_t p_t m_t C[e_t] = sum_e C[e] (sum_{t: e_t = e} p_t m_t), so
// each value entry is converted and accumulated once per call instead of once per token; a
// SpindleKV value codebook holds about half as many entries as tokens). The softmax is exact per
// row (max, fast::exp_f32, sum), in blocks of query rows so the working memory stays
// O(rows_per_block x (tokens + entries)). Same bits on every SIMD target; differs from
// OnlineAttention over reconstructed rows only by rounding. `scratch`'s buffers serve as plain
// working memory (scores, k_chunk, v_chunk, sum); writes out [n_rows][dim].
void spindlekv_attend_entries(const float* q, const int32_t* q_positions, size_t n_rows,
                              float scale, const SpindleHeadStore& store,
                              AttentionScratch& scratch, float* out);

}  // namespace kvsdk::cpu
