// One conversation with a Llama model whose KV cache is entirely a kvsdk cache: every layer
// appends its rotated keys and values (with their absolute positions) to the cache and attends
// its queries through kvsdk_cache_attend. The session keeps no K/V of its own, so whatever the
// cache's policy evicts or compresses is really gone from the model's view.
#pragma once

#include <cstddef>
#include <vector>

#include "kvsdk.h"
#include "model.h"

namespace llama {

// The kvsdk geometry of `config`: f32 tensors, interleaved RoPE, theta 10000.
kvsdk_geometry geometry_of(const Config& config);

class Session {
 public:
  // Creates an empty cache on `ctx` under `policy` (NULL = full). Throws KvsdkError when
  // kvsdk_cache_create fails (e.g. KVSDK_E_UNSUPPORTED for a method not built yet).
  Session(const Model& model, kvsdk_context* ctx, const kvsdk_policy* policy);
  // Adopts `cache` (e.g. loaded from a snapshot); the session destroys it. `position` is the
  // position of the next token (the number of tokens the cache has seen).
  Session(const Model& model, kvsdk_cache* cache, int position);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs `n` tokens at positions position() .. position()+n-1 (causal within the chunk).
  // `logits`: NULL, or the last token's vocab_size logits, or with `all_logits` n x vocab_size.
  // Without logits the last layer stops after its attention (run_layers: nothing else reads it).
  // Throws KvsdkError when the cache refuses an append (KVSDK_E_BUDGET); the session is then
  // unusable (some layers hold the chunk, others do not) and later calls throw llama::Error.
  void forward(const int* tokens, size_t n, float* logits, bool all_logits = false);

  // XKV mini-prefill (kvsdk_planner_*): a first pass over the `n` prompt tokens at positions
  // position() .. that never touches the session's cache. Each layer attends through a temporary
  // one-layer full cache (so at most one layer's keys/values exist at a time), then feeds the
  // planner its keys and the last `window` queries. The session's position does not move.
  void plan_prefill(const int* tokens, size_t n, kvsdk_planner* planner, size_t window) const;

  // Feeds one token and returns its next-token logits (vocab_size floats, owned by the session).
  const float* step(int token);

  // Rewinds the conversation to `position` (kvsdk_cache_truncate): the tokens from there on are
  // gone and the next token goes to `position`. Throws KvsdkError (the session unchanged) when
  // the cache's policy cannot remove them exactly (KVSDK_E_STATE).
  void truncate(int position);

  int position() const { return position_; }
  kvsdk_cache* cache() const { return cache_; }
  const Model& model() const { return model_; }

 private:
  // Checks the token ids and writes their embeddings [n][dim] and positions (from the session's
  // current position); shared by the forward pass and the planning pass.
  void embed(const int* tokens, size_t n, float* x, int32_t* pos) const;

  const Model& model_;
  kvsdk_cache* cache_ = nullptr;
  int position_ = 0;
  bool broken_ = false;
  std::vector<float> step_logits_;
};

}  // namespace llama
