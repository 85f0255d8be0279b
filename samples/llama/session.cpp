#include "session.h"

#include <algorithm>
#include <string>

#include "error.h"
#include "ops.h"

namespace llama {

kvsdk_geometry geometry_of(const Config& c) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = uint32_t(c.n_layers);
  g.n_q_heads = uint32_t(c.n_heads);
  g.n_kv_heads = uint32_t(c.n_kv_heads);
  g.head_dim = uint32_t(c.head_dim());
  g.dtype = KVSDK_DTYPE_F32;
  g.rope_style = KVSDK_ROPE_INTERLEAVED;
  g.rope_theta = 10000.0f;
  return g;
}

Session::Session(const Model& model, kvsdk_context* ctx, const kvsdk_policy* policy)
    : model_(model) {
  const kvsdk_geometry g = geometry_of(model.config());
  check(kvsdk_cache_create(&cache_, ctx, &g, policy), "kvsdk_cache_create");
}

Session::Session(const Model& model, kvsdk_cache* cache, int position)
    : model_(model), cache_(cache), position_(position) {
  if (!cache) throw Error("Session: NULL cache");
  if (position < 0) throw Error("Session: negative position");
}

Session::~Session() { kvsdk_cache_destroy(cache_); }

void Session::embed(const int* tokens, size_t n, float* x, int32_t* pos) const {
  const size_t D = size_t(model_.config().dim), V = size_t(model_.config().vocab_size);
  for (size_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || size_t(tokens[t]) >= V) {
      throw Error("token id " + std::to_string(tokens[t]) + " out of range");
    }
  }
  for (size_t t = 0; t < n; ++t) {
    std::copy_n(model_.weights().token_embedding + size_t(tokens[t]) * D, D, x + t * D);
    pos[t] = position_ + int32_t(t);
  }
}

void Session::forward(const int* tokens, size_t n, float* logits, bool all_logits) {
  if (broken_) throw Error("session unusable after an earlier failed forward pass");
  if (n == 0) return;
  const Config& c = model_.config();
  const Weights& w = model_.weights();
  const size_t D = size_t(c.dim), H = size_t(c.hidden_dim), KV = size_t(c.kv_dim());
  const size_t hd = size_t(c.head_dim()), V = size_t(c.vocab_size);
  std::vector<float> x(n * D), xb(n * D), q(n * D), att(n * D), proj(n * D);
  std::vector<float> k(n * KV), v(n * KV), h1(n * H), h3(n * H);
  std::vector<int32_t> pos(n);
  embed(tokens, n, x.data(), pos.data());
  broken_ = true;  // cleared at the end: a throw below leaves layers inconsistent
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
    check(kvsdk_cache_attend(cache_, uint32_t(l), n, q.data(), pos.data(), q.size() * sizeof(float),
                             att.data(), att.size() * sizeof(float)),
          "kvsdk_cache_attend");
    // Feed the policy's importance signal with this step's queries (H2O accumulates them,
    // SnapKV/PyramidKV/XKV keep the newest as the observation window); other policies ignore it.
    check(kvsdk_cache_observe(cache_, uint32_t(l), n, q.data(), pos.data(),
                              q.size() * sizeof(float)),
          "kvsdk_cache_observe");
    ops::matmul(proj.data(), att.data(), w.wo + l * D * D, n, D, D);
    for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];

    for (size_t t = 0; t < n; ++t) ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_ffn + l * D, D);
    ops::matmul(h1.data(), xb.data(), w.w1 + l * H * D, n, D, H);
    ops::matmul(h3.data(), xb.data(), w.w3 + l * H * D, n, D, H);
    ops::swiglu(h1.data(), h3.data(), n * H);
    ops::matmul(proj.data(), h1.data(), w.w2 + l * D * H, n, H, D);
    for (size_t i = 0; i < n * D; ++i) x[i] += proj[i];
  }
  broken_ = false;
  position_ += int(n);
  if (!logits) return;
  const size_t first = all_logits ? 0 : n - 1;
  for (size_t t = first; t < n; ++t) {
    ops::rmsnorm(xb.data() + t * D, x.data() + t * D, w.rms_final, D);
  }
  ops::matmul(logits, xb.data() + first * D, w.wcls, n - first, D, V);
}

void Session::plan_prefill(const int* tokens, size_t n, kvsdk_planner* planner,
                           size_t window) const {
  if (n == 0) return;
  const Config& c = model_.config();
  const Weights& w = model_.weights();
  const size_t D = size_t(c.dim), H = size_t(c.hidden_dim), KV = size_t(c.kv_dim());
  const size_t hd = size_t(c.head_dim());
  std::vector<float> x(n * D), xb(n * D), q(n * D), att(n * D), proj(n * D);
  std::vector<float> k(n * KV), v(n * KV), h1(n * H), h3(n * H);
  std::vector<int32_t> pos(n);
  embed(tokens, n, x.data(), pos.data());
  kvsdk_geometry g1 = geometry_of(c);
  g1.n_layers = 1;
  kvsdk_context* scratch_ctx = nullptr;
  check(kvsdk_context_create(&scratch_ctx, nullptr), "kvsdk_context_create");
  const size_t wn = std::min(window, n);
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
      // One layer's keys/values live only inside this scratch cache, freed before the next layer.
      kvsdk_cache* scratch = nullptr;
      check(kvsdk_cache_create(&scratch, scratch_ctx, &g1, nullptr), "kvsdk_cache_create");
      kvsdk_status st = kvsdk_cache_append(scratch, 0, n, k.data(), v.data(), pos.data(),
                                           k.size() * sizeof(float));
      if (st == KVSDK_OK) {
        st = kvsdk_cache_attend(scratch, 0, n, q.data(), pos.data(), q.size() * sizeof(float),
                                att.data(), att.size() * sizeof(float));
      }
      kvsdk_cache_destroy(scratch);
      check(st, "mini-prefill attention");
      check(kvsdk_planner_feed_layer(planner, uint32_t(l), n, k.data(), pos.data(),
                                     k.size() * sizeof(float), wn, q.data() + (n - wn) * D,
                                     pos.data() + (n - wn), wn * D * sizeof(float)),
            "kvsdk_planner_feed_layer");
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
}

const float* Session::step(int token) {
  step_logits_.resize(size_t(model_.config().vocab_size));
  forward(&token, 1, step_logits_.data());
  return step_logits_.data();
}

}  // namespace llama
