// XXH64 (xxHash's 64-bit variant), from Debian's libxxhash-dev (header-only: xxhash.h with
// XXH_INLINE_ALL, so nothing new is linked into libkvsdk or an app). kvsdk uses it where a
// checksum must be fast (it runs at memory speed) and wide (64 bits: a corrupted frame or a
// changed row passes unnoticed with probability 2^-64):
//   - the hash of each frame's compressed bytes and of the frame header (container.h), so a torn
//     or garbled frame is rejected before zstd sees it;
//   - the whole-snapshot hash in the trailer, which binds frame order and the index;
//   - the per-row fingerprints that let journal deltas find which rows changed (journal.h).
// zstd's own content checksum (low 32 bits of XXH64 of the decompressed bytes) additionally
// checks every frame after decompression. Every snapshot format so far (1.0 .. 5.0) uses XXH64,
// so this stays the hash that verifies them.
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
  // XXH64_state_t (a plain struct of 88 bytes in xxHash 0.8), kept out of this header because
  // xxhash.h in inline mode defines many macros; xxhash64.cpp checks the size.
  alignas(8) unsigned char state_[96];
};

}  // namespace kvsdk::format
