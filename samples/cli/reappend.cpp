#include "reappend.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kvsdk_cli {

namespace {

size_t dtype_bytes(int32_t dtype) { return dtype == KVSDK_DTYPE_F32 ? 4 : 2; }

// Rows appended per call: bounds the scratch memory and lets the policy compress as it goes.
constexpr size_t kChunkTokens = 256;

}  // namespace

kvsdk_status reappend(const kvsdk_cache* src, kvsdk_cache* dst, const char** detail) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  kvsdk_status st = kvsdk_cache_geometry(src, &g);
  if (st != KVSDK_OK) return st;
  const size_t esz = dtype_bytes(g.dtype), dim = g.head_dim, heads = g.n_kv_heads;
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    size_t n = 0;
    st = kvsdk_cache_read(src, layer, 0, nullptr, nullptr, nullptr, 0, &n);
    if (st != KVSDK_OK) return st;
    // Head-major rows as read, then checked to share one position list.
    std::vector<unsigned char> k(heads * n * dim * esz), v(heads * n * dim * esz);
    std::vector<int32_t> pos(heads * n);
    for (uint32_t h = 0; h < heads; ++h) {
      size_t got = 0;
      st = kvsdk_cache_read(src, layer, h, k.data() + h * n * dim * esz,
                            v.data() + h * n * dim * esz, pos.data() + h * n, n, &got);
      if (st != KVSDK_OK) return st;
      if (got != n || !std::equal(pos.begin(), pos.begin() + n, pos.begin() + h * n)) {
        *detail = "the source cache was evicted per KV head; its rows cannot be re-appended";
        return KVSDK_E_UNSUPPORTED;
      }
    }
    // Token-major chunks, as append expects: [token][kv head][dim].
    const size_t row = dim * esz;
    std::vector<unsigned char> kc(kChunkTokens * heads * row), vc(kChunkTokens * heads * row);
    for (size_t t0 = 0; t0 < n; t0 += kChunkTokens) {
      const size_t m = std::min(kChunkTokens, n - t0);
      for (size_t t = 0; t < m; ++t) {
        for (size_t h = 0; h < heads; ++h) {
          const size_t from = (h * n + t0 + t) * row, to = (t * heads + h) * row;
          std::memcpy(kc.data() + to, k.data() + from, row);
          std::memcpy(vc.data() + to, v.data() + from, row);
        }
      }
      st = kvsdk_cache_append(dst, layer, m, kc.data(), vc.data(), pos.data() + t0,
                              m * heads * row);
      if (st != KVSDK_OK) return st;
    }
  }
  return KVSDK_OK;
}

}  // namespace kvsdk_cli
