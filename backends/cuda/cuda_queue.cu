// The CUDA context queue (cuda_queue.h).
#include "cuda_queue.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "cuda_check.h"
#include "util/error.h"

namespace kvsdk::backend {

struct DeviceQueue {
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  cudaEvent_t kernels_done = nullptr;     // recorded on compute before a transfer
  cudaEvent_t half_free[2] = {nullptr, nullptr};  // the copy that last used a half finished
  unsigned char* pinned = nullptr;        // 2 x kStagingHalfBytes
};

}  // namespace kvsdk::backend

namespace kvsdk::cuda {
namespace {

using backend::DeviceQueue;

thread_local DeviceQueue* t_bound = nullptr;

void release(DeviceQueue* q) noexcept {
  if (q->copy) cudaStreamSynchronize(q->copy);
  if (q->compute) cudaStreamSynchronize(q->compute);
  for (cudaEvent_t e : q->half_free) {
    if (e) cudaEventDestroy(e);
  }
  if (q->kernels_done) cudaEventDestroy(q->kernels_done);
  if (q->copy) cudaStreamDestroy(q->copy);
  if (q->compute) cudaStreamDestroy(q->compute);
  if (q->pinned) cudaFreeHost(q->pinned);
  delete q;
}

// The copy stream waits for every kernel enqueued so far on the compute stream.
void after_kernels(DeviceQueue& q) {
  check_cuda(cudaEventRecord(q.kernels_done, q.compute), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(q.copy, q.kernels_done, 0), "cudaStreamWaitEvent");
}

unsigned char* half(DeviceQueue& q, int h) { return q.pinned + size_t(h) * kStagingHalfBytes; }

}  // namespace

DeviceQueue* queue_create() {
  DeviceQueue* q = new (std::nothrow) DeviceQueue();
  if (!q) fail(KVSDK_E_NO_MEMORY, "cannot allocate the CUDA queue");
  try {
    const cudaError_t pinned = cudaHostAlloc(reinterpret_cast<void**>(&q->pinned),
                                             2 * kStagingHalfBytes, cudaHostAllocDefault);
    if (pinned == cudaErrorMemoryAllocation) {
      q->pinned = nullptr;
      fail(KVSDK_E_NO_MEMORY, "cannot pin ", 2 * kStagingHalfBytes,
           " bytes of host memory for the CUDA staging buffers");
    }
    check_cuda(pinned, "cudaHostAlloc (staging buffers)");
    check_cuda(cudaStreamCreateWithFlags(&q->compute, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (compute stream)");
    check_cuda(cudaStreamCreateWithFlags(&q->copy, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (copy stream)");
    check_cuda(cudaEventCreateWithFlags(&q->kernels_done, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    for (cudaEvent_t& e : q->half_free) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  } catch (...) {
    release(q);
    throw;
  }
  return q;
}

void queue_destroy(DeviceQueue* queue) noexcept {
  if (!queue) return;
  if (t_bound == queue) t_bound = nullptr;
  release(queue);
}

DeviceQueue* bind_queue(DeviceQueue* queue) noexcept {
  DeviceQueue* previous = t_bound;
  t_bound = queue;
  return previous;
}

DeviceQueue* bound_queue() { return t_bound; }

cudaStream_t compute_stream() { return t_bound ? t_bound->compute : nullptr; }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  DeviceQueue* q = t_bound;
  if (!q) {
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    return;
  }
  after_kernels(*q);
  const auto* from = static_cast<const unsigned char*>(src);
  auto* to = static_cast<unsigned char*>(dst);
  int h = 0;
  for (size_t done = 0; done < bytes; h ^= 1) {
    const size_t n = std::min(kStagingHalfBytes, bytes - done);
    // The half's previous copy has read it (an event never recorded counts as complete).
    check_cuda(cudaEventSynchronize(q->half_free[h]), "cudaEventSynchronize (staging)");
    std::memcpy(half(*q, h), from + done, n);
    check_cuda(cudaMemcpyAsync(to + done, half(*q, h), n, cudaMemcpyHostToDevice, q->copy),
               "cudaMemcpyAsync to the device");
    check_cuda(cudaEventRecord(q->half_free[h], q->copy), "cudaEventRecord (staging)");
    done += n;
  }
  check_cuda(cudaStreamSynchronize(q->copy), "cudaStreamSynchronize (copy stream)");
}

void copy_many_to_device(const backend::HostCopy* copies, size_t n) {
  DeviceQueue* q = t_bound;
  if (!q) {
    for (size_t i = 0; i < n; ++i) copy_to_device(copies[i].dst, copies[i].src, copies[i].bytes);
    return;
  }
  after_kernels(*q);
  int h = 0;
  size_t used = 0;  // bytes of half h holding copies enqueued since it was last free
  check_cuda(cudaEventSynchronize(q->half_free[h]), "cudaEventSynchronize (staging)");
  for (size_t i = 0; i < n; ++i) {
    const auto* from = static_cast<const unsigned char*>(copies[i].src);
    auto* to = static_cast<unsigned char*>(copies[i].dst);
    for (size_t done = 0; done < copies[i].bytes;) {
      if (used == kStagingHalfBytes) {  // this half is full: the other one, once it is free
        check_cuda(cudaEventRecord(q->half_free[h], q->copy), "cudaEventRecord (staging)");
        h ^= 1;
        used = 0;
        check_cuda(cudaEventSynchronize(q->half_free[h]), "cudaEventSynchronize (staging)");
      }
      const size_t m = std::min(kStagingHalfBytes - used, copies[i].bytes - done);
      unsigned char* stage = half(*q, h) + used;
      std::memcpy(stage, from + done, m);
      check_cuda(cudaMemcpyAsync(to + done, stage, m, cudaMemcpyHostToDevice, q->copy),
                 "cudaMemcpyAsync to the device");
      used += m;
      done += m;
    }
  }
  check_cuda(cudaEventRecord(q->half_free[h], q->copy), "cudaEventRecord (staging)");
  check_cuda(cudaStreamSynchronize(q->copy), "cudaStreamSynchronize (copy stream)");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  DeviceQueue* q = t_bound;
  if (!q) {
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    return;
  }
  after_kernels(*q);
  const auto* from = static_cast<const unsigned char*>(src);
  auto* to = static_cast<unsigned char*>(dst);
  // Chunk i lands in half i % 2 while the host copies chunk i - 1 out of the other half.
  size_t pending_at = 0, pending_n = 0;
  int h = 0;
  const auto drain = [&](int which) {
    check_cuda(cudaEventSynchronize(q->half_free[which]), "cudaEventSynchronize (staging)");
    std::memcpy(to + pending_at, half(*q, which), pending_n);
  };
  for (size_t done = 0; done < bytes; h ^= 1) {
    const size_t n = std::min(kStagingHalfBytes, bytes - done);
    check_cuda(cudaMemcpyAsync(half(*q, h), from + done, n, cudaMemcpyDeviceToHost, q->copy),
               "cudaMemcpyAsync to the host");
    check_cuda(cudaEventRecord(q->half_free[h], q->copy), "cudaEventRecord (staging)");
    if (pending_n) drain(h ^ 1);
    pending_at = done;
    pending_n = n;
    done += n;
  }
  drain(h ^ 1);
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  DeviceQueue* q = t_bound;
  if (!q) {
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy on the device");
    return;
  }
  after_kernels(*q);
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, q->copy),
             "cudaMemcpyAsync on the device");
  check_cuda(cudaStreamSynchronize(q->copy), "cudaStreamSynchronize (copy stream)");
}

}  // namespace kvsdk::cuda
