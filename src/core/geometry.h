// Model geometry as the core uses it: validated once at cache creation, then trusted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvsdk.h"

namespace kvsdk {

struct Geometry {
  uint32_t n_layers = 0;
  uint32_t n_q_heads = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  kvsdk_dtype dtype = KVSDK_DTYPE_F32;
  kvsdk_rope_style rope_style = KVSDK_ROPE_INTERLEAVED;
  float rope_theta = 10000.0f;
  float attn_scale = 0.0f;  // resolved: never 0 after from_c

  uint32_t group_size() const { return n_q_heads / n_kv_heads; }  // query heads per KV head
  size_t kv_elems_per_token() const { return size_t(n_kv_heads) * head_dim; }
  size_t q_elems_per_token() const { return size_t(n_q_heads) * head_dim; }

  static Geometry from_c(const kvsdk_geometry* g);  // validates; throws kvsdk::Error
  kvsdk_geometry to_c() const;
  bool operator==(const Geometry& o) const;
  bool operator!=(const Geometry& o) const { return !(*this == o); }
};

kvsdk_geometry geometry_defaults();

// Largest accepted values: keep every size product far from overflow.
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxHeads = 4096;
constexpr uint32_t kMaxHeadDim = 1024;

}  // namespace kvsdk
