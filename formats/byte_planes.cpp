#include "byte_planes.h"

#include <zstd.h>

#include <algorithm>
#include <new>
#include <vector>

namespace kvsdk::format {

void shuffle_f16(const uint16_t* src, size_t n, unsigned char* dst) {
  unsigned char* lo = dst;
  unsigned char* hi = dst + n;
  for (size_t i = 0; i < n; ++i) {
    lo[i] = uint8_t(src[i]);
    hi[i] = uint8_t(src[i] >> 8);
  }
}

bool shuffle_pays(const uint16_t* k, const uint16_t* v, size_t n, int level) {
  struct Probe {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    std::vector<unsigned char> planes, out;
    ~Probe() { ZSTD_freeCCtx(cctx); }
  };
  thread_local Probe probe;  // per thread: frames are built on pool threads concurrently
  if (!probe.cctx) throw std::bad_alloc();
  const size_t m = std::min(n, kShuffleSampleValues);
  if (m == 0) return false;
  probe.out.resize(ZSTD_compressBound(2 * m));
  const auto size = [&](const void* src, size_t bytes) {
    const size_t r = ZSTD_compressCCtx(probe.cctx, probe.out.data(), probe.out.size(), src, bytes,
                                       level);
    return ZSTD_isError(r) ? bytes : r;
  };
  // Each plane alone: in a frame, a plane of a span of 1024 rows or more fills zstd blocks
  // (128 KiB) of its own, each with its own literal statistics (Huffman table), which is where
  // shuffling gains; a sample of both planes in one block would share one table and show no gain.
  probe.planes.resize(2 * m);
  size_t plain = 0, planes = 0;
  for (const uint16_t* x : {k, v}) {
    plain += size(x, 2 * m);
    shuffle_f16(x, m, probe.planes.data());
    planes += size(probe.planes.data(), m) + size(probe.planes.data() + m, m);
  }
  return planes < plain;
}

}  // namespace kvsdk::format
