// What the golden snapshots hold, as formulas: the generator (make_golden.cpp) writes caches
// filled from these, and golden_test.cpp checks every loaded row against them. Every value is
// exactly representable in f16, so the exact tier returns it bit for bit.
#pragma once

#include <cstdint>

#include "kvsdk.h"

namespace kvsdk_golden {

// Key/value element d of token t (position t) in layer l, KV head h: multiples of 1/8 in
// [-16, 16), distinct across (l, t, h, d) within the small golden geometries.
inline float key_value(uint32_t l, uint32_t t, uint32_t h, uint32_t d, bool value) {
  const uint32_t x = (l * 131u + t * 31u + h * 17u + d * 7u + (value ? 5u : 0u)) % 256u;
  return (float(x) - 128.0f) / 8.0f;
}

inline kvsdk_geometry golden_geometry(int32_t dtype) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = 2;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.dtype = dtype;
  g.rope_theta = 500000.0f;
  return g;
}

// Tokens in each layer of the base snapshot; layer 1 holds more (uneven layers).
inline uint32_t base_tokens(uint32_t layer) { return layer == 0 ? 5u : 7u; }

}  // namespace kvsdk_golden
