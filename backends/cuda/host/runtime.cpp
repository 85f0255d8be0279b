// Host execution shim: the CUDA runtime and cuBLAS subset of include/ on the CPU. One device
// (ordinal 0) with kDeviceBytes of memory; allocations are tracked so cudaMemGetInfo is exact and
// a budget test sees every byte; streams and events are tokens (every operation completes when
// enqueued, which is one valid schedule of CUDA's stream semantics).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

struct CUstream_st {
  unsigned flags;
};
struct CUevent_st {
  unsigned flags;
};
struct cublasContext {
  cudaStream_t stream;
};

namespace kvsdk::cuda_host {
namespace {

constexpr size_t kDeviceBytes = size_t(8) << 30;  // a Jetson Orin-sized device
constexpr size_t kAlignment = 256;                // cudaMalloc's guarantee

struct Block {
  size_t bytes;    // as requested: the end of what a kernel or copy may touch
  size_t rounded;  // the device's granules, for the accounting
};
struct Allocations {
  std::mutex mu;
  std::map<const char*, Block> device;  // cudaMalloc
  std::map<const char*, size_t> pinned;  // cudaHostAlloc
  size_t in_use = 0;
};
Allocations& allocations() {
  static Allocations a;
  return a;
}

std::atomic<unsigned long long> g_to_device_pinned{0}, g_to_device_pageable{0},
    g_to_host_pinned{0}, g_to_host_pageable{0};
// Calls that make the host wait for the device (synchronous copies and synchronisations).
std::atomic<unsigned long long> g_host_waits{0};

// Whether [p, p + n) lies inside one block of `blocks` (a.mu held).
template <class Map, class SizeOf>
bool inside(const Map& blocks, const void* p, size_t n, SizeOf size_of) {
  const char* c = static_cast<const char*>(p);
  auto it = blocks.upper_bound(c);
  if (it == blocks.begin()) return false;
  --it;
  return c + n <= it->first + size_of(it->second);
}
bool in_device(const Allocations& a, const void* p, size_t n) {
  return inside(a.device, p, n, [](const Block& b) { return b.bytes; });
}
bool in_pinned(const Allocations& a, const void* p, size_t n) {
  return inside(a.pinned, p, n, [](size_t b) { return b; });
}
// Any overlap with a device block: a host side that does this is a device pointer.
bool touches_device(const Allocations& a, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  auto it = a.device.lower_bound(c + n);  // first block starting at or after the end
  if (it == a.device.begin()) return false;
  --it;
  return it->first + it->second.bytes > c;
}

thread_local cudaError_t g_last_error = cudaSuccess;
thread_local int g_device = 0;

}  // namespace

void set_launch_error(cudaError_t err, const char*) { g_last_error = err; }

TransferBytes transfer_bytes() {
  return {g_to_device_pinned.load(), g_to_device_pageable.load(), g_to_host_pinned.load(),
          g_to_host_pageable.load()};
}

unsigned long long host_waits() { return g_host_waits.load(); }

size_t device_bytes_in_use() {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.in_use;
}

}  // namespace kvsdk::cuda_host

using kvsdk::cuda_host::allocations;

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (!device) return cudaErrorInvalidValue;
  *device = kvsdk::cuda_host::g_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  kvsdk::cuda_host::g_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value || device != 0) return cudaErrorInvalidValue;
  if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = 16;  // Jetson AGX Orin
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  ++kvsdk::cuda_host::g_host_waits;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = kvsdk::cuda_host::g_last_error;
  kvsdk::cuda_host::g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return kvsdk::cuda_host::g_last_error; }

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure (host shim: barrier divergence)";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  auto& a = allocations();
  std::lock_guard<std::mutex> lock(a.mu);
  const size_t rounded = (bytes + kvsdk::cuda_host::kAlignment - 1) / kvsdk::cuda_host::kAlignment *
                         kvsdk::cuda_host::kAlignment;
  if (rounded > kvsdk::cuda_host::kDeviceBytes - a.in_use) return cudaErrorMemoryAllocation;
  // The exact size (not the rounded one), so ASan reports a kernel's access one byte past it;
  // the accounting counts the device's granules.
  void* p = nullptr;
  if (posix_memalign(&p, kvsdk::cuda_host::kAlignment, bytes) != 0) return cudaErrorMemoryAllocation;
  a.device.emplace(static_cast<const char*>(p), kvsdk::cuda_host::Block{bytes, rounded});
  a.in_use += rounded;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto& a = allocations();
  std::lock_guard<std::mutex> lock(a.mu);
  const auto it = a.device.find(static_cast<const char*>(ptr));
  if (it == a.device.end()) return cudaErrorInvalidValue;
  a.in_use -= it->second.rounded;
  a.device.erase(it);
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return cudaErrorInvalidValue;
  *total_bytes = kvsdk::cuda_host::kDeviceBytes;
  *free_bytes = kvsdk::cuda_host::kDeviceBytes - kvsdk::cuda_host::device_bytes_in_use();
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = bytes ? std::malloc(bytes) : nullptr;
  if (bytes && !*ptr) return cudaErrorMemoryAllocation;
  if (*ptr) {
    auto& a = allocations();
    std::lock_guard<std::mutex> lock(a.mu);
    a.pinned.emplace(static_cast<const char*>(*ptr), bytes);
  }
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }
cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto& a = allocations();
  std::lock_guard<std::mutex> lock(a.mu);
  const auto it = a.pinned.find(static_cast<const char*>(ptr));
  if (it == a.pinned.end()) return cudaErrorInvalidValue;
  a.pinned.erase(it);
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned flags) {
  if (!device || !host || flags != 0) return cudaErrorInvalidValue;
  *device = host;  // mapped pinned memory: the same bytes, reached by the "device"
  return cudaSuccess;
}
namespace {
// Both copies complete when called (one legal schedule of a stream); only cudaMemcpy makes the
// host wait on a GPU.
cudaError_t copy_now(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  {
    using namespace kvsdk::cuda_host;
    auto& a = allocations();
    std::lock_guard<std::mutex> lock(a.mu);
    switch (kind) {
      case cudaMemcpyHostToDevice:
        if (!in_device(a, dst, bytes) || touches_device(a, src, bytes)) return cudaErrorInvalidValue;
        (in_pinned(a, src, bytes) ? g_to_device_pinned : g_to_device_pageable) += bytes;
        break;
      case cudaMemcpyDeviceToHost:
        if (!in_device(a, src, bytes) || touches_device(a, dst, bytes)) return cudaErrorInvalidValue;
        (in_pinned(a, dst, bytes) ? g_to_host_pinned : g_to_host_pageable) += bytes;
        break;
      case cudaMemcpyDeviceToDevice:
        if (!in_device(a, src, bytes) || !in_device(a, dst, bytes)) return cudaErrorInvalidValue;
        break;
      default:
        break;
    }
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes > 0) ++kvsdk::cuda_host::g_host_waits;
  return copy_now(dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return copy_now(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!dst) return cudaErrorInvalidValue;
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(dst, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (!stream) return cudaErrorInvalidValue;
  *stream = new CUstream_st{flags};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++kvsdk::cuda_host::g_host_waits;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
  return event ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (!event) return cudaErrorInvalidValue;
  *event = new CUevent_st{flags};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  return event ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ++kvsdk::cuda_host::g_host_waits;
  return event ? cudaSuccess : cudaErrorInvalidValue;
}

// ---- cuBLAS ----------------------------------------------------------------------------------------
cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext{nullptr};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B,
                                          cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batch_count,
                                          cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (Atype != CUDA_R_16F || Btype != CUDA_R_16F || Ctype != CUDA_R_32F ||
      compute != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // cuBLAS's argument checks: op(A) is m x k, op(B) is k x n, leading dimensions cover the rows.
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || batch_count < 0 || lda < std::max(1, a_rows) ||
      ldb < std::max(1, b_rows) || ldc < std::max(1, m) || !alpha || !beta) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const auto* a = static_cast<const __half*>(A);
  const auto* b = static_cast<const __half*>(B);
  auto* c = static_cast<float*>(C);
  for (int i = 0; i < batch_count; ++i) {
    const __half* ai = a + i * strideA;
    const __half* bi = b + i * strideB;
    float* ci = c + i * strideC;
    for (int col = 0; col < n; ++col) {
      for (int row = 0; row < m; ++row) {
        float acc = 0.0f;
        for (int p = 0; p < k; ++p) {
          const __half x = transa == CUBLAS_OP_N ? ai[row + size_t(p) * lda] : ai[p + size_t(row) * lda];
          const __half y = transb == CUBLAS_OP_N ? bi[p + size_t(col) * ldb] : bi[col + size_t(p) * ldb];
          acc += __half2float(x) * __half2float(y);
        }
        float& out = ci[row + size_t(col) * ldc];
        out = be == 0.0f ? al * acc : al * acc + be * out;  // beta 0: C is not read (cuBLAS)
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
