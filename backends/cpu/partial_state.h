// Split-K's softmax state: one type for the backend seam (backend_ops.h: attend_*_range,
// merge_partials), the reference merge (attention.h) and the fused SIMD kernels
// (fast_attention.h), so states pass between them without conversion.
#pragma once

namespace kvsdk::backend {

// The softmax state of n_rows query rows over some of a head's tokens, in caller memory: each
// row's running max score, its sum of exp(score - max), and the unnormalized sum of
// exp(score - max) * value rows. A row that saw no token has max -inf, sum 0 and acc 0.
struct PartialState {
  float* max = nullptr;  // [n_rows]
  float* sum = nullptr;  // [n_rows]
  float* acc = nullptr;  // [n_rows][dim]
};

}  // namespace kvsdk::backend
