// Shared helpers for kvsdk tests: RAII handles, random tensors, geometry builders.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kvsdk.h"

namespace kvsdk_test {

struct ContextDeleter {
  void operator()(kvsdk_context* c) const { kvsdk_context_destroy(c); }
};
struct CacheDeleter {
  void operator()(kvsdk_cache* c) const { kvsdk_cache_destroy(c); }
};
using ContextPtr = std::unique_ptr<kvsdk_context, ContextDeleter>;
using CachePtr = std::unique_ptr<kvsdk_cache, CacheDeleter>;

inline kvsdk_geometry make_geometry(uint32_t layers, uint32_t q_heads, uint32_t kv_heads,
                                    uint32_t head_dim, kvsdk_dtype dtype = KVSDK_DTYPE_F32) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = layers;
  g.n_q_heads = q_heads;
  g.n_kv_heads = kv_heads;
  g.head_dim = head_dim;
  g.dtype = dtype;
  return g;
}

inline ContextPtr make_context(uint64_t budget = 0, kvsdk_backend backend = KVSDK_BACKEND_CPU) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.budget_bytes = budget;
  o.backend = backend;
  kvsdk_context* c = nullptr;
  if (kvsdk_context_create(&c, &o) != KVSDK_OK) return nullptr;
  return ContextPtr(c);
}

// A context on `n_threads` threads (kvsdk_context_options.n_threads), or null.
inline ContextPtr context_with_threads(int32_t n_threads) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.n_threads = n_threads;
  kvsdk_context* c = nullptr;
  if (kvsdk_context_create(&c, &o) != KVSDK_OK) return nullptr;
  return ContextPtr(c);
}

inline CachePtr make_cache(kvsdk_context* ctx, const kvsdk_geometry& g,
                           const kvsdk_policy* policy = nullptr) {
  kvsdk_cache* c = nullptr;
  if (kvsdk_cache_create(&c, ctx, &g, policy) != KVSDK_OK) return nullptr;
  return CachePtr(c);
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> iota_positions(size_t n, int32_t start = 0) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = start + int32_t(i);
  return p;
}

// FNV-1a over the bytes of every float: a digest that pins a kernel's exact outputs (the same
// bits on every SIMD target and architecture) in one constant.
inline uint64_t float_digest(const std::vector<float>& x) {
  uint64_t h = 1469598103934665603ull;
  for (float f : x) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) h = (h ^ ((u >> (8 * i)) & 0xffu)) * 1099511628211ull;
  }
  return h;
}

// Exact f16 exact-tier bytes per token per layer (keys, values, position per KV head).
inline uint64_t exact_bytes_per_token(const kvsdk_geometry& g) {
  return uint64_t(g.n_kv_heads) * (uint64_t(g.head_dim) * 4 + 4);
}

}  // namespace kvsdk_test
