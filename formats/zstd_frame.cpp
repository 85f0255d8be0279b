#include "zstd_frame.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader (stable in every zstd >= 1.4)
#include <zstd.h>

#include <new>

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

}  // namespace kvsdk::format
