// The exact tier of one KV head: f16 keys and values with their original positions, in the order
// they were appended (eviction removes rows but never reorders survivors).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/row_allocator.h"

namespace kvsdk {

struct ExactStore {
  // Row buffers on huge pages once they are large (util/row_allocator.h).
  RowVector<int32_t> positions;  // [n]
  RowVector<uint16_t> k;         // [n][head_dim] f16
  RowVector<uint16_t> v;         // [n][head_dim] f16

  size_t size() const { return positions.size(); }

  // Removes every row at a position >= `position`, keeping the others in order (truncation: no
  // allocation, nothing re-rounded). Returns how many rows it removed.
  size_t remove_from(int32_t position, size_t head_dim) noexcept {
    size_t j = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
      if (positions[i] >= position) continue;
      if (j != i) {
        positions[j] = positions[i];
        std::copy_n(k.begin() + long(i * head_dim), head_dim, k.begin() + long(j * head_dim));
        std::copy_n(v.begin() + long(i * head_dim), head_dim, v.begin() + long(j * head_dim));
      }
      ++j;
    }
    const size_t removed = positions.size() - j;
    positions.resize(j);
    k.resize(j * head_dim);
    v.resize(j * head_dim);
    return removed;
  }

  // Budgeted bytes per stored token (keys + values, and the position as metadata).
  static uint64_t kv_bytes_per_token(uint32_t head_dim) { return uint64_t(head_dim) * 2 * 2; }
  static uint64_t meta_bytes_per_token() { return sizeof(int32_t); }
  static uint64_t bytes_per_token(uint32_t head_dim) {
    return kv_bytes_per_token(head_dim) + meta_bytes_per_token();
  }
};

}  // namespace kvsdk
