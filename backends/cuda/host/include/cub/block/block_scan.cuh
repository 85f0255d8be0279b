// Host execution shim: cub::BlockScan's ExclusiveSum (with the block aggregate, valid in every
// thread, as in CUB). TempStorage may be reused only after a __syncthreads (see below).
#pragma once

#include <cuda_runtime.h>

namespace cub {

template <class T, int BLOCK_DIM_X>
class BlockScan {
 public:
  struct TempStorage {
    T items[BLOCK_DIM_X];
  };
  explicit BlockScan(TempStorage& storage) : s_(storage) {}
  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    const unsigned t = threadIdx.x;
    s_.items[t] = input;
    __syncthreads();
    T prefix{};
    for (unsigned i = 0; i < t; ++i) prefix = prefix + s_.items[i];
    T total = prefix;
    for (int i = int(t); i < BLOCK_DIM_X; ++i) total = total + s_.items[i];
    output = prefix;
    block_aggregate = total;
    // No barrier after the reads, as in CUB: a kernel that reuses the storage without its own
    // __syncthreads lets an early thread overwrite items a later one still reads, and gets
    // wrong sums here.
  }
  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
