#include "specache_decode.h"

#include <algorithm>
#include <string>

#include "error.h"
#include "ops.h"
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
  const Weights& w = model_.weights();
  const size_t D = size_t(c.dim), H = size_t(c.hidden_dim), KV = size_t(c.kv_dim());
  const size_t hd = size_t(c.head_dim()), V = size_t(c.vocab_size);
  std::vector<float> x(n * D), xb(n * D), q(n * D), att(n * D), proj(n * D);
  std::vector<float> k(n * KV), v(n * KV), h1(n * H), h3(n * H);
  std::vector<int32_t> pos(n);
  for (size_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || size_t(tokens[t]) >= V) {
      throw Error("token id " + std::to_string(tokens[t]) + " out of range");
    }
    std::copy_n(w.token_embedding + size_t(tokens[t]) * D, D, x.data() + t * D);
    pos[t] = position_ + int32_t(t);
  }
  kvsdk_geometry g1 = geometry_of(c);
  g1.n_layers = 1;
  kvsdk_context* scratch_ctx = nullptr;
  check(kvsdk_context_create(&scratch_ctx, nullptr), "kvsdk_context_create");
  try {
    for (size_t l = 0; l < size_t(c.n_layers); ++l) {
      for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_att + l * D, D);
      ops::matmul(q.data(), xb.data(), w.wq + l * D * D, n, D, D);
      ops::matmul(k.data(), xb.data(), w.wk + l * KV * D, n, D, KV);
      ops::matmul(v.data(), xb.data(), w.wv + l * KV * D, n, D, KV);
      for (size_t t = 0; t < n; ++t) {
        ops::rope(q.data() + t * D, size_t(c.n_heads), hd, pos[t]);
        ops::rope(k.data() + t * KV, size_t(c.n_kv_heads), hd, pos[t]);
      }
      check(kvsdk_cache_append(cache_, uint32_t(l), n, k.data(), v.data(), pos.data(),
                               k.size() * sizeof(float)),
            "kvsdk_cache_append");
      // Full-precision attention over this layer's prompt K/V (the earlier context of the cache,
      // if any, is not in the scratch: prefill() starts a conversation).
      kvsdk_cache* scratch = nullptr;
      check(kvsdk_cache_create(&scratch, scratch_ctx, &g1, nullptr), "kvsdk_cache_create");
      kvsdk_status st = kvsdk_cache_append(scratch, 0, n, k.data(), v.data(), pos.data(),
                                           k.size() * sizeof(float));
      if (st == KVSDK_OK) {
        st = kvsdk_cache_attend(scratch, 0, n, q.data(), pos.data(), q.size() * sizeof(float),
                                att.data(), att.size() * sizeof(float));
      }
      kvsdk_cache_destroy(scratch);
      check(st, "prefill attention");
      ops::matmul(proj.data(), att.data(), w.wo + l * D * D, n, D, D);
      for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
      for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_ffn + l * D, D);
      ops::matmul(h1.data(), xb.data(), w.w1 + l * H * D, n, D, H);
      ops::matmul(h3.data(), xb.data(), w.w3 + l * H * D, n, D, H);
      ops::swiglu(h1.data(), h3.data(), n * H);
      ops::matmul(proj.data(), h1.data(), w.w2 + l * D * H, n, H, D);
      for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
    }
  } catch (...) {
    kvsdk_context_destroy(scratch_ctx);
    throw;
  }
  kvsdk_context_destroy(scratch_ctx);
  position_ += int(n);
  if (!logits) return;
  for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_final, D);
  ops::matmul(logits, xb.data(), w.wcls, n, D, V);
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
  const Weights& w = model_.weights();
  const size_t D = size_t(c.dim), H = size_t(c.hidden_dim), KV = size_t(c.kv_dim());
  const size_t hd = size_t(c.head_dim()), V = size_t(c.vocab_size);
  std::vector<float> x(n * D), xb(n * D), q(n * D), att(n * D), proj(n * D);
  std::vector<float> k(n * KV), v(n * KV), h1(n * H), h3(n * H);
  std::vector<int32_t> pos(n);
  for (size_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || size_t(tokens[t]) >= V) {
      throw Error("token id " + std::to_string(tokens[t]) + " out of range");
    }
    std::copy_n(w.token_embedding + size_t(tokens[t]) * D, D, x.data() + t * D);
    pos[t] = position_ + int32_t(t);
  }
  const size_t spec = n - 1;  // the row whose queries pick the next step's rows
  for (size_t l = 0; l < size_t(c.n_layers); ++l) {
    const uint32_t layer = uint32_t(l);
    for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_att + l * D, D);
    ops::matmul(q.data(), xb.data(), w.wq + l * D * D, n, D, D);
    ops::matmul(k.data(), xb.data(), w.wk + l * KV * D, n, D, KV);
    ops::matmul(v.data(), xb.data(), w.wv + l * KV * D, n, D, KV);
    for (size_t t = 0; t < n; ++t) {
      ops::rope(q.data() + t * D, size_t(c.n_heads), hd, pos[t]);
      ops::rope(k.data() + t * KV, size_t(c.n_kv_heads), hd, pos[t]);
    }
    if (append_first) {
      check(kvsdk_cache_append(cache_, layer, 1, k.data(), v.data(), pos.data(), KV * sizeof(float)),
            "kvsdk_cache_append");
    }
    // Each row attends on its own: the output token first, with the rows fetched for it (this is
    // where the cache measures the fetch hit rate), then the speculative token. The speculative
    // token does not see its own K/V (never appended); it only needs to be a good guess.
    for (size_t t = 0; t < n; ++t) {
      check(kvsdk_cache_attend(cache_, layer, 1, q.data() + t * D, pos.data() + t, D * sizeof(float),
                               att.data() + t * D, D * sizeof(float)),
            "kvsdk_cache_attend");
    }
    check(kvsdk_cache_prefetch(cache_, layer, 1, q.data() + spec * D, pos.data() + spec,
                               D * sizeof(float)),
          "kvsdk_cache_prefetch");
    ops::matmul(proj.data(), att.data(), w.wo + l * D * D, n, D, D);
    for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
    for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_ffn + l * D, D);
    ops::matmul(h1.data(), xb.data(), w.w1 + l * H * D, n, D, H);
    ops::matmul(h3.data(), xb.data(), w.w3 + l * H * D, n, D, H);
    ops::swiglu(h1.data(), h3.data(), n * H);
    ops::matmul(proj.data(), h1.data(), w.w2 + l * D * H, n, H, D);
    for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
  }
  for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_final, D);
  ops::matmul(logits, xb.data(), w.wcls, n, D, V);
}

}  // namespace llama
