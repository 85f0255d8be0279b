// Host execution shim: cub::BlockReduce's Sum, with CUB's contract made strict: the sum is valid
// in thread 0 only (other threads get a poison value, so a kernel that reads it elsewhere fails
// its test here, where on a GPU it would read an unspecified partial), and TempStorage may be
// reused only after a __syncthreads.
#pragma once

#include <cuda_runtime.h>

#include <cstring>

namespace cub {

template <class T, int BLOCK_DIM_X>
class BlockReduce {
 public:
  struct TempStorage {
    T items[BLOCK_DIM_X];
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}
  T Sum(T input) {
    const unsigned t = threadIdx.x;
    s_.items[t] = input;
    __syncthreads();
    if (t != 0) return Poison();
    T sum = s_.items[0];
    for (int i = 1; i < BLOCK_DIM_X; ++i) sum = sum + s_.items[i];
    return sum;
  }

 private:
  static T Poison() {
    T p;
    std::memset(&p, 0xA5, sizeof(T));
    return p;
  }
  TempStorage& s_;
};

}  // namespace cub
