// A CUDA context's queue (backend_ops.h's DeviceQueue): a compute stream for its kernels, a copy
// stream for its transfers, and two pinned staging buffers that the transfers go through.
//
// Why pinned staging: a cudaMemcpy from pageable memory is staged by the driver through its own
// small pinned buffer and blocks the copy engine on the host's memcpy; here the host copies one
// half while the copy engine moves the other, so a snapshot load or save streams at the link's
// speed. Why two streams, non-blocking: the app's own CUDA work on the legacy default stream
// neither waits for kvsdk's nor makes kvsdk's wait.
//
// Every transfer is complete when it returns (Ops' contract): it first waits for the kernels
// already enqueued on the compute stream (an attention reading rows that a compaction is about
// to move, or producing the output about to be read back), and later kernels see its bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend_ops.h"

namespace kvsdk::cuda {

// Bytes of each of the two pinned staging halves (a multiple of 256: device rows stay aligned).
constexpr size_t kStagingHalfBytes = size_t(1) << 20;

backend::DeviceQueue* queue_create();
void queue_destroy(backend::DeviceQueue* queue) noexcept;
backend::DeviceQueue* bind_queue(backend::DeviceQueue* queue) noexcept;

// The calling thread's bound queue, or nullptr.
backend::DeviceQueue* bound_queue();
// The stream kernels run on: the bound queue's compute stream, else the default stream.
cudaStream_t compute_stream();

// Transfers through the bound queue when there is one, else synchronous cudaMemcpy. Throw
// kvsdk::Error KVSDK_E_BACKEND with the driver's words.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// The copies one after another through the staging halves (small ones share a half), one
// synchronisation at the end.
void copy_many_to_device(const backend::HostCopy* copies, size_t n);
void copy_on_device(void* dst, const void* src, size_t bytes);

}  // namespace kvsdk::cuda
