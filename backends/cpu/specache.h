// SpeCache (Jie et al.; docs/papers.md): the full-precision KV cache lives in a backing store, a
// low-bit KIVI copy (2- or 1-bit) is where attention runs. Each decode step also decodes a
// speculative next token; its attention over the low-bit keys picks the top-k tokens (scores
// averaged over the query heads of a GQA group, so one set per KV head) whose full-precision rows
// are fetched for the next step (§3.3). Attention then uses the low-bit rows with the fetched
// rows substituted: C' ∪ C_K (§3.3, "replace C'_K with 16-bit C_K in this computation").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "attention.h"
#include "kivi_store.h"
#include "specache_backing.h"
#include "util/growth.h"
#include "util/half_array.h"

namespace kvsdk::cpu {

// Full-precision (f16) rows of one KV head, in the same token order as the low-bit copy. Lives
// outside the budgeted memory (host RAM, or a file mapping: specache_backing.h), so it is
// reported separately. Rows are kept in blocks of kBlockTokens tokens (keys, then values) of an
// arena that the heads of a cache share. Move-only (it owns its blocks' contents).
class SpeCacheBackingStore {
 public:
  static constexpr size_t kBlockTokens = 64;
  static size_t block_elems(size_t dim) { return 2 * kBlockTokens * dim; }

  SpeCacheBackingStore() = default;
  // Rows go into `arena` (blocks of block_elems(dim)); null: a host-memory arena of its own.
  explicit SpeCacheBackingStore(size_t dim, std::shared_ptr<BackingArena> arena = nullptr);
  SpeCacheBackingStore(SpeCacheBackingStore&&) = default;
  SpeCacheBackingStore& operator=(SpeCacheBackingStore&&) = default;

  // Allocates the blocks `n_more` further rows need. Throws (KVSDK_E_NO_MEMORY / KVSDK_E_IO)
  // with the rows unchanged; blocks it did allocate stay for later appends.
  void reserve(size_t n_more);
  void append(const float* k_rows, const float* v_rows, size_t n);  // reserve(), then writes
  void append_f16(const uint16_t* k_rows, const uint16_t* v_rows, size_t n);
  // Truncation (kvsdk_cache_truncate): removes the rows from index `first` on whose position
  // (positions[t], t < size(): the low-bit copy's, same token order) is >= `position`, keeping
  // the others in order, zeroes the rows it vacated (as a store that never held them reads) and
  // gives blocks left empty back to the arena. No allocation, no throw. Returns the rows removed.
  size_t remove_from(size_t first, const int32_t* positions, int32_t position) noexcept;
  size_t size() const { return n_; }
  size_t dim() const { return dim_; }
  const uint16_t* key_row(size_t t) const;
  const uint16_t* value_row(size_t t) const;
  // Bytes of the blocks this head holds (allocated, so up to kBlockTokens - 1 rows of headroom).
  uint64_t bytes() const { return uint64_t(blocks_.size()) * block_elems(dim_) * 2; }
  const BackingArena& arena() const { return *arena_; }

 private:
  uint16_t* row(size_t t, bool value);
  size_t dim_ = 0, n_ = 0;
  std::shared_ptr<BackingArena> arena_;
  std::vector<size_t> blocks_;  // arena block of rows [i * kBlockTokens, (i + 1) * kBlockTokens)
};

// Rows fetched into the budgeted memory for one step: ascending token indices and their rows.
struct SpeCacheFetched {
  std::vector<uint32_t> tokens;
  std::vector<uint16_t> k, v;  // [tokens.size()][dim] f16
  uint64_t bytes() const { return 4 * uint64_t(tokens.size()) + 2 * uint64_t(k.size() + v.size()); }
};

// Tokens dequantized per chunk by the selection and the attention.
constexpr size_t kSpeCacheChunk = 256;

// Working memory of specache_select (transient), reused by a caller that keeps one.
struct SpeCacheSelectScratch {
  std::vector<float> scores, k_chunk, avg;
  std::vector<uint32_t> order, candidates;  // the top-k's keys, and those still in the running
  std::vector<int32_t> q_positions;  // one per row of the group
  // The optimized attention (specache_attention.h): its two parts' softmax states, the fetched
  // tokens as a byte mask over the copy, and the fetched rows' positions.
  std::vector<float> partials;
  std::vector<uint8_t> exclude;
  std::vector<int32_t> fetched_positions;
  std::vector<float> fetched_exp;  // the fetched tokens' exp(score - max) of one row
};

// The k highest of scores[0, n) (NaN ranked lowest; ties: the lower index), ascending: the same
// tokens as smallkv_topk, without sorting: the scores as order-preserving unsigned keys (in
// scratch.order), the k-th highest key found bit by bit (counting passes: over every key for the
// top 12 bits, then over the keys that share them), then one scan in index order that takes
// every token above it and the lowest-indexed tokens equal to it. No allocation once the
// scratch has grown.
void specache_topk(const float* scores, size_t n, size_t k, SpeCacheSelectScratch& scratch,
                   std::vector<uint32_t>& tokens);

// Reference scores of query rows q [rows][dim] (row r at position q_positions[r]) against one
// chunk of dequantized low-bit keys k [count][dim] at key_positions: scores[r * stride + t] =
// dot_f32(q_r, k_t) * scale, or -inf where key t is after the row's position (q_positions NULL:
// every key is visible).
void specache_score_chunk(const float* q, const int32_t* q_positions, size_t rows,
                          const float* k, const int32_t* key_positions, size_t count, size_t dim,
                          float scale, float* scores, size_t stride);
// specache_score_chunk over every token of the copy (keys dequantized in chunks into k_chunk,
// reused): scores [rows][lowbit.size()]. What specache_select ranks.
void specache_scores(const KiviHeadStore& lowbit, const float* q, const int32_t* q_positions,
                     size_t rows, float scale, std::vector<float>& k_chunk, float* scores);

// The second half of specache_select (reference): from scores [group][n] (overwritten: they
// become each head's exp(score - max)), each head's softmax averaged over the group into
// avg_probs (when non-null; else scratch), and the k most probable tokens (ties: lower index)
// in ascending order into `tokens` (k = 0: none).
void specache_select_from_scores(float* scores, size_t group, size_t n, size_t k,
                                 SpeCacheSelectScratch& scratch, std::vector<uint32_t>& tokens,
                                 std::vector<float>* avg_probs);

// Group-averaged top-k: q [group][dim] are the speculative token's queries of the group's heads at
// position q_position; each head's softmax over the dequantized low-bit keys is averaged over the
// group and the k most probable tokens (ties: lower index) are returned in ascending order.
// Also writes the averaged probabilities [store.size()] to `avg_probs` when non-null.
std::vector<uint32_t> specache_select(const KiviHeadStore& lowbit, const float* q, size_t group,
                                      int32_t q_position, float scale, size_t k,
                                      std::vector<float>* avg_probs = nullptr);
// The same into caller-owned `tokens` (and *avg_probs when non-null), working in `scratch`: no
// allocation once they have grown. The same bits as the overload above.
void specache_select(const KiviHeadStore& lowbit, const float* q, size_t group,
                     int32_t q_position, float scale, size_t k, SpeCacheSelectScratch& scratch,
                     std::vector<uint32_t>& tokens, std::vector<float>* avg_probs);

// Copies the rows of `tokens` (ascending, < backing.size()) out of the backing store.
SpeCacheFetched specache_fetch(const SpeCacheBackingStore& backing,
                               const std::vector<uint32_t>& tokens);
// The same into `out`, reusing its capacity. Validates every token first and reserves before it
// writes: on a throw `out` is unchanged.
void specache_fetch(const SpeCacheBackingStore& backing, const std::vector<uint32_t>& tokens,
                    SpeCacheFetched& out);

// Adds every token of the low-bit copy to `attn`, using the fetched full-precision row instead of
// the dequantized one where there is one.
void specache_attend(const KiviHeadStore& lowbit, const SpeCacheFetched& fetched,
                     OnlineAttention& attn);

// The same into any sink with add_chunk(k, v, positions, n), through caller-owned chunk buffers
// (grown once, then reused). `low_bit_keys(k, first, count)` sees each chunk's dequantized
// low-bit keys before the fetched rows replace theirs: SpeCache's selection scores them in the
// same pass (SpeCache §3.3 records the speculative token's top-k during its attention).
template <class Sink, class LowBitKeys>
void specache_attend(const KiviHeadStore& lowbit, const SpeCacheFetched& fetched, Sink& attn,
                     std::vector<float>& k, std::vector<float>& v, LowBitKeys&& low_bit_keys) {
  const size_t n = lowbit.size(), dim = lowbit.head_dim();
  at_least(k, std::min(kSpeCacheChunk, n) * dim);
  at_least(v, std::min(kSpeCacheChunk, n) * dim);
  size_t next = 0;  // first fetched entry not yet substituted (both lists ascend)
  for (size_t first = 0; first < n; first += kSpeCacheChunk) {
    const size_t c = std::min(kSpeCacheChunk, n - first);
    lowbit.read_rows(first, c, k.data(), v.data());
    low_bit_keys(static_cast<const float*>(k.data()), first, c);
    while (next < fetched.tokens.size() && fetched.tokens[next] < first + c) {
      const size_t t = fetched.tokens[next] - first;
      f16_to_f32_array(&fetched.k[next * dim], &k[t * dim], dim);  // exact
      f16_to_f32_array(&fetched.v[next * dim], &v[t * dim], dim);
      ++next;
    }
    attn.add_chunk(k.data(), v.data(), lowbit.positions().data() + first, c);
  }
}
template <class Sink>
void specache_attend(const KiviHeadStore& lowbit, const SpeCacheFetched& fetched, Sink& attn,
                     std::vector<float>& k, std::vector<float>& v) {
  specache_attend(lowbit, fetched, attn, k, v, [](const float*, size_t, size_t) {});
}

// Fraction of `probs` (a distribution over the tokens) that falls on `tokens`: the fetch hit rate.
double specache_hit_rate(const std::vector<float>& probs, const std::vector<uint32_t>& tokens);

// Each row's softmax over scores [rows][n] (-inf: masked) summed over `tokens` (< n): the share
// of the row's attention they hold, 0 for a row that sees no token. Double sums, the portable exp
// (the reference's attend_specache_scored).
void specache_fetched_shares(const float* scores, size_t rows, size_t n,
                             const std::vector<uint32_t>& tokens, float* shares);

}  // namespace kvsdk::cpu

namespace kvsdk::cpu {

// One KV head under SpeCache: the budgeted low-bit copy plus this step's fetched rows, and the
// backing store outside the budget. A decode step is attend() for the output token, then
// prefetch() with the speculative token's queries, whose rows serve the next step's attend().
class SpeCacheHead {
 public:
  // Throws kvsdk::Error (KVSDK_E_INVALID_ARG) for an unsupported low-bit configuration.
  // `arena`: where the backing rows go (null: host memory of its own).
  SpeCacheHead(size_t head_dim, const KiviConfig& lowbit,
               std::shared_ptr<BackingArena> arena = nullptr);
  // A head from saved parts (snapshot restore); the caller has validated that the backing store
  // and the low-bit copy hold the same number of rows and the fetched tokens are below it.
  SpeCacheHead(KiviHeadStore lowbit, SpeCacheBackingStore backing, SpeCacheFetched fetched);

  // Appends tokens to both the low-bit copy and the backing store. Fetched rows stay valid
  // (token indices never move). Backing blocks are allocated first, so a failure to grow the
  // backing store leaves both copies unchanged.
  void append(const float* k, const float* v, const int32_t* positions, size_t n);

  void attend(OnlineAttention& attn) const { specache_attend(lowbit_, fetched_, attn); }

  // Selects the group-averaged top-k of the speculative queries and fetches their rows,
  // replacing the previous fetch.
  void prefetch(const float* spec_q, size_t group, int32_t q_position, float scale, size_t k);
  // Fetches the rows of `tokens` (ascending, from a selection), replacing the previous fetch and
  // reusing its capacity; on a throw the previous fetch stays.
  void fetch(const std::vector<uint32_t>& tokens) { specache_fetch(backing_, tokens, fetched_); }
  // Drops the fetched rows (capacity kept: no allocation), as after kvsdk_cache_truncate: they
  // were picked for a step that no longer exists.
  void drop_fetch() noexcept {
    fetched_.tokens.clear();
    fetched_.k.clear();
    fetched_.v.clear();
  }

  // Truncation: whether every token at a position >= `position` can go exactly (the low-bit
  // copy's KIVI rule, KiviHeadStore::can_remove_from: the backing rows are kept per token, so
  // they never stand in the way), and removing them from both copies (no allocation; the
  // fetched rows are the caller's to drop). Returns the tokens removed.
  bool can_remove_from(int32_t position) const { return lowbit_.can_remove_from(position); }
  size_t remove_from(int32_t position) noexcept;

  // Fraction of the real queries' group-averaged attention (over the low-bit keys) that falls on
  // the fetched tokens: how well the speculative token guessed.
  double hit_rate(const float* q, size_t group, int32_t q_position, float scale) const;

  const KiviHeadStore& lowbit() const { return lowbit_; }
  const SpeCacheBackingStore& backing() const { return backing_; }
  SpeCacheBackingStore& backing() { return backing_; }
  const SpeCacheFetched& fetched() const { return fetched_; }
  // Budgeted bytes: the low-bit copy and the fetched rows. The backing store is reported apart.
  uint64_t budget_bytes() const { return lowbit_.bytes().total() + fetched_.bytes(); }
  uint64_t backing_bytes() const { return backing_.bytes(); }

 private:
  KiviHeadStore lowbit_;
  SpeCacheBackingStore backing_;
  SpeCacheFetched fetched_;
};

}  // namespace kvsdk::cpu
