#include "session.h"

#include <algorithm>
#include <string>

#include "error.h"
#include "forward.h"

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
  embed_tokens(model_, tokens, n, position_, x, pos);
}

void Session::forward(const int* tokens, size_t n, float* logits, bool all_logits) {
  if (broken_) throw Error("session unusable after an earlier failed forward pass");
  if (n == 0) return;
  const size_t D = size_t(model_.config().dim);
  std::vector<float> x(n * D);
  std::vector<int32_t> pos(n);
  embed(tokens, n, x.data(), pos.data());
  broken_ = true;  // cleared at the end: a throw below leaves layers inconsistent
  run_layers(model_, n, x.data(), pos.data(),
             [&](uint32_t l, size_t rows, const float* q, const float* k, const float* v,
                 const int32_t* p, float* att) {
               const size_t qb = rows * D * sizeof(float);
               const size_t kvb = rows * size_t(model_.config().kv_dim()) * sizeof(float);
               check(kvsdk_cache_append(cache_, l, rows, k, v, p, kvb), "kvsdk_cache_append");
               check(kvsdk_cache_attend(cache_, l, rows, q, p, qb, att, qb), "kvsdk_cache_attend");
               // Feed the policy's importance signal with this step's queries (H2O accumulates
               // them, SnapKV/PyramidKV/XKV keep the newest as the observation window); other
               // policies ignore it.
               check(kvsdk_cache_observe(cache_, l, rows, q, p, qb), "kvsdk_cache_observe");
             },
             logits != nullptr);
  broken_ = false;
  position_ += int(n);
  if (!logits) return;
  final_logits(model_, x.data(), n, all_logits ? 0 : n - 1, logits);
}

void Session::truncate(int position) {
  if (position < 0 || position > position_) {
    throw Error("Session::truncate: position " + std::to_string(position) + " outside 0 .. " +
                std::to_string(position_));
  }
  check(kvsdk_cache_truncate(cache_, position), "kvsdk_cache_truncate");
  position_ = position;
}

void Session::plan_prefill(const int* tokens, size_t n, kvsdk_planner* planner,
                           size_t window) const {
  if (n == 0) return;
  const Config& c = model_.config();
  const size_t D = size_t(c.dim);
  std::vector<float> x(n * D);
  std::vector<int32_t> pos(n);
  embed(tokens, n, x.data(), pos.data());
  kvsdk_context* scratch_ctx = nullptr;
  check(kvsdk_context_create(&scratch_ctx, nullptr), "kvsdk_context_create");
  const size_t wn = std::min(window, n);
  try {
    // One layer's keys/values live only inside a scratch cache, freed before the next layer.
    run_layers(model_, n, x.data(), pos.data(),
               [&](uint32_t l, size_t rows, const float* q, const float* k, const float* v,
                   const int32_t* p, float* att) {
                 scratch_attention(scratch_ctx, c, rows, q, k, v, p, att);
                 check(kvsdk_planner_feed_layer(planner, l, rows, k, p,
                                                rows * size_t(c.kv_dim()) * sizeof(float), wn,
                                                q + (rows - wn) * D, p + (rows - wn),
                                                wn * D * sizeof(float)),
                       "kvsdk_planner_feed_layer");
               },
               false);  // the planner takes every layer's keys and queries, never the output
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
