// The attend/read bodies shared by representations that keep one store per layer and KV head
// (kivi, spindlekv): a store has size(), positions() and read_rows(first, count, k, v), and a
// kernel that feeds it into an OnlineAttention chunk by chunk.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention.h"
#include "core/geometry.h"

namespace kvsdk {

// Attention of packed query rows over one store through `add(store, attention)` (e.g.
// cpu::kivi_attend, cpu::spindlekv_attend); writes out [n_rows][head_dim].
template <class Store, class AddRows>
void attend_head_store(const Store& store, AddRows add, const Geometry& g, const float* q_rows,
                       const int32_t* row_positions, size_t n_rows, float* out) {
  cpu::OnlineAttention att(q_rows, row_positions, n_rows, g.head_dim, g.attn_scale);
  add(store, att);
  att.finish(out);
}

// The same over a store's reusable scratch (the decode path allocates nothing):
// `add(store, attention, scratch)` feeds the chunks through scratch's chunk buffers.
template <class Store, class AddRows>
void attend_head_store(const Store& store, AddRows add, const Geometry& g, const float* q_rows,
                       const int32_t* row_positions, size_t n_rows, float* out,
                       cpu::AttentionScratch& scratch) {
  cpu::OnlineAttention att(q_rows, row_positions, n_rows, g.head_dim, g.attn_scale, scratch);
  add(store, att, scratch);
  att.finish(out);
}

// Representation::read over one store: rows as attention sees them; null outputs are skipped.
template <class Store>
void read_head_store(const Store& store, size_t head_dim, float* k, float* v,
                     int32_t* positions) {
  const size_t n = store.size();
  std::vector<float> kf(k ? 0 : n * head_dim), vf(v ? 0 : n * head_dim);
  store.read_rows(0, n, k ? k : kf.data(), v ? v : vf.data());
  if (positions) std::copy_n(store.positions().data(), n, positions);
}

}  // namespace kvsdk
