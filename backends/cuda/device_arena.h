// The device arena (docs/gpu.md): the only device memory a CUDA cache owns for its tiers. One
// cudaMalloc of exactly the context's byte budget (never managed memory), cut into per-layer,
// per-tier slices by the allocation plan (device_arena_plan.h); a new plan re-partitions the same
// region in place, moving each slice's live bytes, so the budget holds across plan changes.
//
// Threading: not thread-safe; one cache (and its stream) owns an arena.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "device_arena_plan.h"

namespace kvsdk::cuda {

struct ArenaStats {
  uint64_t capacity = 0;  // bytes of the one device allocation (= the budget)
  uint64_t reserved = 0;  // bytes covered by the current partition, alignment padding included
  uint64_t used = 0;      // live bytes the owners reported with set_used()
};

class DeviceArena {
 public:
  // Allocates `budget_bytes` on `device`. Throws kvsdk::Error: KVSDK_E_INVALID_ARG for a zero
  // budget, KVSDK_E_BACKEND when no device or the allocation fails (the driver's message kept).
  DeviceArena(int device, uint64_t budget_bytes, cudaStream_t stream = nullptr);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Applies a plan. The first call partitions the empty arena; later calls move each slice's
  // live bytes (set_used) to its new place on the arena's stream and wait for the copies.
  // Throws KVSDK_E_BUDGET (nothing changed) when the plan does not fit or shrinks a slice below
  // its live bytes, KVSDK_E_INVALID_ARG for a plan of another shape than the current one.
  void apply_plan(const ArenaPlan& plan);

  // Device pointer of a slice (valid until the next apply_plan) and its size.
  void* slice(size_t layer, size_t tier) const;
  uint64_t slice_bytes(size_t layer, size_t tier) const;
  // Live bytes at the start of a slice, reported by its owner; KVSDK_E_INVALID_ARG beyond the
  // slice's size.
  void set_used(size_t layer, size_t tier, uint64_t bytes);
  uint64_t used(size_t layer, size_t tier) const;

  ArenaStats stats() const;
  const ArenaPartition& partition() const { return part_; }
  void* base() const { return base_; }
  cudaStream_t stream() const { return stream_; }

 private:
  size_t index(size_t layer, size_t tier) const;

  int device_;
  uint64_t capacity_;
  cudaStream_t stream_;
  void* base_ = nullptr;
  bool partitioned_ = false;
  ArenaPartition part_;
  std::vector<uint64_t> used_;
};

}  // namespace kvsdk::cuda
