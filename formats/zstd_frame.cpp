#include "zstd_frame.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader (stable in every zstd >= 1.4)
#include <zstd.h>

#include <algorithm>
#include <memory>
#include <new>
#include <vector>

#include "util/error.h"

namespace kvsdk::format {

ZstdCompressor::ZstdCompressor(int level) : cctx_(ZSTD_createCCtx()) {
  if (!cctx_) throw std::bad_alloc();
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
}

ZstdCompressor::~ZstdCompressor() { ZSTD_freeCCtx(cctx_); }

void ZstdCompressor::compress(const void* src, size_t size, std::vector<unsigned char>& out) {
  out.resize(ZSTD_compressBound(size));
  const size_t n = ZSTD_compress2(cctx_, out.data(), out.size(), src, size);
  if (ZSTD_isError(n)) {
    fail(KVSDK_E_INTERNAL, "zstd compression failed: ", ZSTD_getErrorName(n));
  }
  out.resize(n);
}

ZstdDecompressor::ZstdDecompressor() : dctx_(ZSTD_createDCtx()) {
  if (!dctx_) throw std::bad_alloc();
}

ZstdDecompressor::~ZstdDecompressor() { ZSTD_freeDCtx(dctx_); }

void ZstdDecompressor::decompress(const void* src, size_t size, size_t raw_bytes,
                                  std::vector<unsigned char>& out) {
  ZSTD_frameHeader fh;
  if (ZSTD_getFrameHeader(&fh, src, size) != 0 || fh.frameType != ZSTD_frame) {
    fail(KVSDK_E_CORRUPT, "frame payload is not a zstd frame");
  }
  if (fh.frameContentSize != raw_bytes) {
    fail(KVSDK_E_CORRUPT, "zstd frame holds ", fh.frameContentSize, " bytes, header says ",
         raw_bytes);
  }
  if (!fh.checksumFlag) fail(KVSDK_E_CORRUPT, "zstd frame has no content checksum");
  if (ZSTD_findFrameCompressedSize(src, size) != size) {
    fail(KVSDK_E_CORRUPT, "frame payload is not exactly one zstd frame");
  }
  out.resize(raw_bytes);
  const size_t n = ZSTD_decompressDCtx(dctx_, out.data(), out.size(), src, size);
  if (ZSTD_isError(n) || n != raw_bytes) {
    fail(KVSDK_E_CORRUPT, "zstd frame does not decompress: ",
         ZSTD_isError(n) ? ZSTD_getErrorName(n) : "size mismatch");
  }
}

void shuffle_f16(const uint16_t* src, size_t n, unsigned char* dst) {
  unsigned char* lo = dst;
  unsigned char* hi = dst + n;
  for (size_t i = 0; i < n; ++i) {
    lo[i] = uint8_t(src[i]);
    hi[i] = uint8_t(src[i] >> 8);
  }
}

void append_unshuffled(const unsigned char* lo, const unsigned char* hi, size_t n,
                       std::vector<uint16_t>& dst) {
  // Through a small buffer that stays in L1: resizing `dst` first would zero it, a second pass.
  constexpr size_t kChunk = 4096;
  uint16_t buf[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    for (size_t j = 0; j < m; ++j) buf[j] = uint16_t(lo[i + j] | (unsigned(hi[i + j]) << 8));
    dst.insert(dst.end(), buf, buf + m);
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
