// The Llama transformer pass shared by every way the runtime runs a model (Session's cached
// forward pass and its cache-free planning pass, SpeCache's prefill and decode step): embedding,
// per layer RMSNorm -> Q/K/V -> interleaved RoPE -> attention -> output projection -> RMSNorm ->
// SwiGLU feed-forward, and the final norm + classifier. Only the attention differs between those
// callers, so it is a callback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kvsdk.h"
#include "model.h"

namespace llama {

// Writes the embeddings x [n][dim] of `tokens` and their positions position .. position+n-1.
// Throws Error for a token id outside the vocabulary or positions outside
// 0 .. KVSDK_MAX_POSITION (before writing anything).
void embed_tokens(const Model& model, const int* tokens, size_t n, int position, float* x,
                  int32_t* pos);

// One layer's attention: q [n][dim] and k, v [n][kv_dim] of the rows (RoPE applied), their
// positions; writes the attention output att [n][dim].
using LayerAttention = std::function<void(uint32_t layer, size_t n, const float* q, const float* k,
                                          const float* v, const int32_t* pos, float* att)>;

// Runs the hidden states x [n][dim] through every layer in place. `output` false: the caller
// does not read x afterwards (no logits wanted), so the last layer stops after its attention: its
// output projection and feed-forward only feed x, never a cache, and nothing observable changes.
// (SmallKV's proxy never produces tokens and always runs so: the paper's early layer stopping.)
void run_layers(const Model& model, size_t n, float* x, const int32_t* pos,
                const LayerAttention& attention, bool output = true);

// Logits of rows [first, n) of x: [n - first][vocab_size].
void final_logits(const Model& model, const float* x, size_t n, size_t first, float* logits);

// Exact attention of q over this layer's own rows k/v only, through a temporary one-layer 'full'
// cache on `scratch_ctx` (freed before returning): the cache-free passes use it.
void scratch_attention(kvsdk_context* scratch_ctx, const Config& config, size_t n, const float* q,
                       const float* k, const float* v, const int32_t* pos, float* att);

}  // namespace llama
