#include "cuda_check.h"
#include "cuda_gather.h"
#include "cuda_launch.h"

namespace kvsdk::cuda {

namespace {

constexpr unsigned kThreads = 256;

// One thread per word of the destination.
template <class Word>
__global__ void gather_kernel(const Word* src, size_t src_rows, const uint32_t* indices,
                              size_t heads, size_t k, size_t row_words, Word* dst,
                              size_t dst_rows) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= heads * k * row_words) return;
  const size_t w = i % row_words, r = (i / row_words) % k, h = i / (row_words * k);
  const size_t from = indices[h * k + r];
  dst[(h * dst_rows + r) * row_words + w] = src[(h * src_rows + from) * row_words + w];
}

template <class Word>
void launch(const void* src, size_t src_rows, const uint32_t* indices, size_t heads, size_t k,
            size_t row_bytes, void* dst, size_t dst_rows, cudaStream_t stream) {
  const size_t words = row_bytes / sizeof(Word);
  KVSDK_LAUNCH(gather_kernel<Word>, blocks_for(heads * k * words, kThreads), kThreads, 0, stream,
               static_cast<const Word*>(src), src_rows, indices, heads, k, words,
               static_cast<Word*>(dst), dst_rows);
  check_launch("gather_kernel");
}

}  // namespace

void gather_rows(const void* src, size_t src_rows, const uint32_t* indices, size_t heads, size_t k,
                 size_t row_bytes, void* dst, size_t dst_rows, cudaStream_t stream) {
  KVSDK_REQUIRE(row_bytes > 0, "gather_rows: row_bytes must be > 0");
  KVSDK_REQUIRE(dst_rows >= k, "gather_rows: ", k, " rows do not fit ", dst_rows,
                " destination rows");
  if (heads == 0 || k == 0) return;
  const auto aligned = [&](size_t a) {
    return row_bytes % a == 0 && reinterpret_cast<uintptr_t>(src) % a == 0 &&
           reinterpret_cast<uintptr_t>(dst) % a == 0;
  };
  if (aligned(16)) {
    launch<uint4>(src, src_rows, indices, heads, k, row_bytes, dst, dst_rows, stream);
  } else if (aligned(4)) {
    launch<uint32_t>(src, src_rows, indices, heads, k, row_bytes, dst, dst_rows, stream);
  } else {
    launch<uint8_t>(src, src_rows, indices, heads, k, row_bytes, dst, dst_rows, stream);
  }
}

}  // namespace kvsdk::cuda
