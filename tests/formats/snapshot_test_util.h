// Helpers for snapshot tests: caches filled with reproducible data, whole-cache comparison,
// temporary directories.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "test_util.h"

namespace kvsdk_test {

// Appends `n` tokens at positions pos0.. to every layer (f32 host data from `seed`).
inline void fill(kvsdk_cache* c, const kvsdk_geometry& g, size_t n, int32_t pos0, uint32_t seed) {
  const size_t esz = g.dtype == KVSDK_DTYPE_F32 ? 4 : 2;
  ASSERT_EQ(g.dtype, KVSDK_DTYPE_F32) << "fill() produces f32 host data";
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const size_t elems = n * g.n_kv_heads * g.head_dim;
    auto k = random_floats(elems, seed * 131 + l * 2);
    auto v = random_floats(elems, seed * 131 + l * 2 + 1);
    auto p = iota_positions(n, pos0);
    ASSERT_EQ(kvsdk_cache_append(c, l, n, k.data(), v.data(), p.data(), elems * esz), KVSDK_OK)
        << kvsdk_last_error();
  }
}

// Everything a cache holds, as bytes (f16 host reads), for exact comparison.
struct CacheDump {
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<std::vector<int32_t>> pos;
  kvsdk_cache_stats stats{};
  bool operator==(const CacheDump& o) const {
    return k == o.k && v == o.v && pos == o.pos && stats.tokens == o.stats.tokens &&
           stats.appended_tokens == o.stats.appended_tokens && stats.bytes == o.stats.bytes &&
           stats.full_bytes == o.stats.full_bytes;
  }
};

// Reads every head; the geometry's dtype must be 2 bytes or f32 (read into matching buffers).
inline CacheDump dump(const kvsdk_cache* c) {
  CacheDump d;
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  EXPECT_EQ(kvsdk_cache_geometry(c, &g), KVSDK_OK);
  const size_t esz = g.dtype == KVSDK_DTYPE_F32 ? 4 : 2;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      size_t n = 0;
      EXPECT_EQ(kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      std::vector<uint16_t> k(n * g.head_dim * esz / 2), v(n * g.head_dim * esz / 2);
      std::vector<int32_t> p(n);
      if (n) EXPECT_EQ(kvsdk_cache_read(c, l, h, k.data(), v.data(), p.data(), n, &n), KVSDK_OK);
      d.k.push_back(std::move(k));
      d.v.push_back(std::move(v));
      d.pos.push_back(std::move(p));
    }
  }
  d.stats.struct_size = sizeof(d.stats);
  EXPECT_EQ(kvsdk_cache_stats_get(c, &d.stats), KVSDK_OK);
  return d;
}

inline std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

inline void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A fresh directory under $TMPDIR, removed with its files when the object goes away.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kvsdk-test-XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<unsigned char> save_buffer(kvsdk_cache* c, const kvsdk_save_options* o = nullptr) {
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, o, nullptr, 0, &size), KVSDK_OK) << kvsdk_last_error();
  std::vector<unsigned char> buf(size);
  size_t written = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, o, buf.data(), buf.size(), &written), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_EQ(written, size);
  return buf;
}

inline CachePtr load_buffer(kvsdk_context* ctx, const std::vector<unsigned char>& buf,
                            kvsdk_status* status = nullptr, kvsdk_load_info* info = nullptr) {
  kvsdk_cache* c = nullptr;
  const kvsdk_status st =
      kvsdk_cache_load_from_buffer(&c, ctx, buf.data(), buf.size(), nullptr, info);
  if (status) *status = st;
  return CachePtr(c);
}

}  // namespace kvsdk_test
