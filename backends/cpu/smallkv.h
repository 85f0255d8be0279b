// SmallKV: small-model-assisted compensation of KV cache compression (Zhao et al.; SmallKV
// (docs/papers.md) §4).
//  - Eq. 1: accumulated attention F(A, C)_v = Σ_u A[u, v] (column sums; computed by the caller).
//  - Eq. 2: similarity of a large-model head i and a proxy head j = Jaccard similarity of the
//    top-k token sets of their accumulated attention; Eq. 3: f(i) = argmax_j S(A_i, A'_j).
//  - §4 budget allocation: critical : recent : marginal = 2 : 1 : 2, marginal tokens keep only V (half cost).
//  - Eq. 6: attention with marginal compensation: critical (and recent) tokens use the large
//    model's own attention, marginal tokens the matched proxy head's attention weights A'_{f(i)},
//    evicted tokens 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::cpu {

// Eq. 1 for one attention head: column sums over `n_q` query rows q [n_q][dim] of the softmax
// attention against keys k [n][dim] (causal by position), written to out [n].
void smallkv_accumulated_attention(const float* q, const int32_t* q_positions, size_t n_q,
                                   const float* k, const int32_t* positions, size_t n,
                                   size_t dim, float scale, float* out);

// The proxy side of Eq. 6: softmax probabilities of query rows q [n_rows][dim] over the proxy's
// full head k [n][dim] (causal by position), gathered at `wanted` positions into
// out [n_rows][n_wanted]. A wanted position the proxy does not hold gets 0.
void smallkv_proxy_weights(const float* q, const int32_t* q_positions, size_t n_rows,
                           const float* k, const int32_t* positions, size_t n, size_t dim,
                           float scale, const int32_t* wanted, size_t n_wanted, float* out);

// The softmax of Eq. 6's proxy side before the gather: probabilities of query rows q [n_rows][dim]
// over keys k [n][dim] (causal by position) into out [n_rows][n], 0 where masked (a row that sees
// no key: all 0). Double-precision softmax with the portable exp: the reference kernel (these
// probabilities accumulate into saved importance); smallkv_proxy_weights is this plus a gather.
void smallkv_softmax_rows(const float* q, const int32_t* q_positions, size_t n_rows,
                          const float* k, const int32_t* positions, size_t n, size_t dim,
                          float scale, float* out);

// Indices of the k largest scores (ties: lower index first), returned in ascending index order.
std::vector<uint32_t> smallkv_topk(const float* scores, size_t n, size_t k);
// The same into `out`, with `order` as working memory (both reuse their capacity).
void smallkv_topk(const float* scores, size_t n, size_t k, std::vector<uint32_t>& order,
                  std::vector<uint32_t>& out);

// Eq. 2 on two accumulated-attention vectors of n tokens. 1 when both top-k sets are empty.
double smallkv_jaccard(const float* a, const float* b, size_t n, size_t k);

// Eq. 3: for each of `n_large` heads (rows of large_scores [n_large][n_tokens]) the proxy head
// (row of proxy_scores [n_proxy][n_tokens]) of highest Jaccard similarity; ties: lowest index.
// Heads are numbered across layers (layer * heads_per_layer + head) by the caller.
std::vector<uint32_t> smallkv_match_heads(const float* large_scores, size_t n_large,
                                          const float* proxy_scores, size_t n_proxy,
                                          size_t n_tokens, size_t k);

// Token counts for one KV head holding `n_tokens` under a budget of `budget_tokens` full (K+V)
// token equivalents. Marginal tokens cost half, so critical + recent + marginal/2 <= budget.
// When everything fits, all tokens are critical.
struct SmallKvSplit {
  size_t critical = 0, recent = 0, marginal = 0;
};
SmallKvSplit smallkv_split_budget(size_t budget_tokens, size_t n_tokens);

// Which tokens of a head keep K+V (critical: the `recent` newest plus the top `critical` older
// tokens by the proxy's scores) and which keep only V (marginal: the next `marginal` by score).
// Both lists are ascending token indices; every other token is evicted.
struct SmallKvSelection {
  std::vector<uint32_t> full;      // critical + recent (K and V)
  std::vector<uint32_t> marginal;  // V only
};
SmallKvSelection smallkv_select(const float* proxy_scores, size_t n_tokens, const SmallKvSplit& s);
// The same selection on a head that already holds value-only tokens (has_key[t] == 0; null means
// every token has its key): the recent window is the `recent` newest tokens that have keys, then
// the other tokens in descending score become critical while critical slots remain and the token
// has its key (a dropped key cannot come back), else marginal while marginal slots remain, else
// evicted. With every key present this is exactly smallkv_select above.
SmallKvSelection smallkv_select(const float* proxy_scores, const uint8_t* has_key, size_t n_tokens,
                                const SmallKvSplit& s);
// The same into `out`, with caller-owned working memory: `out`'s lists and the scratch keep their
// capacity, so a selection allocates nothing once they have grown to the head's size.
struct SmallKvSelectScratch {
  std::vector<uint8_t> kind;
  std::vector<uint32_t> cand;
};
void smallkv_select(const float* proxy_scores, const uint8_t* has_key, size_t n_tokens,
                    const SmallKvSplit& s, SmallKvSelectScratch& scratch, SmallKvSelection& out);

// Eq. 6 for one KV head. Query rows q [n_rows][dim] (the queries of the group's heads) with their
// positions; full tokens k/v [n_full][dim] with positions; marginal values [n_marg][dim] with
// positions, and proxy_weights [n_rows][n_marg]: the matched proxy head's attention probability of
// each marginal token at this step. Writes out [n_rows][dim].
//
// The large model's probabilities A_i over its kept keys are only known up to the mass of the kept
// set; a softmax over the kept keys is normalised to 1. We give that set the mass the proxy does
// not put on marginal tokens: A*[k] = (1 - M) · softmax_full(q·K)[k] for kept tokens and A'[k] for
// marginal ones, M = Σ_marginal A'. Weights then sum to 1 and, without marginal tokens, this is
// exactly attention over the kept tokens (as every eviction method computes it). Tokens later than
// a row's position are masked for both kinds.
void smallkv_attend(const float* q, const int32_t* q_positions, size_t n_rows, size_t dim,
                    float scale, const float* k_full, const float* v_full,
                    const int32_t* full_positions, size_t n_full, const float* v_marginal,
                    const int32_t* marginal_positions, size_t n_marginal,
                    const float* proxy_weights, float* out);
// The same with the softmax state in caller-owned scratch (reused: no allocation once grown).
struct AttentionScratch;
// Eq. 6's marginal term (SmallKV (docs/papers.md) Eq. 6) on `out` [n_rows][dim], which holds each row's softmax attention over the
// kept (full) tokens: scales it by 1 - M and adds the marginal values weighted by the proxy's
// probabilities; proxy_weights row r starts at proxy_weights + r * weights_stride. Both backends'
// smallkv attention end with this, so Eq. 6 lives here once.
void smallkv_add_marginal(const int32_t* q_positions, size_t n_rows, size_t dim,
                          const float* v_marginal, const int32_t* marginal_positions,
                          size_t n_marginal, const float* proxy_weights, size_t weights_stride,
                          float* out);
void smallkv_attend(const float* q, const int32_t* q_positions, size_t n_rows, size_t dim,
                    float scale, const float* k_full, const float* v_full,
                    const int32_t* full_positions, size_t n_full, const float* v_marginal,
                    const int32_t* marginal_positions, size_t n_marginal,
                    const float* proxy_weights, float* out, AttentionScratch& scratch);

}  // namespace kvsdk::cpu
