#include "device_arena_plan.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace kvsdk::cuda {

namespace {

void push_move(std::vector<ArenaCopy>& ops, uint64_t dst, uint64_t src, uint64_t bytes) {
  move_in_chunks(dst, src, bytes,
                 [&](uint64_t d, uint64_t s, uint64_t n) { ops.push_back({d, s, n}); });
}

}  // namespace

ArenaPartition partition_arena(const ArenaPlan& plan, uint64_t capacity, uint64_t alignment) {
  KVSDK_REQUIRE(alignment > 0 && (alignment & (alignment - 1)) == 0, "arena alignment ",
                alignment, " is not a power of two");
  ArenaPartition p;
  p.tiers = plan.tiers();
  uint64_t offset = 0;
  for (size_t l = 0; l < plan.layers(); ++l) {
    KVSDK_REQUIRE(plan.bytes[l].size() == p.tiers, "allocation plan layer ", l, " has ",
                  plan.bytes[l].size(), " tiers, layer 0 has ", p.tiers);
    for (size_t t = 0; t < p.tiers; ++t) {
      const uint64_t b = plan.bytes[l][t];
      // Checked before adding so a huge request cannot wrap around.
      if (b > 0 && (b > capacity || offset > capacity - b)) {
        fail(KVSDK_E_BUDGET, "allocation plan does not fit the device budget: layer ", l,
             " tier ", t, " needs ", b, " bytes at offset ", offset, " of a ", capacity,
             "-byte arena");
      }
      p.slices.push_back({offset, b});
      offset = b > 0 ? align_up(offset + b, alignment) : offset;
      p.reserved = std::max(p.reserved, std::min(offset, capacity));
    }
  }
  return p;
}

std::vector<ArenaCopy> plan_repartition(const ArenaPartition& from, const ArenaPartition& to,
                                        const std::vector<uint64_t>& used) {
  KVSDK_REQUIRE(from.tiers == to.tiers && from.slices.size() == to.slices.size(),
                "re-partitioning needs plans of the same shape (", from.slices.size(), " vs ",
                to.slices.size(), " slices)");
  KVSDK_REQUIRE(used.size() == from.slices.size(), "used[] has ", used.size(), " entries for ",
                from.slices.size(), " slices");
  for (size_t i = 0; i < used.size(); ++i) {
    KVSDK_REQUIRE(used[i] <= from.slices[i].bytes, "slice ", i, " claims ", used[i],
                  " live bytes but holds ", from.slices[i].bytes);
    if (used[i] > to.slices[i].bytes) {
      fail(KVSDK_E_BUDGET, "slice ", i, " (layer ", i / std::max<size_t>(from.tiers, 1),
           ") holds ", used[i], " live bytes but the new plan gives it ", to.slices[i].bytes,
           "; evict before shrinking");
    }
  }
  // In the order of the slices' offsets, not their indices: a layout may place slices in any
  // order (by alignment, say), as long as both partitions place them in the same one.
  std::vector<size_t> order(used.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return from.slices[a].offset < from.slices[b].offset;
  });
  std::vector<ArenaCopy> ops;
  for (size_t i : order) {  // downward moves, ascending
    if (to.slices[i].offset < from.slices[i].offset) {
      push_move(ops, to.slices[i].offset, from.slices[i].offset, used[i]);
    }
  }
  for (size_t k = order.size(); k-- > 0;) {  // upward moves, descending
    const size_t i = order[k];
    if (to.slices[i].offset > from.slices[i].offset) {
      push_move(ops, to.slices[i].offset, from.slices[i].offset, used[i]);
    }
  }
  return ops;
}

}  // namespace kvsdk::cuda
