// The device scoring kernel (cuda_column_sums.h): five launches per block of query rows, each
// step the CPU reference's (backends/cpu/attention_scores.cpp) in the same order of operations.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "cuda_check.h"
#include "cuda_column_sums.h"
#include "cuda_launch.h"
#include "kivi_device.cuh"
#include "portable_exp.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

// Where key t is: its source and row, and for a quantized key its block.
struct KeyRef {
  int src;  // 0: quant, 1: held, 2: tail
  size_t row, block;
};

__device__ __forceinline__ KeyRef key_ref(const QuantKeys& qk, size_t n_quant, size_t held,
                                          size_t t) {
  if (t < n_quant) {
    size_t block = t / qk.group;
    if (qk.block_starts) {  // ragged blocks: the last block starting at or before t
      size_t lo = 0, hi = qk.blocks;
      while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        if (qk.block_starts[mid] <= t) lo = mid; else hi = mid;
      }
      block = lo;
    }
    return {0, t, block};
  }
  t -= n_quant;
  return t < held ? KeyRef{1, t, 0} : KeyRef{2, t - held, 0};
}

__device__ __forceinline__ float key_at(const QuantKeys& qk, const uint16_t* held_k,
                                        const float* tail_k, size_t dim, const KeyRef& k,
                                        size_t c) {
  if (k.src == 0) {
    const size_t row_bytes = (dim * qk.bits + 7) / 8;  // kivi_packed_bytes
    const uint32_t code = detail::kivi_unpack_code(qk.codes + k.row * row_bytes, uint32_t(c),
                                                   qk.bits);
    return detail::kivi_dequant(code, detail::f16_bits_to_f32(qk.scale[k.block * dim + c]),
                                detail::f16_bits_to_f32(qk.zero[k.block * dim + c]));
  }
  return k.src == 1 ? detail::f16_bits_to_f32(held_k[k.row * dim + c]) : tail_k[k.row * dim + c];
}

// One thread per (row of the block, key): dot_f32's partial sums, times scale; -inf where the
// key is in the row's future (q_pos null: every key is seen).
__global__ void logits_kernel(const float* q, const int32_t* q_pos, size_t r0, size_t nr,
                              QuantKeys qk, size_t n_quant, const uint16_t* held_k,
                              const int32_t* held_pos, const float* tail_k,
                              const int32_t* tail_pos, size_t held, size_t n_keys, size_t dim,
                              float scale, float* logits) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nr * n_keys) return;
  const size_t r = i / n_keys, t = i % n_keys;
  const KeyRef k = key_ref(qk, n_quant, held, t);
  const int32_t key_pos =
      k.src == 0 ? qk.positions[k.row] : k.src == 1 ? held_pos[k.row] : tail_pos[k.row];
  if (q_pos && key_pos > q_pos[r0 + r]) {
    logits[i] = -INFINITY;
    return;
  }
  const float* qr = q + (r0 + r) * dim;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  size_t c = 0;
  for (; c + 4 <= dim; c += 4) {
    s0 = s0 + qr[c] * key_at(qk, held_k, tail_k, dim, k, c);
    s1 = s1 + qr[c + 1] * key_at(qk, held_k, tail_k, dim, k, c + 1);
    s2 = s2 + qr[c + 2] * key_at(qk, held_k, tail_k, dim, k, c + 2);
    s3 = s3 + qr[c + 3] * key_at(qk, held_k, tail_k, dim, k, c + 3);
  }
  for (; c < dim; ++c) s0 = s0 + qr[c] * key_at(qk, held_k, tail_k, dim, k, c);
  logits[i] = ((s0 + s1) + (s2 + s3)) * scale;
}

// One thread per row: the row's maximum (as std::max: a NaN logit is skipped).
__global__ void row_max_kernel(const float* logits, size_t nr, size_t n_keys, float* row_max) {
  const size_t r = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= nr) return;
  const float* l = logits + r * n_keys;
  float m = -INFINITY;
  for (size_t t = 0; t < n_keys; ++t) m = m < l[t] ? l[t] : m;
  row_max[r] = m;
}

// One thread per (row, key): p = exp_f32(logit - max) in place (0 for a masked key). A row that
// sees no key is left as it is (the columns skip it).
__global__ void exp_kernel(float* logits, const float* row_max, size_t nr, size_t n_keys) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nr * n_keys) return;
  const float m = row_max[i / n_keys];
  if (m == -INFINITY) return;
  const float l = logits[i];
  logits[i] = l == -INFINITY ? 0.0f : cpu::pmath::detail::exp_f32_body(l - m);
}

// One thread per row: the sum of its probabilities in key order (the reference's chain), and
// 1 / sum.
__global__ void row_inverse_kernel(const float* probs, const float* row_max, size_t nr,
                                   size_t n_keys, float* row_inv) {
  const size_t r = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= nr) return;
  if (row_max[r] == -INFINITY) return;
  const float* p = probs + r * n_keys;
  float sum = 0.0f;
  for (size_t t = 0; t < n_keys; ++t) sum = sum + p[t];
  row_inv[r] = 1.0f / sum;
}

// One thread per key: col += p * inv, row after row of the block in order (the first block
// starts the column at zero).
__global__ void columns_kernel(const float* probs, const float* row_max, const float* row_inv,
                               size_t nr, size_t n_keys, bool first_block, float* col_sums) {
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_keys) return;
  float col = first_block ? 0.0f : col_sums[t];
  for (size_t r = 0; r < nr; ++r) {
    if (row_max[r] == -INFINITY) continue;  // this row sees no key
    col = col + probs[r * n_keys + t] * row_inv[r];
  }
  col_sums[t] = col;
}

size_t block_rows(const ColumnSumsShape& s, size_t max_logits) {
  const size_t n_keys = s.quant + s.held + s.tail;
  return std::max<size_t>(1, std::min(s.rows, max_logits / std::max<size_t>(1, n_keys)));
}

}  // namespace

// Logits of one key_scores launch at most (rows per launch: this over the keys, at least one),
// which keeps its grid far inside the limit for any row count.
constexpr size_t kMaxLaunchLogits = size_t(1) << 26;

size_t column_sums_workspace(const ColumnSumsShape& shape, size_t max_logits) {
  const size_t nr = block_rows(shape, max_logits);
  return nr * (shape.quant + shape.held + shape.tail) + 2 * nr;
}

void column_sums(const float* q, const int32_t* q_pos, const QuantKeys& quant,
                 const uint16_t* held_k,
                 const int32_t* held_pos, const float* tail_k, const int32_t* tail_pos,
                 const ColumnSumsShape& shape, size_t max_logits, float* work, float* col_sums,
                 cudaStream_t stream) {
  const size_t n_keys = shape.quant + shape.held + shape.tail;
  if (n_keys == 0) return;
  const size_t rows_per_block = block_rows(shape, max_logits);
  float* logits = work;
  float* row_max = work + rows_per_block * n_keys;
  float* row_inv = row_max + rows_per_block;
  if (shape.rows == 0) {
    KVSDK_LAUNCH(columns_kernel, blocks_for(n_keys, kThreads), kThreads, 0, stream, logits,
                 row_max, row_inv, size_t(0), n_keys, true, col_sums);
    check_launch("columns_kernel");
    return;
  }
  for (size_t r0 = 0; r0 < shape.rows; r0 += rows_per_block) {
    const size_t nr = std::min(rows_per_block, shape.rows - r0);
    KVSDK_LAUNCH(logits_kernel, blocks_for(nr * n_keys, kThreads), kThreads, 0, stream, q, q_pos,
                 r0, nr, quant, shape.quant, held_k, held_pos, tail_k, tail_pos, shape.held, n_keys,
                 shape.dim, shape.scale, logits);
    check_launch("logits_kernel");
    KVSDK_LAUNCH(row_max_kernel, blocks_for(nr, kThreads), kThreads, 0, stream, logits, nr,
                 n_keys, row_max);
    check_launch("row_max_kernel");
    KVSDK_LAUNCH(exp_kernel, blocks_for(nr * n_keys, kThreads), kThreads, 0, stream, logits,
                 row_max, nr, n_keys);
    check_launch("exp_kernel");
    KVSDK_LAUNCH(row_inverse_kernel, blocks_for(nr, kThreads), kThreads, 0, stream, logits,
                 row_max, nr, n_keys, row_inv);
    check_launch("row_inverse_kernel");
    KVSDK_LAUNCH(columns_kernel, blocks_for(n_keys, kThreads), kThreads, 0, stream, logits,
                 row_max, row_inv, nr, n_keys, r0 == 0, col_sums);
    check_launch("columns_kernel");
  }
}

void key_scores(const float* q, const int32_t* q_pos, const QuantKeys& quant,
                const uint16_t* held_k, const int32_t* held_pos, const float* tail_k,
                const int32_t* tail_pos, const ColumnSumsShape& shape, float* scores,
                cudaStream_t stream) {
  const size_t n_keys = shape.quant + shape.held + shape.tail;
  if (n_keys == 0 || shape.rows == 0) return;
  const size_t rows_per_launch = std::max<size_t>(1, kMaxLaunchLogits / n_keys);
  for (size_t r0 = 0; r0 < shape.rows; r0 += rows_per_launch) {
    const size_t nr = std::min(rows_per_launch, shape.rows - r0);
    KVSDK_LAUNCH(logits_kernel, blocks_for(nr * n_keys, kThreads), kThreads, 0, stream, q, q_pos,
                 r0, nr, quant, shape.quant, held_k, held_pos, tail_k, tail_pos, shape.held,
                 n_keys, shape.dim, shape.scale, scores + r0 * n_keys);
    check_launch("logits_kernel");
  }
}

}  // namespace kvsdk::cuda
