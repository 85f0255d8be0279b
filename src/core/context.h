// A context: one backend and one byte budget shared by every cache created on it. Thread-safe:
// caches on different threads reserve and release bytes concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "backend_ops.h"
#include "core/arena_regions.h"
#include "kvsdk.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvsdk {

class Context {
 public:
  // Throws kvsdk::Error KVSDK_E_UNSUPPORTED for a backend without a kernel table in this build.
  // n_threads: the pool's size including the caller's thread (0 = every core).
  // A device backend (ops().device_memory) allocates its arena here: budget_bytes of backend
  // memory at once (KVSDK_E_INVALID_ARG for a zero budget, KVSDK_E_NO_MEMORY when the device
  // cannot hold it).
  Context(kvsdk_backend backend, int32_t device, uint64_t budget_bytes, size_t n_threads = 1)
      : backend_(backend), device_(device), budget_(budget_bytes), ops_(require_ops(backend)),
        pool_(n_threads), arena_(allocate_arena()),
        regions_(arena_ ? std::make_unique<ArenaRegions>(*ops_, static_cast<char*>(arena_),
                                                         budget_bytes)
                        : nullptr),
        queue_(create_queue()) {
    count_live(+1);
  }
  // The last context to go frees the zstd contexts snapshots keep between calls
  // (formats/zstd_frame.h), so an app done with kvsdk holds none of its memory.
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  kvsdk_backend backend() const { return backend_; }
  // The kernel table every cache of this context runs (backends/backend_ops.h).
  const backend::Ops& ops() const { return *ops_; }
  // The table of the kernels the core runs on host memory: ops() on the CPU; on a device backend
  // the optimized CPU table (the selection stage scores keys copied out of the device).
  const backend::Ops& host_ops() const {
    return ops_->device_memory ? backend::cpu_optimized() : *ops_;
  }
  // The threads kernels of this context's caches run on.
  ThreadPool& pool() const { return pool_; }
  int32_t device() const { return device_; }
  uint64_t budget() const { return budget_; }  // 0 = unlimited
  uint64_t used() const;

  // Charges `bytes` to the budget if they fit; returns false (charging nothing) otherwise.
  bool try_reserve(uint64_t bytes);
  void release(uint64_t bytes);
  // Bytes still free (UINT64_MAX when unlimited).
  uint64_t available() const;

  // Device backends: the one allocation of exactly the budget that the rows of the context's
  // caches live in (backend memory; null on the CPU), and its regions, one per cache.
  void* arena() const { return arena_; }
  ArenaRegions* regions() const { return regions_.get(); }
  // Device work of this context runs inside a DeviceScope: the context's device is current on
  // the calling thread while it lives, and the thread's previous one afterwards; the context's
  // queue (its streams and pinned staging, backend_ops.h's DeviceQueue) is bound to the thread
  // likewise; and the arena's regions do not move (the caches of one context take turns on the
  // device). A no-op on the CPU. Throws KVSDK_E_BACKEND when the device cannot be selected.
  class DeviceScope {
   public:
    explicit DeviceScope(const Context& ctx);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    std::unique_lock<std::recursive_mutex> hold_;
    const backend::DeviceBackend* device_;
    int32_t previous_ = 0;
    backend::DeviceQueue* previous_queue_ = nullptr;
  };

 private:
  const kvsdk_backend backend_;
  const int32_t device_;
  const uint64_t budget_;
  const backend::Ops* const ops_;
  mutable ThreadPool pool_;

  static void count_live(int delta);
  static const backend::Ops* require_ops(kvsdk_backend kind) {
    const backend::Ops* ops = backend::ops_for(kind);
    if (!ops) fail(KVSDK_E_UNSUPPORTED, "backend ", int(kind), " has no kernels in this build");
    return ops;
  }
  const backend::DeviceBackend* const device_backend_ =
      backend_ == KVSDK_BACKEND_CUDA ? backend::cuda_backend() : nullptr;
  void* allocate_arena() const;  // (in the constructor, after the members above)
  void* const arena_;
  const std::unique_ptr<ArenaRegions> regions_;
  backend::DeviceQueue* create_queue();  // (after the arena; frees it when this throws)
  backend::DeviceQueue* const queue_;

  mutable std::mutex mutex_;
  uint64_t used_ = 0;
};

}  // namespace kvsdk

// The C handle: a shared reference, so caches keep their context alive.
struct kvsdk_context {
  std::shared_ptr<kvsdk::Context> impl;
};
