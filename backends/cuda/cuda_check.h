// Error mapping for CUDA runtime and cuBLAS calls: every failure becomes kvsdk::Error with
// KVSDK_E_BACKEND and the driver's own words, so callers behind the C ABI get a status.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "util/error.h"

namespace kvsdk::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(KVSDK_E_BACKEND, what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
         ")");
  }
}

inline void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    fail(KVSDK_E_BACKEND, what, " failed: cuBLAS status ", int(st), " (",
         cublasGetStatusString(st), ")");
  }
}

// Checks the last launch without synchronising (launch-configuration errors only; faults inside
// the kernel surface at the next synchronising call, which is also checked).
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

inline unsigned blocks_for(size_t n, unsigned threads) {
  return unsigned((n + threads - 1) / threads);
}

}  // namespace kvsdk::cuda
