#include "specache_decode.h"

#include <algorithm>
#include <string>

#include "error.h"
#include "forward.h"
#include "sampler.h"
#include "session.h"

namespace llama {

SpeCacheDecoder::SpeCacheDecoder(const Model& model, kvsdk_cache* cache, int position)
    : model_(model), cache_(cache), position_(position) {
  if (!cache) throw Error("SpeCacheDecoder: NULL cache");
}

void SpeCacheDecoder::prefill(const int* tokens, size_t n, float* logits) {
  if (n == 0) return;
  if (position_ != 0) throw Error("SpeCacheDecoder::prefill starts a conversation (position 0)");
  const Config& c = model_.config();
  std::vector<float> x(n * size_t(c.dim));
  std::vector<int32_t> pos(n);
  embed_tokens(model_, tokens, n, position_, x.data(), pos.data());
  kvsdk_context* scratch_ctx = nullptr;
  check(kvsdk_context_create(&scratch_ctx, nullptr), "kvsdk_context_create");
  try {
    run_layers(model_, n, x.data(), pos.data(),
               [&](uint32_t l, size_t rows, const float* q, const float* k, const float* v,
                   const int32_t* p, float* att) {
                 check(kvsdk_cache_append(cache_, l, rows, k, v, p,
                                          rows * size_t(c.kv_dim()) * sizeof(float)),
                       "kvsdk_cache_append");
                 // Full-precision attention over this layer's prompt K/V (prefill() starts a
                 // conversation, so the cache holds nothing earlier).
                 scratch_attention(scratch_ctx, c, rows, q, k, v, p, att);
               });
  } catch (...) {
    kvsdk_context_destroy(scratch_ctx);
    throw;
  }
  kvsdk_context_destroy(scratch_ctx);
  position_ += int(n);
  if (logits) final_logits(model_, x.data(), n, 0, logits);
}

int SpeCacheDecoder::pre_decode(int token) {
  const size_t V = size_t(model_.config().vocab_size);
  std::vector<float> logits(V);
  pass(&token, 1, false, logits.data());
  return argmax(logits.data(), V);
}

int SpeCacheDecoder::step(int token, int spec, float* logits) {
  const size_t V = size_t(model_.config().vocab_size);
  const int tokens[2] = {token, spec};
  std::vector<float> both(2 * V);
  pass(tokens, 2, true, both.data());
  std::copy_n(both.data(), V, logits);
  position_ += 1;  // only the output token entered the cache
  return argmax(both.data() + V, V);
}

void SpeCacheDecoder::pass(const int* tokens, size_t n, bool append_first, float* logits) {
  const Config& c = model_.config();
  const size_t D = size_t(c.dim), KV = size_t(c.kv_dim());
  std::vector<float> x(n * D);
  std::vector<int32_t> pos(n);
  embed_tokens(model_, tokens, n, position_, x.data(), pos.data());
  const size_t spec = n - 1;  // the row whose queries pick the next step's rows
  run_layers(model_, n, x.data(), pos.data(),
             [&](uint32_t layer, size_t rows, const float* q, const float* k, const float* v,
                 const int32_t* p, float* att) {
               if (append_first) {
                 check(kvsdk_cache_append(cache_, layer, 1, k, v, p, KV * sizeof(float)),
                       "kvsdk_cache_append");
               }
               // Both rows attend in one call, over the rows fetched for this step, so the cache
               // reads its low-bit copy once for both (SpeCache §3.3 decodes them together): the
               // output token first (the cache measures the fetch hit rate on it), then the
               // speculative token, whose scores the prefetch below reuses. The speculative token
               // does not see its own K/V (never appended); it only needs to be a good guess.
               check(kvsdk_cache_attend(cache_, layer, rows, q, p, rows * D * sizeof(float), att,
                                        rows * D * sizeof(float)),
                     "kvsdk_cache_attend");
               check(kvsdk_cache_prefetch(cache_, layer, 1, q + spec * D, p + spec,
                                          D * sizeof(float)),
                     "kvsdk_cache_prefetch");
             });
  final_logits(model_, x.data(), n, 0, logits);
}

}  // namespace llama
