// zstd framing of one frame payload: compression with the content checksum on, and
// decompression that trusts nothing (single frame, declared sizes match, checksum present).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace kvsdk::format {

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

// Byte planes of f16 values (format 6's shuffled frames, container.h): `shuffle_f16` writes the
// low bytes of src[0..n) to dst[0..n) and their high bytes to dst[n..2n); `append_unshuffled`
// appends to `dst` the n values whose low bytes are lo[0..n) and high bytes hi[0..n). Each is one
// pass that replaces the plain copy of the rows into or out of a frame.
void shuffle_f16(const uint16_t* src, size_t n, unsigned char* dst);
void append_unshuffled(const unsigned char* lo, const unsigned char* hi, size_t n,
                       std::vector<uint16_t>& dst);

// Whether byte planes of these f16 rows compress smaller than the rows as they are, at zstd
// `level`: compresses a sample (the first kShuffleSampleValues values of `k` and of `v`: 32 KiB)
// both ways, each plane alone, on a compression context of the calling thread: 64 KiB of input
// per frame, 0.8% of a default 8 MiB frame, against 100% for compressing the whole frame both
// ways; the rows of one frame come from one layer (frames never mix layers)
// whose values have one distribution, so the sample predicts the frame.
constexpr size_t kShuffleSampleValues = 8192;
bool shuffle_pays(const uint16_t* k, const uint16_t* v, size_t n, int level);

// Levels kvsdk accepts (zstd's own range, clamped to what is useful for snapshots).
constexpr int kMinZstdLevel = -7;
constexpr int kMaxZstdLevel = 19;
constexpr int kDefaultZstdLevel = 1;  // measured: include/kvsdk.h, zstd_level

}  // namespace kvsdk::format
