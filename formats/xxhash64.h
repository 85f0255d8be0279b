// XXH64 (Yann Collet's xxHash, 64-bit variant), written from the published algorithm
// description. kvsdk uses it where a checksum must be fast (it runs at memory speed) and wide
// (64 bits: a corrupted frame or a changed row passes unnoticed with probability 2^-64):
//   - the hash of each frame's compressed bytes and of the frame header (container.h), so a torn
//     or garbled frame is rejected before zstd sees it;
//   - the whole-snapshot hash in the trailer, which binds frame order and the index;
//   - the per-row fingerprints that let journal deltas find which rows changed (journal.h).
// zstd's own content checksum (low 32 bits of XXH64 of the decompressed bytes) additionally
// checks every frame after decompression; its xxhash copy is not public API, hence this file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsdk::format {

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

// Streaming form: update() any number of times, digest() gives xxh64 of the concatenation.
class Xxh64Stream {
 public:
  explicit Xxh64Stream(uint64_t seed = 0);
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

}  // namespace kvsdk::format
