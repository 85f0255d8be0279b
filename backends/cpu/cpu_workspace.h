// The working memory of the CPU backends (backend_ops.h's Workspace): one per cache and thread,
// grown to the largest shape seen and then reused, so the decode path allocates nothing.
#pragma once

#include <cstddef>

#include <cstdint>
#include <vector>

#include "attention.h"
#include "attention_scores.h"
#include "fast_attention.h"
#include "fast_chunk_attention.h"
#include "minicache_merge.h"
#include "specache.h"
#include "util/error.h"

namespace kvsdk::backend {

// Tokens the reference kernels convert to f32 at a time (bounded scratch, never a dense copy).
constexpr size_t kReferenceChunk = 256;

struct Workspace {
  cpu::AttentionScratch attention;  // reference: OnlineAttention state and f32 chunks
  cpu::fast::Scratch fast;          // optimized: SIMD kernels' state
  cpu::ColumnSumsScratch scores;    // optimized window scoring: logits and key chunks
  std::vector<uint32_t> select_mid; // select_keep's middle range
  cpu::fast::ChunkScratch chunk;    // optimized: the chunk-fed tiers' online softmax
  cpu::MiniCacheScratch minicache;  // MiniCache+KIVI: dequantized directions of a chunk
  cpu::SpeCacheSelectScratch specache;  // SpeCache selection: scores, probabilities, top-k
};

// The split-K entries' check (Ops::attend_*_range): tokens [first, first + count) within n_tokens,
// else kvsdk::Error (KVSDK_E_INVALID_ARG) naming `op`.
inline void require_token_range(const char* op, size_t first, size_t count, size_t n_tokens) {
  if (first > n_tokens || count > n_tokens - first) {
    fail(KVSDK_E_INVALID_ARG, op, ": tokens [", first, ", ", first + count, ") past ", n_tokens);
  }
}

}  // namespace kvsdk::backend
