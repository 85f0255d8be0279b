#include "forward.h"

#include <algorithm>
#include <string>
#include <vector>

#include "error.h"
#include "ops.h"
#include "session.h"

namespace llama {

void embed_tokens(const Model& model, const int* tokens, size_t n, int position, float* x,
                  int32_t* pos) {
  const size_t D = size_t(model.config().dim), V = size_t(model.config().vocab_size);
  for (size_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || size_t(tokens[t]) >= V) {
      throw Error("token id " + std::to_string(tokens[t]) + " out of range");
    }
  }
  // position + t stays an int32 and within kvsdk's positions (kvsdk.h, KVSDK_MAX_POSITION).
  if (position < 0 || (n > 0 && n - 1 > size_t(KVSDK_MAX_POSITION - position))) {
    throw Error("positions " + std::to_string(position) + " .. " + std::to_string(position) +
                " + " + std::to_string(n) + " - 1 leave 0 .. KVSDK_MAX_POSITION");
  }
  for (size_t t = 0; t < n; ++t) {
    std::copy_n(model.weights().token_embedding + size_t(tokens[t]) * D, D, x + t * D);
    pos[t] = position + int32_t(t);
  }
}

void run_layers(const Model& model, size_t n, float* x, const int32_t* pos,
                const LayerAttention& attention, bool output) {
  const Config& c = model.config();
  const Weights& w = model.weights();
  const size_t D = size_t(c.dim), H = size_t(c.hidden_dim), KV = size_t(c.kv_dim());
  const size_t hd = size_t(c.head_dim());
  std::vector<float> xb(n * D), q(n * D), att(n * D), proj(n * D);
  std::vector<float> k(n * KV), v(n * KV), h1(n * H), h3(n * H);
  for (size_t l = 0; l < size_t(c.n_layers); ++l) {
    for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x + t * D, w.rms_att + l * D, D);
    ops::matmul(q.data(), xb.data(), w.wq + l * D * D, n, D, D);
    ops::matmul(k.data(), xb.data(), w.wk + l * KV * D, n, D, KV);
    ops::matmul(v.data(), xb.data(), w.wv + l * KV * D, n, D, KV);
    for (size_t t = 0; t < n; ++t) {
      ops::rope(q.data() + t * D, size_t(c.n_heads), hd, pos[t]);
      ops::rope(k.data() + t * KV, size_t(c.n_kv_heads), hd, pos[t]);
    }
    attention(uint32_t(l), n, q.data(), k.data(), v.data(), pos, att.data());
    if (!output && l + 1 == size_t(c.n_layers)) break;  // the rest only feeds x
    ops::matmul(proj.data(), att.data(), w.wo + l * D * D, n, D, D);
    for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
    for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x + t * D, w.rms_ffn + l * D, D);
    ops::matmul(h1.data(), xb.data(), w.w1 + l * H * D, n, D, H);
    ops::matmul(h3.data(), xb.data(), w.w3 + l * H * D, n, D, H);
    ops::swiglu(h1.data(), h3.data(), n * H);
    ops::matmul(proj.data(), h1.data(), w.w2 + l * D * H, n, H, D);
    for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
  }
}

void final_logits(const Model& model, const float* x, size_t n, size_t first, float* logits) {
  const Config& c = model.config();
  const size_t D = size_t(c.dim), V = size_t(c.vocab_size);
  std::vector<float> xb((n - first) * D);
  for (size_t t = first; t < n; ++t) {
    ops::rmsnorm(xb.data() + (t - first) * D, x + t * D, model.weights().rms_final, D);
  }
  ops::matmul(logits, xb.data(), model.weights().wcls, n - first, D, V);
}

void scratch_attention(kvsdk_context* scratch_ctx, const Config& config, size_t n, const float* q,
                       const float* k, const float* v, const int32_t* pos, float* att) {
  kvsdk_geometry g1 = geometry_of(config);
  g1.n_layers = 1;
  const size_t D = size_t(config.dim), KV = size_t(config.kv_dim());
  kvsdk_cache* scratch = nullptr;
  check(kvsdk_cache_create(&scratch, scratch_ctx, &g1, nullptr), "kvsdk_cache_create");
  kvsdk_status st = kvsdk_cache_append(scratch, 0, n, k, v, pos, n * KV * sizeof(float));
  if (st == KVSDK_OK) {
    st = kvsdk_cache_attend(scratch, 0, n, q, pos, n * D * sizeof(float), att,
                            n * D * sizeof(float));
  }
  kvsdk_cache_destroy(scratch);
  check(st, "scratch attention");
}

}  // namespace llama
