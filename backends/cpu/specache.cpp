#include "specache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "portable_math.h"
#include "smallkv.h"
#include "target_clones.h"
#include "util/error.h"
#include "util/half.h"

namespace kvsdk::cpu {

namespace {
constexpr size_t kChunk = kSpeCacheChunk;
}

SpeCacheBackingStore::SpeCacheBackingStore(size_t dim, std::shared_ptr<BackingArena> arena)
    : dim_(dim), arena_(arena ? std::move(arena) : make_host_backing(block_elems(dim))) {
  KVSDK_REQUIRE(arena_->block_elems() == block_elems(dim), "backing arena blocks hold ",
                arena_->block_elems(), " values, a head of dimension ", dim, " needs ",
                block_elems(dim));
}

void SpeCacheBackingStore::reserve(size_t n_more) {
  const size_t need = (n_ + n_more + kBlockTokens - 1) / kBlockTokens;
  blocks_.reserve(need);
  while (blocks_.size() < need) blocks_.push_back(arena_->add_block());
}

uint16_t* SpeCacheBackingStore::row(size_t t, bool value) {
  return arena_->block(blocks_[t / kBlockTokens]) + (value ? kBlockTokens * dim_ : 0) +
         (t % kBlockTokens) * dim_;
}

const uint16_t* SpeCacheBackingStore::key_row(size_t t) const {
  return arena_->block(blocks_[t / kBlockTokens]) + (t % kBlockTokens) * dim_;
}

const uint16_t* SpeCacheBackingStore::value_row(size_t t) const {
  return arena_->block(blocks_[t / kBlockTokens]) + kBlockTokens * dim_ +
         (t % kBlockTokens) * dim_;
}

void SpeCacheBackingStore::append(const float* k_rows, const float* v_rows, size_t n) {
  reserve(n);
  for (size_t t = 0; t < n; ++t, ++n_) {
    uint16_t* kr = row(n_, false);
    uint16_t* vr = row(n_, true);
    for (size_t d = 0; d < dim_; ++d) {
      kr[d] = f32_to_f16(k_rows[t * dim_ + d]);
      vr[d] = f32_to_f16(v_rows[t * dim_ + d]);
    }
  }
}

void SpeCacheBackingStore::append_f16(const uint16_t* k_rows, const uint16_t* v_rows, size_t n) {
  reserve(n);
  for (size_t t = 0; t < n; ++t, ++n_) {
    std::copy_n(k_rows + t * dim_, dim_, row(n_, false));
    std::copy_n(v_rows + t * dim_, dim_, row(n_, true));
  }
}

size_t SpeCacheBackingStore::remove_from(size_t first, const int32_t* positions,
                                         int32_t position) noexcept {
  size_t j = first;
  for (size_t t = first; t < n_; ++t) {
    if (positions[t] >= position) continue;
    if (j != t) {
      std::copy_n(key_row(t), dim_, row(j, false));
      std::copy_n(value_row(t), dim_, row(j, true));
    }
    ++j;
  }
  const size_t removed = n_ - j;
  for (size_t t = j; t < n_; ++t) {  // a store that never held them reads zeros there
    std::fill_n(row(t, false), dim_, uint16_t(0));
    std::fill_n(row(t, true), dim_, uint16_t(0));
  }
  n_ = j;
  const size_t need = (n_ + kBlockTokens - 1) / kBlockTokens;
  while (blocks_.size() > need) {
    arena_->release_block(blocks_.back());
    blocks_.pop_back();
  }
  return removed;
}

std::vector<uint32_t> specache_select(const KiviHeadStore& lowbit, const float* q, size_t group,
                                      int32_t q_position, float scale, size_t k,
                                      std::vector<float>* avg_probs) {
  SpeCacheSelectScratch scratch;
  std::vector<uint32_t> top;
  specache_select(lowbit, q, group, q_position, scale, k, scratch, top, avg_probs);
  return top;
}

void specache_score_chunk(const float* q, const int32_t* q_positions, size_t rows,
                          const float* k, const int32_t* key_positions, size_t count, size_t dim,
                          float scale, float* scores, size_t stride) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < count; ++t) {
    for (size_t h = 0; h < rows; ++h) {
      const bool visible = !q_positions || key_positions[t] <= q_positions[h];
      scores[h * stride + t] = visible ? dot_f32(q + h * dim, &k[t * dim], dim) * scale : neg_inf;
    }
  }
}

namespace {
// Scores as unsigned keys in the same order (NaN as -inf, -0 as +0: smallkv_topk's ranking).
inline uint32_t order_key(float x) {
  if (!(x == x)) x = -std::numeric_limits<float>::infinity();
  if (x == 0.0f) x = 0.0f;
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
}  // namespace

KVSDK_TARGET_CLONES  // the counting passes vectorize wider; integer counts, the same result
void specache_topk(const float* scores, size_t n, size_t k, SpeCacheSelectScratch& sc,
                   std::vector<uint32_t>& tokens) {
  tokens.clear();
  k = std::min(k, n);
  if (k == 0) return;
  uint32_t* keys = at_least(sc.order, n).data();
  for (size_t t = 0; t < n; ++t) keys[t] = order_key(scores[t]);
  // The k-th highest key: the largest `kth` with at least k keys >= it, built bit by bit from the
  // top (the count only falls as `kth` grows), one branch-free counting pass per bit: over every
  // key for the top 12 bits, then over the few keys that share those bits with `kth` (the keys
  // above them counted once).
  constexpr uint32_t kLowBits = 20;
  uint32_t kth = 0;
  for (uint32_t bit = 1u << 31; bit >> kLowBits != 0; bit >>= 1) {
    const uint32_t c = kth | bit;
    size_t count = 0;
    for (size_t t = 0; t < n; ++t) count += keys[t] >= c;
    if (count >= k) kth = c;
  }
  const uint32_t prefix = kth >> kLowBits;
  uint32_t* cand = at_least(sc.candidates, n).data();
  size_t higher = 0, m = 0;
  for (size_t t = 0; t < n; ++t) {
    higher += keys[t] >> kLowBits > prefix;
    cand[m] = keys[t];
    m += keys[t] >> kLowBits == prefix;
  }
  for (uint32_t bit = 1u << (kLowBits - 1); bit != 0; bit >>= 1) {
    const uint32_t c = kth | bit;
    size_t count = higher;
    for (size_t i = 0; i < m; ++i) count += cand[i] >= c;
    if (count >= k) kth = c;
  }
  size_t above = 0;  // tokens strictly above the k-th key: all of them are taken
  for (size_t t = 0; t < n; ++t) above += keys[t] > kth;
  size_t ties = k - above;  // the lowest-indexed tokens equal to it fill the rest
  reserve_for_growth(tokens, k);
  for (size_t t = 0; t < n; ++t) {
    if (keys[t] > kth || (keys[t] == kth && ties > 0 && ties--)) tokens.push_back(uint32_t(t));
  }
}

void specache_select_from_scores(float* scores, size_t group, size_t n, size_t k,
                                 SpeCacheSelectScratch& sc, std::vector<uint32_t>& tokens,
                                 std::vector<float>* avg_probs) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  tokens.clear();
  std::vector<float>& avg = avg_probs ? *avg_probs : sc.avg;
  reserve_for_growth(avg, n);  // (one more token per decode step: amortized, not exact-fit)
  avg.assign(n, 0.0f);
  for (size_t h = 0; h < group; ++h) {
    float* s = &scores[h * n];
    const float mx = n ? *std::max_element(s, s + n) : neg_inf;
    if (mx == neg_inf) continue;  // nothing visible to this head
    double z = 0;
    // Portable exp (portable_math.h): which rows are fetched must not depend on the platform.
    for (size_t t = 0; t < n; ++t) z += (s[t] = pmath::exp_f32(s[t] - mx));
    for (size_t t = 0; t < n; ++t) avg[t] += float(s[t] / z / double(group));
  }
  if (k > 0 && n > 0) smallkv_topk(avg.data(), n, k, sc.order, tokens);
}

void specache_scores(const KiviHeadStore& lowbit, const float* q, const int32_t* q_positions,
                     size_t rows, float scale, std::vector<float>& k_chunk, float* scores) {
  const size_t n = lowbit.size(), dim = lowbit.head_dim();
  float* kr = at_least(k_chunk, std::min(kChunk, n) * dim).data();
  for (size_t first = 0; first < n; first += kChunk) {
    const size_t c = std::min(kChunk, n - first);
    lowbit.read_rows(first, c, kr, nullptr);  // keys only: values are never used here
    specache_score_chunk(q, q_positions, rows, kr, lowbit.positions().data() + first, c, dim,
                         scale, scores + first, n);
  }
}

void specache_select(const KiviHeadStore& lowbit, const float* q, size_t group,
                     int32_t q_position, float scale, size_t k, SpeCacheSelectScratch& sc,
                     std::vector<uint32_t>& tokens, std::vector<float>* avg_probs) {
  const size_t n = lowbit.size();
  tokens.clear();
  if (n == 0) {  // nothing stored yet: nothing to select
    if (avg_probs) avg_probs->clear();
    return;
  }
  std::vector<float>& scores = at_least(sc.scores, group * n);
  // Every row of the group at the query's position (one speculative query).
  int32_t* q_pos = at_least(sc.q_positions, group).data();
  std::fill_n(q_pos, group, q_position);
  specache_scores(lowbit, q, q_pos, group, scale, sc.k_chunk, scores.data());
  specache_select_from_scores(scores.data(), group, n, k, sc, tokens, avg_probs);
}

void specache_fetch(const SpeCacheBackingStore& backing, const std::vector<uint32_t>& tokens,
                    SpeCacheFetched& out) {
  const size_t dim = backing.dim();
  for (size_t i = 0; i < tokens.size(); ++i) {
    KVSDK_REQUIRE(tokens[i] < backing.size(), "fetched token ", tokens[i], " is beyond the ",
                  backing.size(), " tokens of the backing store");
    KVSDK_REQUIRE(i == 0 || tokens[i] > tokens[i - 1], "fetched tokens must be ascending");
  }
  out.tokens.reserve(tokens.size());  // (each reserve leaves the contents as they were)
  out.k.reserve(tokens.size() * dim);
  out.v.reserve(tokens.size() * dim);
  out.tokens.assign(tokens.begin(), tokens.end());
  out.k.resize(tokens.size() * dim);
  out.v.resize(tokens.size() * dim);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::copy_n(backing.key_row(tokens[i]), dim, &out.k[i * dim]);
    std::copy_n(backing.value_row(tokens[i]), dim, &out.v[i * dim]);
  }
}

SpeCacheFetched specache_fetch(const SpeCacheBackingStore& backing,
                               const std::vector<uint32_t>& tokens) {
  SpeCacheFetched f;
  const size_t dim = backing.dim();
  f.tokens = tokens;
  f.k.resize(tokens.size() * dim);
  f.v.resize(tokens.size() * dim);
  for (size_t i = 0; i < tokens.size(); ++i) {
    KVSDK_REQUIRE(tokens[i] < backing.size(), "fetched token ", tokens[i], " is beyond the ",
                  backing.size(), " tokens of the backing store");
    KVSDK_REQUIRE(i == 0 || tokens[i] > tokens[i - 1], "fetched tokens must be ascending");
    std::copy_n(backing.key_row(tokens[i]), dim, &f.k[i * dim]);
    std::copy_n(backing.value_row(tokens[i]), dim, &f.v[i * dim]);
  }
  return f;
}

void specache_attend(const KiviHeadStore& lowbit, const SpeCacheFetched& fetched,
                     OnlineAttention& attn) {
  std::vector<float> k, v;
  specache_attend(lowbit, fetched, attn, k, v);
}

double specache_hit_rate(const std::vector<float>& probs, const std::vector<uint32_t>& tokens) {
  double total = 0, hit = 0;
  for (float p : probs) total += p;
  for (uint32_t t : tokens) {
    if (t < probs.size()) hit += probs[t];
  }
  return total > 0 ? hit / total : 0.0;
}

void specache_fetched_shares(const float* scores, size_t rows, size_t n,
                             const std::vector<uint32_t>& tokens, float* shares) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    const float* s = scores + r * n;
    const float mx = n ? *std::max_element(s, s + n) : neg_inf;
    shares[r] = 0.0f;
    if (mx == neg_inf) continue;
    double z = 0, f = 0;
    for (size_t t = 0; t < n; ++t) z += pmath::exp_f32(s[t] - mx);
    for (uint32_t t : tokens) f += pmath::exp_f32(s[t] - mx);
    shares[r] = float(f / z);
  }
}

}  // namespace kvsdk::cpu

namespace kvsdk::cpu {

SpeCacheHead::SpeCacheHead(size_t head_dim, const KiviConfig& lowbit,
                           std::shared_ptr<BackingArena> arena)
    : lowbit_(head_dim, lowbit), backing_(head_dim, std::move(arena)) {}

SpeCacheHead::SpeCacheHead(KiviHeadStore lowbit, SpeCacheBackingStore backing,
                           SpeCacheFetched fetched)
    : lowbit_(std::move(lowbit)), backing_(std::move(backing)), fetched_(std::move(fetched)) {}

void SpeCacheHead::append(const float* k, const float* v, const int32_t* positions, size_t n) {
  backing_.reserve(n);  // the only step of the backing append that can fail
  lowbit_.append(k, v, positions, n);
  backing_.append(k, v, n);
}

size_t SpeCacheHead::remove_from(int32_t position) noexcept {
  // The backing first: it reads the low-bit copy's positions of the rows it drops. Both drop the
  // same rows: those after the quantized blocks at positions >= `position`.
  backing_.remove_from(lowbit_.quantized_tokens(), lowbit_.positions().data(), position);
  return lowbit_.remove_from(position);
}

void SpeCacheHead::prefetch(const float* spec_q, size_t group, int32_t q_position, float scale,
                            size_t k) {
  const std::vector<uint32_t> top = specache_select(lowbit_, spec_q, group, q_position, scale, k);
  fetched_ = specache_fetch(backing_, top);
}

double SpeCacheHead::hit_rate(const float* q, size_t group, int32_t q_position, float scale) const {
  std::vector<float> probs;
  specache_select(lowbit_, q, group, q_position, scale, 0, &probs);
  return specache_hit_rate(probs, fetched_.tokens);
}

}  // namespace kvsdk::cpu
