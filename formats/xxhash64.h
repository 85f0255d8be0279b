// The snapshot hashes, from Debian's libxxhash-dev (header-only: xxhash.h with XXH_INLINE_ALL, so
// nothing new is linked into libkvsdk or an app): XXH3-64 for snapshot format 6 and later, XXH64
// (xxHash's older 64-bit variant) for formats 1.0 .. 5.0, which keep verifying with it. kvsdk uses
// them where a checksum must be fast (memory speed; XXH3 several times XXH64's speed on short
// inputs such as rows and record headers, and faster on long ones) and wide (64 bits: a corrupted
// frame or a changed row passes unnoticed with probability 2^-64):
//   - the hash of each frame's compressed bytes and of the frame header (container.h), so a torn
//     or garbled frame is rejected before zstd sees it;
//   - the whole-snapshot hash in the trailer, which binds frame order and the index;
//   - the per-row fingerprints that let journal deltas find which rows changed (journal.h).
// zstd's own content checksum (low 32 bits of XXH64 of the decompressed bytes) additionally
// checks every frame after decompression. record_hash()/RecordHashStream pick the hash by the
// file's format major; row fingerprints (journal.h) and the content hash of a prefix stay XXH64
// where they identify content across formats (see there).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsdk::format {

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

// Streaming form: update() any number of times, digest() gives xxh64 of the concatenation.
uint64_t xxh3_64(const void* data, size_t size, uint64_t seed = 0);

// The first format major whose records (container.h) and journal fingerprints use XXH3-64.
constexpr uint16_t kFirstXxh3Major = 6;

// The record hash of a snapshot of format `major`: XXH3-64 from kFirstXxh3Major, XXH64 before.
inline bool uses_xxh3(uint16_t major) { return major >= kFirstXxh3Major; }
uint64_t record_hash(uint16_t major, const void* data, size_t size, uint64_t seed);

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

// Streaming record_hash: XXH3-64 or XXH64 of the concatenation, by format major.
class RecordHashStream {
 public:
  RecordHashStream(uint16_t major, uint64_t seed);
  ~RecordHashStream();
  RecordHashStream(const RecordHashStream&) = delete;
  RecordHashStream& operator=(const RecordHashStream&) = delete;
  // Restarts for a file of format `major` (the writer learns it with the file header).
  void reset(uint16_t major, uint64_t seed);
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  Xxh64Stream x64_;
  void* x3_ = nullptr;  // XXH3_state_t (64-byte aligned, 576 bytes): made by XXH3_createState
};

}  // namespace kvsdk::format
