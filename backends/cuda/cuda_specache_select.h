// SpeCache's selection on the device (SpeCache (docs/papers.md) §3.3): from the speculative
// query's low-bit scores [group][n] (specache_scores_tier), each row's softmax, averaged over the
// group, and the k most probable tokens; and the fetch hit rate's share of a query's softmax on
// the fetched tokens. Both the CPU reference's bits (cpu::specache_select_from_scores and
// cpu::specache_fetched_shares): the maxima as std::max_element finds them, the portable exp
// (backends/cpu/portable_exp.h), each row's sums in token order in double, the averages added
// row after row, and the top k with ties to the lower index (cuda_topk.h: smallkv_topk's). The
// file compiles with --fmad=false. So a device cache fetches the tokens the reference does, and
// only the k token indices (and one float per query row) come back to the host.
//
// The sums are one thread per row (token order is the reference's): a row of 32k tokens is 32k
// sequential additions, unmeasured on a GPU.
//
// Device pointers; enqueued on `stream`, nothing synchronises. Throws kvsdk::Error
// (KVSDK_E_BACKEND) when a launch fails.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// Bytes of working memory specache_select_tokens needs for `group` rows (16-byte multiple).
size_t specache_select_work_bytes(size_t group);

// scores [group][n] (overwritten with exp(s - row max)) -> avg [n] the group-averaged
// probabilities and tokens [min(k, n)] the top k, ascending. `work` holds
// specache_select_work_bytes(group) bytes.
void specache_select_tokens(float* scores, size_t group, size_t n, size_t k, void* work,
                            float* avg, uint32_t* tokens, cudaStream_t stream);

// shares [rows] = each row's softmax over scores [rows][n] summed over tokens [n_tokens] (< n),
// 0 for a row that sees no token. Scores unchanged.
void specache_fetched_shares(const float* scores, size_t rows, size_t n, const uint32_t* tokens,
                             size_t n_tokens, float* shares, cudaStream_t stream);

}  // namespace kvsdk::cuda
