// Helpers of the device-cache tests (device_cache_test.cpp and the device_*_test.cpp of each store): caches on a
// CUDA context through the C API next to the same calls on the CPU reference backend. Built with
// CUDA (cuda_backend_test) or against the host execution shim (cuda_host_cache_test), where the
// shim's CUDA backend is installed in place of the build's missing one.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "cuda_ops.h"
#include "cuda_test_util.h"
#include "kvsdk.h"
#include "test_util.h"

namespace kvsdk_device_test {

using kvsdk_test::CachePtr;
using kvsdk_test::ContextPtr;

#ifdef KVSDK_CUDA_HOST_SHIM
// The shim's CUDA backend stands in for the build's missing one in the test binary (one
// environment per binary: an inline variable).
class ShimBackend : public ::testing::Environment {
 public:
  void SetUp() override { kvsdk::backend::install_cuda_backend(&kvsdk::cuda::device_backend()); }
  void TearDown() override { kvsdk::backend::install_cuda_backend(nullptr); }
};
inline ::testing::Environment* const g_shim_backend =
    ::testing::AddGlobalTestEnvironment(new ShimBackend);
#endif

inline kvsdk_status cuda_context(uint64_t budget, ContextPtr& out) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.backend = KVSDK_BACKEND_CUDA;
  o.budget_bytes = budget;
  kvsdk_context* c = nullptr;
  const kvsdk_status st = kvsdk_context_create(&c, &o);
  out.reset(c);
  return st;
}

// First statement of the tests that need a device: skips (with the reason) when the context
// cannot be created for lack of one, which must then be KVSDK_E_BACKEND.
#define CUDA_CONTEXT_OR_SKIP(ctx, budget)                                                   \
  ContextPtr ctx;                                                                           \
  {                                                                                         \
    const kvsdk_status st_ = ::kvsdk_device_test::cuda_context((budget), ctx);              \
    if (st_ == KVSDK_E_BACKEND) KVSDK_NO_CUDA_DEVICE(kvsdk_last_error());                   \
    ASSERT_EQ(st_, KVSDK_OK) << kvsdk_last_error();                                         \
  }

inline uint64_t device_bytes_in_use() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return uint64_t(total - free_bytes);
}

// The most the device's free memory may drop for one allocation of `bytes`: the shim accounts
// 256-byte granules (a 4 KiB margin), a GPU's driver maps 2 MiB pages (the first GPU run saw a
// 66 KB arena take 2 MiB).
inline uint64_t allocation_bound(uint64_t bytes) {
#ifdef KVSDK_CUDA_HOST_SHIM
  return bytes + 4096;
#else
  const uint64_t page = 2ull << 20;
  return (bytes + page - 1) / page * page;
#endif
}

struct Rows {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};

inline Rows read_rows(kvsdk_cache* c, uint32_t layer, uint32_t head, uint32_t dim) {
  size_t n = 0;
  EXPECT_EQ(kvsdk_cache_read(c, layer, head, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
  Rows r{std::vector<float>(n * dim), std::vector<float>(n * dim), std::vector<int32_t>(n)};
  EXPECT_EQ(kvsdk_cache_read(c, layer, head, r.k.data(), r.v.data(), r.pos.data(), n, &n),
            KVSDK_OK)
      << kvsdk_last_error();
  return r;
}

// Layer `l`'s rows of both caches, bit for bit.
inline void expect_same_layer_rows(kvsdk_cache* a, kvsdk_cache* b, const kvsdk_geometry& g,
                                   uint32_t l) {
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
    const Rows x = read_rows(a, l, h, g.head_dim), y = read_rows(b, l, h, g.head_dim);
    ASSERT_EQ(x.pos, y.pos) << "layer " << l << " head " << h;
    ASSERT_EQ(x.k.size(), y.k.size());
    if (x.k.empty()) continue;  // (memcmp may not see null pointers, even for no bytes)
    ASSERT_EQ(0, std::memcmp(x.k.data(), y.k.data(), x.k.size() * sizeof(float)))
        << "keys, layer " << l << " head " << h;
    ASSERT_EQ(0, std::memcmp(x.v.data(), y.v.data(), x.v.size() * sizeof(float)))
        << "values, layer " << l << " head " << h;
  }
}

inline void expect_same_rows(kvsdk_cache* a, kvsdk_cache* b, const kvsdk_geometry& g) {
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    expect_same_layer_rows(a, b, g, l);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// One query per entry of `pos` (every query head), attended on layer `layer`.
inline std::vector<float> attend(kvsdk_cache* c, const kvsdk_geometry& /*g*/, uint32_t layer,
                                 const std::vector<float>& q, const std::vector<int32_t>& pos) {
  std::vector<float> out(q.size());
  EXPECT_EQ(kvsdk_cache_attend(c, layer, pos.size(), q.data(), pos.data(),
                               q.size() * sizeof(float), out.data(), out.size() * sizeof(float)),
            KVSDK_OK)
      << kvsdk_last_error();
  return out;
}

// Appends one token per entry of `pos` to one layer (f32 host data from `seed`).
// The same queries (one per entry of `qpos`, every query head) attended on both caches: within
// 2e-4 (the decode kernels' tolerance against the reference backend).
inline void expect_same_attention(kvsdk_cache* a, kvsdk_cache* b, const kvsdk_geometry& g,
                                  uint32_t layer, const std::vector<int32_t>& qpos,
                                  uint32_t seed) {
  const auto q = kvsdk_test::random_floats(qpos.size() * g.n_q_heads * g.head_dim, seed);
  const auto x = attend(a, g, layer, q, qpos), y = attend(b, g, layer, q, qpos);
  ASSERT_EQ(x.size(), y.size());
  const size_t row = size_t(g.n_q_heads) * g.head_dim;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(x[i], y[i], 2e-4) << "layer " << layer << " query " << i / row << " (position "
                                  << qpos[i / row] << ") element " << i % row;
  }
}

inline kvsdk_status append_at(kvsdk_cache* c, const kvsdk_geometry& g, uint32_t layer,
                              const std::vector<int32_t>& pos, uint32_t seed) {
  const size_t elems = pos.size() * g.n_kv_heads * g.head_dim;
  const auto k = kvsdk_test::random_floats(elems, seed);
  const auto v = kvsdk_test::random_floats(elems, seed + 1);
  return kvsdk_cache_append(c, layer, pos.size(), k.data(), v.data(), pos.data(),
                            elems * sizeof(float));
}

// Appends tokens at positions first, first + 1, ... and expects `want`.
inline void append(kvsdk_cache* c, const kvsdk_geometry& g, uint32_t layer, int32_t first,
                   size_t n, uint32_t seed, kvsdk_status want = KVSDK_OK) {
  EXPECT_EQ(append_at(c, g, layer, kvsdk_test::iota_positions(n, first), seed), want)
      << kvsdk_last_error();
}

inline kvsdk_cache_stats stats(kvsdk_cache* c) {
  kvsdk_cache_stats s;
  kvsdk_cache_stats_init(&s);
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s;
}

inline std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace kvsdk_device_test
