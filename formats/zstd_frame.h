// zstd framing of one frame payload: compression with the content checksum on, and
// decompression that trusts nothing (single frame, declared sizes match, checksum present).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace kvsdk::format {

// Both classes take their zstd context from an idle list kept between snapshots and give it
// back when they go (zstd_frame.cpp says why and how much is kept).
class ZstdCompressor {
 public:
  explicit ZstdCompressor(int level);
  ~ZstdCompressor();
  ZstdCompressor(const ZstdCompressor&) = delete;
  ZstdCompressor& operator=(const ZstdCompressor&) = delete;
  // Replaces `out` with one zstd frame (content size and checksum recorded) holding `src`.
  void compress(const void* src, size_t size, std::vector<unsigned char>& out);

 private:
  ZSTD_CCtx_s* cctx_;
};

class ZstdDecompressor {
 public:
  ZstdDecompressor();
  ~ZstdDecompressor();
  ZstdDecompressor(const ZstdDecompressor&) = delete;
  ZstdDecompressor& operator=(const ZstdDecompressor&) = delete;
  // Decompresses exactly one zstd frame of `size` bytes that must hold `raw_bytes` bytes and
  // carry a content checksum; throws KVSDK_E_CORRUPT otherwise. `out` is resized to raw_bytes.
  void decompress(const void* src, size_t size, size_t raw_bytes, std::vector<unsigned char>& out);

 private:
  ZSTD_DCtx_s* dctx_;
};

// Frees the zstd contexts kept for reuse. Called when the last kvsdk context is destroyed;
// thread-safe, and a writer or reader still running keeps its own context.
void release_idle_zstd_contexts();

// Levels kvsdk accepts (zstd's own range, clamped to what is useful for snapshots).
constexpr int kMinZstdLevel = -7;
constexpr int kMaxZstdLevel = 19;
constexpr int kDefaultZstdLevel = 1;  // measured: include/kvsdk.h, zstd_level

}  // namespace kvsdk::format
