// Host execution shim (issue 17): the subset of the CUDA runtime that kvsdk's kernels and their
// tests use, implemented on the CPU so that the same .cu sources compile a second time as host
// C++ (backends/cuda/host/CMakeLists.txt) and every kernel test runs on a machine without a GPU,
// under ASan/UBSan too. Never on the include path of an nvcc build.
//
// Device memory is host memory from the shim's allocator (cudaMalloc counts it, so cudaMemGetInfo
// reports what is in use); streams and events are ordered trivially because every operation runs
// to completion when it is enqueued; kernels run through kvsdk::cuda_host::run_grid
// (block_runner.h). A launch with an invalid configuration sets the error that
// cudaGetLastError returns, as on a GPU.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../block_runner.h"
#include "util/half.h"

// ---- types and constants -------------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;

constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0;
constexpr unsigned cudaEventDisableTiming = 0x2;
constexpr unsigned cudaHostAllocDefault = 0x0;
constexpr unsigned cudaHostAllocPortable = 0x1;
constexpr unsigned cudaHostAllocMapped = 0x2;

using uint3 = ::kvsdk::cuda_host::Dim3;
// Vector types with CUDA's sizes and alignments (a 16-byte word copies as one load/store there).
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

// ---- runtime API (backends/cuda/host/runtime.cpp) ----------------------------------------------
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
// The shim knows no registers: the blocks an SM of the shim's device (16 SMs, a Jetson AGX Orin)
// holds are those its 2048 threads allow, at most 32.
template <class Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel kernel,
                                                          int block_size, size_t shared_bytes) {
  (void)shared_bytes;
  if (!blocks || !kernel || block_size <= 0 || block_size > 1024) return cudaErrorInvalidValue;
  *blocks = 2048 / block_size < 32 ? 2048 / block_size : 32;
  return cudaSuccess;
}
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned flags);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

template <class T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <class T>
cudaError_t cudaHostAlloc(T** ptr, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(ptr), bytes, flags);
}
template <class T>
cudaError_t cudaHostGetDevicePointer(T** device, void* host, unsigned flags) {
  return cudaHostGetDevicePointer(reinterpret_cast<void**>(device), host, flags);
}

namespace kvsdk::cuda_host {
// Records a launch failure for cudaGetLastError (runtime.cpp).
void set_launch_error(cudaError_t err, const char* why);
// Bytes currently allocated by cudaMalloc (what cudaMemGetInfo subtracts).
size_t device_bytes_in_use();
// Bytes moved between host and device since the process started, by direction and by whether
// the host side was pinned (cudaHostAlloc) or pageable: tests check that a device cache's
// transfers go through its pinned staging. cudaMemcpy(Async) also checks the device's memory
// rules for the kinds that name a side: a device side must lie inside one cudaMalloc block and
// a host side must not (cudaErrorInvalidValue otherwise, as a GPU would fault).
struct TransferBytes {
  unsigned long long to_device_pinned, to_device_pageable, to_host_pinned, to_host_pageable;
};
TransferBytes transfer_bytes();
// Calls so far that make the host wait for the device: cudaMemcpy and the stream, event and
// device synchronisations (a GPU round trip each, tens of microseconds).
unsigned long long host_waits();
}  // namespace kvsdk::cuda_host

// ---- kernel-side built-ins -------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
// Shared memory: one instance per kernel (template instance) and host thread; blocks run one
// after another, so each block sees its own (uninitialised on a GPU, so no kernel may read before
// writing: ASan cannot see that, the comparison with the CPU reference can).
#define __shared__ static thread_local

#define threadIdx (::kvsdk::cuda_host::thread_idx())
#define blockIdx (::kvsdk::cuda_host::block_idx())
#define blockDim (::kvsdk::cuda_host::block_dim())
#define gridDim (::kvsdk::cuda_host::grid_dim())
constexpr int warpSize = 32;

inline void __syncthreads() { ::kvsdk::cuda_host::block_barrier(0); }
inline int __syncthreads_or(int predicate) { return ::kvsdk::cuda_host::block_barrier(predicate); }

template <class T>
T __shfl_xor_sync(unsigned /*mask: the whole warp takes part*/, T value, int lane_mask,
                  int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a 1-8 byte value");
  const unsigned lane = ::kvsdk::cuda_host::lane_id();
  const unsigned base = lane / unsigned(width) * unsigned(width);
  const unsigned src = base + ((lane - base) ^ unsigned(lane_mask));
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  // A source outside the lane's width segment returns the lane's own value (CUDA semantics).
  bits = ::kvsdk::cuda_host::warp_exchange(bits, src < base + unsigned(width) ? src : lane);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// Arithmetic intrinsics: IEEE single-precision operations rounded to nearest (the build passes
// -ffp-contract=off, so nothing is fused, as the _rn intrinsics promise).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline uint32_t __float_as_uint(float f) { return kvsdk::float_bits(f); }
inline float __uint_as_float(uint32_t u) { return kvsdk::bits_float(u); }
inline int __float_as_int(float f) { return int(__float_as_uint(f)); }
// CUDA's integer min/max overloads (device code calls them unqualified).
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---- launches ----------------------------------------------------------------------------------------
namespace kvsdk::cuda_host {

// kernel<<<grid, block, shared, stream>>>(args...) on the host: the arguments are converted to the
// kernel's parameter types and copied once, as the CUDA runtime does, and every thread of the
// grid calls the kernel with that copy.
template <class... P, class... A>
void launch(dim3 grid, dim3 block, size_t /*dynamic shared*/, cudaStream_t /*stream*/,
            void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  struct Call {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
  } call{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
  const char* error = nullptr;
  const auto body = [](void* p) {
    Call& c = *static_cast<Call*>(p);
    std::apply(c.kernel, c.args);
  };
  if (!run_grid({grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, body, &call, &error)) {
    set_launch_error(std::strcmp(error, "invalid launch configuration") == 0
                         ? cudaErrorInvalidConfiguration
                         : cudaErrorLaunchFailure,
                     error);
  }
}

}  // namespace kvsdk::cuda_host
