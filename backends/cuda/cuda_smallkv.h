// SmallKV's attention compensation on the device: "SmallKV: Small Model Assisted Compensation of
// KV Cache Compression for Efficient LLM Inference" (Zhao et al., 2025; docs/papers.md), Eq. 6.
// A large-model head keeps its critical and recent tokens with keys and values (the "full" rows,
// attended by cuda_decode_attention) and its marginal tokens as values only; the matched proxy
// (small-model) head supplies the attention those marginal tokens get. The two kernels here are
// the proxy side and the marginal term of Eq. 6, with the CPU reference's bits (both compiled
// with --fmad=false, so that no multiply and add is fused into an FMA the reference does not do):
//
//  - smallkv_softmax: the proxy's probabilities of each query row over f16 keys, causal by
//    position, as cpu::smallkv_softmax_rows computes them (backends/cpu/smallkv.cpp): each score
//    dot_f32's four partial sums in f32 over the widened keys, times scale in double, the row's
//    maximum, the portable exp (backends/cpu/portable_exp.h) of score - max in double, their sum
//    in token order in double, and each probability divided by it, rounded to f32. These
//    probabilities become saved importance (and the marginal weights below), so a device cache
//    must produce the reference's bits for its snapshots to be interchangeable with a CPU's.
//  - smallkv_add_marginal: out = (1 - M) * out + sum_t w_t * v_t per query row, M the proxy's mass
//    on the marginal rows the row may see (cpu::smallkv_add_marginal: M summed in double in
//    token order, 1 - M clamped at 0 and rounded to f32, then each product and sum in f32, token
//    after token).
//
// What is sequential because the reference's order of operations is: each score is one thread's
// dot product (its four partial sums cannot be split across lanes without changing the rounding),
// each row's normaliser is one thread's sum in token order (blocks of exponentials computed in
// parallel, added by one thread), and each row's mass M likewise. Unmeasured on a GPU.
//
// Device pointers; enqueued on `stream`, nothing synchronises. Arguments are validated on the
// host (kvsdk::Error KVSDK_E_INVALID_ARG); a failed launch is KVSDK_E_BACKEND.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// out [rows][n] = each row's softmax over the keys k [n][dim] (f16) whose position is at most
// the row's (q_pos[r]; INT32_MAX sees every key), scores q_r . k_t * scale; 0 where masked, and
// the whole row 0 when it sees no key. q [rows][dim] f32. out also holds the scores in between
// (no other working memory).
void smallkv_softmax(const float* q, const int32_t* q_pos, size_t rows, const uint16_t* k,
                     const int32_t* k_pos, size_t n, size_t dim, float scale, float* out,
                     cudaStream_t stream);

// Eq. 6's marginal term on out [rows][dim] (each row's attention over the full rows): scales row
// r by max(0, 1 - M_r) and adds w[r][t] * v_t for every marginal row t with v_pos[t] <= q_pos[r],
// M_r the sum of those w[r][t]. v [n_marginal][dim] f16; w row r starts at weights + r *
// weights_stride. n_marginal 0 still rescales (by 1, which changes no bit).
void smallkv_add_marginal(const int32_t* q_pos, size_t rows, size_t dim, const uint16_t* v,
                          const int32_t* v_pos, size_t n_marginal, const float* weights,
                          size_t weights_stride, float* out, cudaStream_t stream);

}  // namespace kvsdk::cuda
