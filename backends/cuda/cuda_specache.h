// SpeCache on CUDA (Jie et al. 2025, SpeCache (docs/papers.md) §3.3): the full-precision (f16) KV
// rows live in pinned, device-mapped host memory outside the device budget; every decode step the
// speculative top-k token indices (computed on the device by topk_rows) select rows that are
// fetched into the budgeted device memory on a separate copy stream, overlapped with the compute
// stream's work, and joined by an event only where the next step's attention needs them.
//
// The fetch reads the selected rows straight from the mapped pinned buffer with a gather kernel
// (zero-copy over PCIe / NVLink-C2C; on Jetson's shared memory, at memory speed), so the indices
// never travel to the host and no per-row cudaMemcpy is issued.
//
// Threading: not thread-safe; one cache owns its store and fetcher.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// Pinned host backing store: k/v f16 [heads][capacity][dim]. Throws kvsdk::Error:
// KVSDK_E_INVALID_ARG for zero sizes, KVSDK_E_BACKEND when pinned allocation or mapping fails.
class SpeCacheHostStore {
 public:
  SpeCacheHostStore(size_t heads, size_t capacity, size_t dim);
  ~SpeCacheHostStore();
  SpeCacheHostStore(const SpeCacheHostStore&) = delete;
  SpeCacheHostStore& operator=(const SpeCacheHostStore&) = delete;

  // Host pointers to row `token` of `head` (written by the host, e.g. from the prefill output).
  uint16_t* key_row(size_t head, size_t token) { return k_ + (head * capacity_ + token) * dim_; }
  uint16_t* value_row(size_t head, size_t token) { return v_ + (head * capacity_ + token) * dim_; }
  // The same buffers as the device addresses them.
  const uint16_t* device_keys() const { return dk_; }
  const uint16_t* device_values() const { return dv_; }

  size_t heads() const { return heads_; }
  size_t capacity() const { return capacity_; }
  size_t dim() const { return dim_; }
  uint64_t bytes() const { return 2 * 2 * uint64_t(heads_) * capacity_ * dim_; }  // host RAM

 private:
  size_t heads_, capacity_, dim_;
  uint16_t* k_ = nullptr;
  uint16_t* v_ = nullptr;
  uint16_t* dk_ = nullptr;
  uint16_t* dv_ = nullptr;
};

class SpeCacheFetcher {
 public:
  // Creates the copy stream (non-blocking with respect to the legacy default stream) and events.
  SpeCacheFetcher();
  ~SpeCacheFetcher();
  SpeCacheFetcher(const SpeCacheFetcher&) = delete;
  SpeCacheFetcher& operator=(const SpeCacheFetcher&) = delete;

  // Enqueues, on the copy stream and after the work already enqueued on `producer` (which
  // computes `tokens`), the fetch of rows tokens[h][0..k) of every head of `store` into
  // out_k/out_v f16 [heads][k][dim] (device). Returns at once.
  void fetch_async(const SpeCacheHostStore& store, const uint32_t* tokens, size_t k,
                   uint16_t* out_k, uint16_t* out_v, cudaStream_t producer);
  // Makes `consumer` wait (on the device, not the host) for the last fetch.
  void join(cudaStream_t consumer);
  cudaStream_t copy_stream() const { return copy_; }

 private:
  cudaStream_t copy_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

}  // namespace kvsdk::cuda
