#include "zstd_frame.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader (stable in every zstd >= 1.4)
#include <zstd.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "util/error.h"

namespace kvsdk::format {

namespace {

// zstd contexts between snapshots. Creating and initialising a context costs about as much as
// compressing (or decompressing) a small frame with it (measured: 29 against 20 us per 4 KiB
// frame at level 3; 15 against 7 us to decompress), and a small conversation's snapshot is a few
// small frames, so a save or load that made its contexts afresh paid about twice its own work:
// the fixed cost per call that made short conversations cost 2x more per token than long ones
// (issue 18's sweep). Contexts a writer or reader is done with wait here for the next one.
// At most one idle context of each kind per core is kept, none larger than kMaxIdleBytes (a high
// level's workspace is freed, not kept), and release_idle_zstd_contexts() frees them all when
// the last kvsdk context goes (src/core/context.cpp), so an app that is done with kvsdk holds
// nothing.
constexpr size_t kMaxIdleBytes = 8u << 20;

template <class Ctx>
struct IdleList {
  std::mutex mutex;
  std::vector<Ctx*> idle;

  Ctx* take() {
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.empty()) return nullptr;
    Ctx* c = idle.back();
    idle.pop_back();
    return c;
  }
  // Keeps `c` if there is room, else returns false (the caller frees it).
  bool keep(Ctx* c, size_t bytes) {
    if (bytes > kMaxIdleBytes) return false;
    // Asked once: glibc reads /sys for it, which costs more than a small frame.
    static const size_t cap = std::max<size_t>(2, std::thread::hardware_concurrency());
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.size() >= cap) return false;
    idle.push_back(c);
    return true;
  }
  std::vector<Ctx*> drain() {
    std::lock_guard<std::mutex> lock(mutex);
    return std::move(idle);
  }
};

IdleList<ZSTD_CCtx>& idle_compressors() {
  static IdleList<ZSTD_CCtx>* list = new IdleList<ZSTD_CCtx>;  // never destroyed: usable at exit
  return *list;
}
IdleList<ZSTD_DCtx>& idle_decompressors() {
  static IdleList<ZSTD_DCtx>* list = new IdleList<ZSTD_DCtx>;
  return *list;
}

}  // namespace

void release_idle_zstd_contexts() {
  for (ZSTD_CCtx* c : idle_compressors().drain()) ZSTD_freeCCtx(c);
  for (ZSTD_DCtx* d : idle_decompressors().drain()) ZSTD_freeDCtx(d);
}

ZstdCompressor::ZstdCompressor(int level) : cctx_(idle_compressors().take()) {
  if (cctx_) {
    // Back to zstd's defaults (the workspace stays allocated), then this writer's parameters.
    ZSTD_CCtx_reset(cctx_, ZSTD_reset_session_and_parameters);
  } else {
    cctx_ = ZSTD_createCCtx();
    if (!cctx_) throw std::bad_alloc();
  }
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
}

ZstdCompressor::~ZstdCompressor() {
  if (!idle_compressors().keep(cctx_, ZSTD_sizeof_CCtx(cctx_))) ZSTD_freeCCtx(cctx_);
}

void ZstdCompressor::compress(const void* src, size_t size, std::vector<unsigned char>& out) {
  out.resize(ZSTD_compressBound(size));
  const size_t n = ZSTD_compress2(cctx_, out.data(), out.size(), src, size);
  if (ZSTD_isError(n)) {
    fail(KVSDK_E_INTERNAL, "zstd compression failed: ", ZSTD_getErrorName(n));
  }
  out.resize(n);
}

ZstdDecompressor::ZstdDecompressor() : dctx_(idle_decompressors().take()) {
  if (dctx_) {
    ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_and_parameters);
  } else {
    dctx_ = ZSTD_createDCtx();
    if (!dctx_) throw std::bad_alloc();
  }
}

ZstdDecompressor::~ZstdDecompressor() {
  if (!idle_decompressors().keep(dctx_, ZSTD_sizeof_DCtx(dctx_))) ZSTD_freeDCtx(dctx_);
}

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
