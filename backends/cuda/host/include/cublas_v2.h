// Host execution shim: the cuBLAS subset kvsdk calls (handles, streams, strided batched GEMM with
// f16 inputs and f32 output/compute), implemented by plain loops in runtime.cpp with cuBLAS's
// column-major conventions, so a wrong leading dimension, stride or transpose shows up here.
#pragma once

#include "cuda_runtime.h"

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2 };
using cudaDataType = cudaDataType_t;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

struct cublasContext;
using cublasHandle_t = cublasContext*;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
const char* cublasGetStatusString(cublasStatus_t status);
// C[i] = alpha op(A[i]) op(B[i]) + beta C[i] for i < batch, column-major, A[i] = A + i * strideA.
// Supported: Atype = Btype = CUDA_R_16F, Ctype = CUDA_R_32F, CUBLAS_COMPUTE_32F (else
// CUBLAS_STATUS_NOT_SUPPORTED); f32 alpha and beta.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B,
                                          cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batch_count,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo);
