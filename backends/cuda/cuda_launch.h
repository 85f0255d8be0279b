// KVSDK_LAUNCH(kernel, grid, block, shared_bytes, stream, args...): the one way kvsdk launches a
// kernel. Under nvcc it is kernel<<<grid, block, shared_bytes, stream>>>(args...); compiled as
// host C++ against the execution shim (backends/cuda/host) it runs the same kernel body on the
// CPU, so every kernel test runs without a GPU. `kernel` must be one macro argument: name a
// template instance with several arguments through a pointer first.
#pragma once

#include <cuda_runtime.h>

#ifdef __CUDACC__
#define KVSDK_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#else
#define KVSDK_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::kvsdk::cuda_host::launch(grid, block, shared_bytes, stream, kernel, __VA_ARGS__)
#endif
