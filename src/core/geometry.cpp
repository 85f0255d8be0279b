#include "core/geometry.h"

#include <cmath>

#include "util/dtype.h"
#include "util/error.h"
#include "util/options.h"
#include "util/struct_versions.h"

namespace kvsdk {

kvsdk_geometry geometry_defaults() {
  kvsdk_geometry g{};
  g.struct_size = sizeof(kvsdk_geometry);
  g.dtype = KVSDK_DTYPE_F32;
  g.rope_style = KVSDK_ROPE_INTERLEAVED;
  g.rope_theta = 10000.0f;
  g.attn_scale = 0.0f;
  return g;
}

Geometry Geometry::from_c(const kvsdk_geometry* caller) {
  const kvsdk_geometry c =
      read_versioned(caller, geometry_defaults(), kGeometrySizeV1, "geometry");
  KVSDK_REQUIRE(c.n_layers >= 1 && c.n_layers <= kMaxLayers, "geometry.n_layers is ", c.n_layers,
                " (must be 1..", kMaxLayers, ")");
  KVSDK_REQUIRE(c.n_kv_heads >= 1 && c.n_kv_heads <= kMaxHeads, "geometry.n_kv_heads is ",
                c.n_kv_heads, " (must be 1..", kMaxHeads, ")");
  KVSDK_REQUIRE(c.n_q_heads >= c.n_kv_heads && c.n_q_heads <= kMaxHeads &&
                    c.n_q_heads % c.n_kv_heads == 0,
                "geometry.n_q_heads is ", c.n_q_heads, " (must be a multiple of n_kv_heads = ",
                c.n_kv_heads, ", at most ", kMaxHeads, ")");
  KVSDK_REQUIRE(c.head_dim >= 1 && c.head_dim <= kMaxHeadDim, "geometry.head_dim is ", c.head_dim,
                " (must be 1..", kMaxHeadDim, ")");
  KVSDK_REQUIRE(dtype_valid(c.dtype), "geometry.dtype is ", c.dtype, " (not a kvsdk_dtype)");
  KVSDK_REQUIRE(c.rope_style >= KVSDK_ROPE_NONE && c.rope_style <= KVSDK_ROPE_HALF,
                "geometry.rope_style is ", c.rope_style, " (not a kvsdk_rope_style)");
  KVSDK_REQUIRE(c.rope_style != KVSDK_ROPE_INTERLEAVED || c.head_dim % 2 == 0,
                "geometry.head_dim must be even for RoPE");
  KVSDK_REQUIRE(c.rope_style != KVSDK_ROPE_HALF || c.head_dim % 2 == 0,
                "geometry.head_dim must be even for RoPE");
  KVSDK_REQUIRE(std::isfinite(c.rope_theta) && c.rope_theta > 0.0f, "geometry.rope_theta is ",
                c.rope_theta, " (must be finite and > 0)");
  KVSDK_REQUIRE(std::isfinite(c.attn_scale) && c.attn_scale >= 0.0f, "geometry.attn_scale is ",
                c.attn_scale, " (must be finite and >= 0)");
  Geometry g;
  g.n_layers = c.n_layers;
  g.n_q_heads = c.n_q_heads;
  g.n_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim;
  g.dtype = static_cast<kvsdk_dtype>(c.dtype);
  g.rope_style = static_cast<kvsdk_rope_style>(c.rope_style);
  g.rope_theta = c.rope_theta;
  g.attn_scale = c.attn_scale > 0.0f ? c.attn_scale : 1.0f / std::sqrt(float(c.head_dim));
  return g;
}

kvsdk_geometry Geometry::to_c() const {
  kvsdk_geometry c = geometry_defaults();
  c.n_layers = n_layers;
  c.n_q_heads = n_q_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.rope_style = rope_style;
  c.rope_theta = rope_theta;
  c.attn_scale = attn_scale;
  return c;
}

bool Geometry::operator==(const Geometry& o) const {
  return n_layers == o.n_layers && n_q_heads == o.n_q_heads && n_kv_heads == o.n_kv_heads &&
         head_dim == o.head_dim && dtype == o.dtype && rope_style == o.rope_style &&
         rope_theta == o.rope_theta && attn_scale == o.attn_scale;
}

}  // namespace kvsdk
