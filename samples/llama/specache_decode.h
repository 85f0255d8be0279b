// SpeCache's decoding (SpeCache (docs/papers.md) §3.3, Algorithms 2 and 3) on a cache with policy
// 'specache': each step decodes the output token T_t and a speculative token T'_{t+1} together.
// T_t's keys and values are appended and its attention uses the full-precision rows fetched in the
// previous step (kvsdk_cache_attend); T'_{t+1} attends the same cache (its K/V are never appended:
// it is only a guess) and its queries go to kvsdk_cache_prefetch at every layer, so the next step's
// attention finds the rows the next token most likely needs already fetched. The speculative token
// of the next step is the argmax of T'_{t+1}'s logits.
//
// The first step needs rows for T_1 before any speculative token exists: a pre-decoding pass
// (Algorithm 2) runs T_1 over the low-bit cache without appending it, prefetches with its own
// queries, and gives the first speculative token T'_2.
#pragma once

#include <vector>

#include "kvsdk.h"
#include "model.h"

namespace llama {

class SpeCacheDecoder {
 public:
  // Continues `cache` (not owned; a 'specache' cache the prefill filled up to `position`).
  SpeCacheDecoder(const Model& model, kvsdk_cache* cache, int position);

  // Prefilling (Algorithm 1): appends `n` prompt tokens at position() .. to the cache, layer by
  // layer, with each layer's attention computed in full precision over a transient one-layer
  // exact cache of the prompt (as the paper's prefill attends the 16-bit K/V before offloading
  // them); that scratch lives outside the budgeted cache and is freed before the next layer.
  // Only at position 0 (throws Error otherwise). `logits`: NULL or the n x vocab_size logits.
  void prefill(const int* tokens, size_t n, float* logits);
  // Pre-decoding of the first output token: returns the first speculative token.
  int pre_decode(int token);
  // One decoding step: `token` at position() (appended) and the speculative `spec` at
  // position() + 1 (not appended). Writes `token`'s next-token logits (vocab_size floats) to
  // `logits` and returns the next speculative token. Throws KvsdkError / Error on failure (the
  // cache may then hold `token` in some layers only, like Session::forward).
  int step(int token, int spec, float* logits);

  int position() const { return position_; }

 private:
  // Runs rows tokens[0..n) through every layer. Row 0 is appended when `append_first`; the last
  // row's queries are prefetched. Writes every row's logits [n][vocab] to `logits`.
  void pass(const int* tokens, size_t n, bool append_first, float* logits);

  const Model& model_;
  kvsdk_cache* cache_;
  int position_;
};

}  // namespace llama
