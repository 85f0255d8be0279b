#include "core/arena_regions.h"

#include <algorithm>

#include "device_arena_plan.h"
#include "util/error.h"

namespace kvsdk {

namespace {

// Every region starts on 16 bytes: the stores read their rows with 16-byte vector loads from
// their region's start, and a store's region may end anywhere (its 4-byte parts last; the
// device MiniCache store found one after a DeviceRows region of 63 positions). So each region
// but the last is followed by up to 12 bytes of padding.
constexpr uint64_t kRegionAlignment = 16;
uint64_t padded(uint64_t bytes) { return cuda::align_up(bytes, kRegionAlignment); }

}  // namespace

size_t ArenaRegions::index(const ArenaOwner* owner) const {
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].owner == owner) return i;
  }
  fail(KVSDK_E_INTERNAL, "a device store without a region of the arena");
}

void ArenaRegions::join(ArenaOwner* owner) {
  const std::lock_guard<std::recursive_mutex> hold(lock_);
  const uint64_t end =
      regions_.empty() ? 0 : regions_.back().offset + padded(regions_.back().bytes);
  regions_.push_back({owner, end, 0});
}

void ArenaRegions::leave(const ArenaOwner* owner) noexcept {
  const std::lock_guard<std::recursive_mutex> hold(lock_);
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].owner == owner) {
      regions_.erase(regions_.begin() + long(i));  // (its bytes become a gap until a repack)
      return;
    }
  }
}

char* ArenaRegions::base(const ArenaOwner* owner) const {
  const std::lock_guard<std::recursive_mutex> hold(lock_);
  return arena_ + regions_[index(owner)].offset;
}

uint64_t ArenaRegions::size(const ArenaOwner* owner) const {
  const std::lock_guard<std::recursive_mutex> hold(lock_);
  return regions_[index(owner)].bytes;
}

uint64_t ArenaRegions::room_for(const ArenaOwner* owner) const {
  const std::lock_guard<std::recursive_mutex> hold(lock_);
  uint64_t others = 0;
  for (size_t j = 0; j < regions_.size(); ++j) {
    const Region& r = regions_[j];
    if (r.owner != owner) others += j + 1 < regions_.size() ? padded(r.bytes) : r.bytes;
  }
  return bytes_ - std::min(bytes_, others);
}

void ArenaRegions::grow(ArenaOwner* owner, uint64_t bytes) {
  const std::lock_guard<std::recursive_mutex> hold(lock_);
  const size_t i = index(owner);
  Region& r = regions_[i];
  if (bytes <= r.bytes) return;
  // In place when the gap after it (or the arena's end) is room enough.
  const uint64_t limit = i + 1 < regions_.size() ? regions_[i + 1].offset : bytes_;
  if (r.offset <= limit && bytes <= limit - r.offset) {
    r.bytes = bytes;
    return;
  }
  std::vector<uint64_t> sizes(regions_.size());
  const auto packed = [&] {  // (the last region needs no padding after it)
    uint64_t t = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      t += j + 1 < sizes.size() ? padded(sizes[j]) : sizes[j];
    }
    return t;
  };
  for (size_t j = 0; j < regions_.size(); ++j) sizes[j] = j == i ? bytes : regions_[j].bytes;
  uint64_t total = packed();
  if (total > bytes_) {  // the others give back what they hold beyond their rows
    for (size_t j = 0; j < regions_.size(); ++j) {
      if (j == i) continue;
      sizes[j] = std::min(regions_[j].bytes, regions_[j].owner->shrink_to_fit());
    }
    total = packed();
  }
  if (total > bytes_) {
    // (The shrunk owners keep their regions; their rows sit at the start of them.)
    fail(KVSDK_E_BUDGET, "the device arena (", bytes_, " bytes) cannot hold ", total,
         " bytes of the context's caches");
  }
  pack(sizes);
}

void ArenaRegions::pack(const std::vector<uint64_t>& sizes) {
  cuda::ArenaPartition from, to;
  from.tiers = to.tiers = 1;
  std::vector<uint64_t> used(regions_.size());
  uint64_t offset = 0;
  for (size_t j = 0; j < regions_.size(); ++j) {
    from.slices.push_back({regions_[j].offset, regions_[j].bytes});
    to.slices.push_back({offset, sizes[j]});
    used[j] = std::min(regions_[j].bytes, sizes[j]);
    offset += padded(sizes[j]);
  }
  for (const cuda::ArenaCopy& c : cuda::plan_repartition(from, to, used)) {
    ops_.copy(arena_ + c.dst, arena_ + c.src, size_t(c.bytes));
  }
  for (size_t j = 0; j < regions_.size(); ++j) {
    regions_[j].offset = to.slices[j].offset;
    regions_[j].bytes = sizes[j];
  }
}

}  // namespace kvsdk
