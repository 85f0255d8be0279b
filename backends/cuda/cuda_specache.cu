#include "cuda_specache.h"

#include "cuda_check.h"
#include "cuda_gather.h"

namespace kvsdk::cuda {

SpeCacheHostStore::SpeCacheHostStore(size_t heads, size_t capacity, size_t dim)
    : heads_(heads), capacity_(capacity), dim_(dim) {
  KVSDK_REQUIRE(heads > 0 && capacity > 0 && dim > 0,
                "SpeCache host store: heads, capacity and dim must be > 0");
  const size_t bytes = 2 * heads * capacity * dim;
  const cudaError_t ek = cudaHostAlloc(reinterpret_cast<void**>(&k_), bytes, cudaHostAllocMapped);
  const cudaError_t ev =
      ek == cudaSuccess ? cudaHostAlloc(reinterpret_cast<void**>(&v_), bytes, cudaHostAllocMapped)
                        : ek;
  if (ev != cudaSuccess) {
    if (k_) cudaFreeHost(k_);
    k_ = nullptr;
    fail(KVSDK_E_BACKEND, "cudaHostAlloc of the ", 2 * bytes,
         "-byte pinned SpeCache backing store failed: ", cudaGetErrorString(ev));
  }
  const cudaError_t mk = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dk_), k_, 0);
  const cudaError_t mv = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dv_), v_, 0);
  if (mk != cudaSuccess || mv != cudaSuccess) {
    cudaFreeHost(k_);
    cudaFreeHost(v_);
    k_ = v_ = nullptr;
    fail(KVSDK_E_BACKEND, "the pinned SpeCache store cannot be mapped into the device: ",
         cudaGetErrorString(mk != cudaSuccess ? mk : mv));
  }
}

SpeCacheHostStore::~SpeCacheHostStore() {
  if (k_) cudaFreeHost(k_);
  if (v_) cudaFreeHost(v_);
}

SpeCacheFetcher::SpeCacheFetcher() {
  check_cuda(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
  // Timing is not needed: cheaper events.
  const cudaError_t e1 = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
  const cudaError_t e2 =
      e1 == cudaSuccess ? cudaEventCreateWithFlags(&done_, cudaEventDisableTiming) : e1;
  if (e2 != cudaSuccess) {
    if (ready_) cudaEventDestroy(ready_);
    cudaStreamDestroy(copy_);
    check_cuda(e2, "cudaEventCreate");
  }
}

SpeCacheFetcher::~SpeCacheFetcher() {
  cudaEventDestroy(ready_);
  cudaEventDestroy(done_);
  cudaStreamDestroy(copy_);
}

void SpeCacheFetcher::fetch_async(const SpeCacheHostStore& store, const uint32_t* tokens, size_t k,
                                  uint16_t* out_k, uint16_t* out_v, cudaStream_t producer) {
  KVSDK_REQUIRE(k <= store.capacity(), "SpeCache fetch of ", k, " rows from a store of ",
                store.capacity());
  check_cuda(cudaEventRecord(ready_, producer), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(copy_, ready_, 0), "cudaStreamWaitEvent");
  const size_t row_bytes = 2 * store.dim();
  gather_rows(store.device_keys(), store.capacity(), tokens, store.heads(), k, row_bytes, out_k, k,
              copy_);
  gather_rows(store.device_values(), store.capacity(), tokens, store.heads(), k, row_bytes, out_v,
              k, copy_);
  check_cuda(cudaEventRecord(done_, copy_), "cudaEventRecord");
}

void SpeCacheFetcher::join(cudaStream_t consumer) {
  check_cuda(cudaStreamWaitEvent(consumer, done_, 0), "cudaStreamWaitEvent");
}

}  // namespace kvsdk::cuda
