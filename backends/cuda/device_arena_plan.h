// Host-only bookkeeping of the device arena (docs/gpu.md): how one byte budget is cut into
// per-layer, per-tier slices (XKV's personalised per-layer sizes: every layer gets its own byte
// count from the allocation plan), and how live data moves when the plan changes. No CUDA here,
// so the logic is unit-tested on any machine; device_arena.cu executes the copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::cuda {

// Bytes every slice starts on: 256 keeps 16-byte vector loads and cuBLAS' preferred alignment.
constexpr uint64_t kArenaAlignment = 256;

// `x` rounded up to a multiple of `to` (> 0).
inline uint64_t align_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

// The allocation plan: bytes[layer][tier] requested for each slice (a tier that a layer does not
// use asks for 0 bytes). All layers must have the same number of tiers.
struct ArenaPlan {
  std::vector<std::vector<uint64_t>> bytes;
  size_t layers() const { return bytes.size(); }
  size_t tiers() const { return bytes.empty() ? 0 : bytes[0].size(); }
};

struct ArenaSlice {
  uint64_t offset = 0;  // from the arena base, a multiple of the alignment
  uint64_t bytes = 0;   // as requested by the plan (the padding up to the next slice is not usable)
};

// Slices laid out layer-major (layer 0 tier 0, layer 0 tier 1, ..., layer 1 tier 0, ...), each
// starting on `alignment`. Throws kvsdk::Error: KVSDK_E_INVALID_ARG for a ragged plan or an
// alignment that is not a power of two, KVSDK_E_BUDGET (naming the layer that does not fit) when
// the aligned slices need more than `capacity` bytes.
struct ArenaPartition {
  size_t tiers = 0;
  std::vector<ArenaSlice> slices;  // [layer * tiers + tier]
  uint64_t reserved = 0;           // end of the last slice, padding included: <= capacity
  const ArenaSlice& at(size_t layer, size_t tier) const { return slices[layer * tiers + tier]; }
};
ArenaPartition partition_arena(const ArenaPlan& plan, uint64_t capacity,
                               uint64_t alignment = kArenaAlignment);

// Moves `bytes` bytes from offset `src` to offset `dst` of one buffer without reading a byte the
// move has already overwritten: one copy(dst, src, n) when the ranges do not overlap, else chunks
// of at most |dst - src| bytes, front to back when moving down and back to front when moving up,
// so no copy overlaps itself.
template <class Copy>
void move_in_chunks(uint64_t dst, uint64_t src, uint64_t bytes, Copy&& copy) {
  if (bytes == 0 || dst == src) return;
  const uint64_t shift = dst > src ? dst - src : src - dst;
  if (shift >= bytes) {
    copy(dst, src, bytes);
  } else if (dst < src) {
    for (uint64_t done = 0; done < bytes; done += shift) {
      copy(dst + done, src + done, shift < bytes - done ? shift : bytes - done);
    }
  } else {
    for (uint64_t left = bytes; left > 0;) {
      const uint64_t n = shift < left ? shift : left;
      left -= n;
      copy(dst + left, src + left, n);
    }
  }
}

// One copy inside the arena; source and destination never overlap within one op.
struct ArenaCopy {
  uint64_t dst = 0, src = 0, bytes = 0;
};

// The copies that move each slice's live bytes (used[i] bytes at the start of slice i of `from`)
// to the start of the same slice in `to`, executed in order on one buffer without losing data
// (compaction to lower offsets first in ascending order of offset, then moves to higher offsets
// in descending order; a slice that overlaps itself moves in chunks no longer than its shift).
// Slices may lie in any order of their indices, as long as `from` and `to` order them alike.
// Throws KVSDK_E_INVALID_ARG when the partitions differ in shape, and KVSDK_E_BUDGET when a slice
// holds more live bytes than its new size (shrinking a plan must first evict).
std::vector<ArenaCopy> plan_repartition(const ArenaPartition& from, const ArenaPartition& to,
                                        const std::vector<uint64_t>& used);

}  // namespace kvsdk::cuda
