// The device arena of a device context (core/context.h) shared by its caches: each cache's store
// (repr/device_rows.h) holds one contiguous region of it, in creation order (each starting on
// 16 bytes: up to 12 bytes of padding between regions), and lays its layers' slices out inside.
// A region that must grow past its neighbour makes the regions move: they are packed again in
// order, their live bytes copied on the device without overlap
// (cuda::plan_repartition), and when even that does not fit, the other owners first give back
// the capacity they hold beyond their rows (shrink_to_fit). So the caches of a context never need
// more device memory than the one allocation of the budget, whichever of them grows.
//
// Threading: every device operation of the context's caches holds lock() (Context::DeviceScope),
// so a region never moves while its owner works on it.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "backend_ops.h"

namespace kvsdk {

class ArenaOwner {
 public:
  // Re-lays the owner's rows at the start of its region to exactly what it holds (and what its
  // planned evictions need), and returns the region bytes it needs from now on. Called under
  // the lock, from another cache's call. Throws only when the device fails.
  virtual uint64_t shrink_to_fit() = 0;

 protected:
  ~ArenaOwner() = default;
};

class ArenaRegions {
 public:
  ArenaRegions(const backend::Ops& ops, char* arena, uint64_t bytes)
      : ops_(ops), arena_(arena), bytes_(bytes) {}

  std::recursive_mutex& lock() const { return lock_; }
  uint64_t bytes() const { return bytes_; }

  void join(ArenaOwner* owner);  // an empty region after the others (may throw bad_alloc)
  void leave(const ArenaOwner* owner) noexcept;
  char* base(const ArenaOwner* owner) const;
  uint64_t size(const ArenaOwner* owner) const;
  // Arena bytes not held by the other owners' regions.
  uint64_t room_for(const ArenaOwner* owner) const;
  // Makes `owner`'s region at least `bytes` long, keeping its contents (the region may move; so
  // may the others). Throws KVSDK_E_BUDGET when the regions cannot fit the arena even after the
  // other owners shrank to fit, KVSDK_E_BACKEND when the device fails.
  void grow(ArenaOwner* owner, uint64_t bytes);

 private:
  struct Region {
    ArenaOwner* owner;
    uint64_t offset, bytes;
  };
  size_t index(const ArenaOwner* owner) const;
  // Moves every region to a packing in order with the given sizes (each holding its first
  // min(old, new) bytes).
  void pack(const std::vector<uint64_t>& sizes);

  const backend::Ops& ops_;
  char* const arena_;
  const uint64_t bytes_;
  mutable std::recursive_mutex lock_;
  std::vector<Region> regions_;  // in offset order
};

}  // namespace kvsdk
