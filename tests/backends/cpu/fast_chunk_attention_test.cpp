// The optimized online softmax over f32 chunks (backends/cpu/fast_chunk_attention.h): the same
// bits on every compiled SIMD target, and a digest of fixed inputs pinned to a constant so that
// x86-64 and aarch64 (NEON, under qemu) are checked to agree bit for bit. Its gap to the reference
// (cpu::OnlineAttention) is bounded per op in tests/backends/backend_ops_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fast_attention.h"
#include "test_util.h"
#include "fast_chunk_attention.h"

namespace kvsdk::cpu {
namespace {

// Deterministic inputs from an integer generator (no library distribution: the same floats on
// every platform), roughly uniform in [-2, 2).
std::vector<float> fixed_floats(size_t n, uint32_t seed) {
  std::vector<float> x(n);
  uint32_t s = seed * 2654435761u + 1u;
  for (float& f : x) {
    s = s * 1664525u + 1013904223u;
    f = float(int32_t(s >> 8) - (1 << 23)) / float(1 << 22);
  }
  return x;
}

// Outputs of ChunkAttention over several shapes (head dims with and without a tail past a
// multiple of 16, GQA tiles of 1..9 rows, ragged chunks, causal rows that see part of the tokens
// or none).
std::vector<float> fixed_outputs() {
  std::vector<float> all;
  fast::ChunkScratch scratch;
  for (size_t dim : {size_t(64), size_t(72), size_t(128)}) {
    for (size_t rows : {size_t(1), size_t(3), size_t(9)}) {
      const size_t n = 301;
      const std::vector<float> k = fixed_floats(n * dim, uint32_t(dim + rows));
      const std::vector<float> v = fixed_floats(n * dim, uint32_t(dim + rows + 1));
      const std::vector<float> q = fixed_floats(rows * dim, uint32_t(dim + rows + 2));
      std::vector<int32_t> pos(n), qpos(rows);
      for (size_t t = 0; t < n; ++t) pos[t] = int32_t(t);
      for (size_t r = 0; r < rows; ++r) qpos[r] = r == 0 ? INT32_MAX : int32_t(r * 97) - 60;
      fast::Queries qs;
      qs.q = q.data();
      qs.positions = qpos.data();
      qs.n_rows = rows;
      qs.dim = dim;
      qs.scale = 0.125f;
      fast::ChunkAttention att(qs, scratch);
      for (size_t first = 0; first < n;) {  // ragged chunks: 1, 70, 139, ...
        const size_t c = std::min(n - first, 1 + (first * 7) % 150);
        att.add_chunk(k.data() + first * dim, v.data() + first * dim, pos.data() + first, c);
        first += c;
      }
      std::vector<float> out(rows * dim);
      att.finish(out.data());
      all.insert(all.end(), out.begin(), out.end());
    }
  }
  return all;
}

TEST(FastChunkAttention, SameBitsOnEveryCompiledTarget) {
  const std::vector<fast::Target> targets = fast::available_targets();
  ASSERT_FALSE(targets.empty());
  std::vector<float> first;
  std::string all;
  for (const fast::Target& t : targets) {
    fast::force_target(t.bits);
    const std::vector<float> out = fixed_outputs();
    all += std::string(t.name) + " ";
    if (first.empty()) {
      first = out;
      continue;
    }
    ASSERT_EQ(out.size(), first.size());
    EXPECT_EQ(0, std::memcmp(out.data(), first.data(), out.size() * sizeof(float)))
        << t.name << " differs from " << targets[0].name;
  }
  fast::force_target(0);
  std::printf("targets compared: %s\n", all.c_str());
  EXPECT_GE(targets.size(), 2u) << all;
}

// Recorded on x86-64 (AVX-512); passes unchanged on aarch64 (NEON) under qemu.
TEST(FastChunkAttention, DigestMatchesAcrossArchitectures) {
  const uint64_t d = kvsdk_test::float_digest(fixed_outputs());
  std::printf("digest 0x%016llx\n", static_cast<unsigned long long>(d));
  EXPECT_EQ(d, 0x162eba0529c6ef9aull);
}

}  // namespace
}  // namespace kvsdk::cpu
