// Optimized online-softmax attention over f32 chunks: the SIMD counterpart of cpu::OnlineAttention
// (attention.h) for the tiers that reconstruct their rows chunk by chunk (SpindleKV codebooks,
// MiniCache+KIVI pairs and their pending rows, SpeCache's low-bit copy with fetched rows; the f16
// MiniCache pair is read in place by fast::attend_scaled_f16 instead). The
// chunk-feeding functions (spindlekv_attend, minicache_attend, ...) are templates on their sink, so
// the reference backend feeds OnlineAttention and the optimized backend feeds this class.
//
// Same bits on every target (AVX-512, AVX2, SSE4, NEON, scalar), as fast_attention.h:
//  - dot products accumulate in 16 fixed virtual lanes reduced by one fixed tree, tail channels in
//    order;
//  - exp is fast::exp_f32 (elementwise, no FMA: the build passes -ffp-contract=off);
//  - the running sum adds token by token, and values accumulate per channel token by token.
// Not bit-identical to OnlineAttention (another summation order and exp); backend_ops_test bounds
// the gap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fast_attention.h"

namespace kvsdk::cpu::fast {

// Working memory of a ChunkAttention, reused across calls (no allocation once grown).
struct ChunkScratch {
  std::vector<float> m, l, acc, sc;
};

class ChunkAttention {
 public:
  // Rows of `q` (their pointers must outlive this object); state in `scratch`, which no other
  // live ChunkAttention may share.
  ChunkAttention(const Queries& q, ChunkScratch& scratch);
  ChunkAttention(const ChunkAttention&) = delete;
  ChunkAttention& operator=(const ChunkAttention&) = delete;

  // Adds `n_tokens` keys/values (f32 [n_tokens][dim]) with their positions.
  void add_chunk(const float* k, const float* v, const int32_t* positions, size_t n_tokens);
  // Writes normalized outputs [n_rows][dim]; rows that saw no token get zeros.
  void finish(float* out) const;

 private:
  Queries q_;
  ChunkScratch& s_;
};

}  // namespace kvsdk::cpu::fast
