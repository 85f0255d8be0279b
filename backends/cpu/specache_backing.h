// Where SpeCache's off-budget full-precision rows live (SpeCache (docs/papers.md) §3.2: the 16-bit
// cache is kept in CPU memory; on a CPU-only device that can be a file, so the rows do not count
// against RAM). Storage is handed out in fixed-size blocks addressed by index, never by pointer, so
// a file mapping may move when it grows: a pointer from block() is valid until the next
// add_block().
//
// Two implementations: host memory (one heap allocation per block) and a file mapped with mmap
// (POSIX only; elsewhere open_file_backing throws KVSDK_E_UNSUPPORTED). Neither is thread-safe:
// the cache that owns one is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvsdk::cpu {

class BackingArena {
 public:
  explicit BackingArena(size_t block_elems) : block_elems_(block_elems) {}
  virtual ~BackingArena() = default;
  BackingArena(const BackingArena&) = delete;
  BackingArena& operator=(const BackingArena&) = delete;

  // Appends one zero-filled block of block_elems() f16 values and returns its index. Throws
  // kvsdk::Error (KVSDK_E_NO_MEMORY / KVSDK_E_IO) and changes nothing when it cannot.
  // A block released earlier is handed out again (zero-filled) before the arena grows.
  virtual size_t add_block() = 0;
  // Gives block `index` back (kvsdk_cache_truncate: a head that lost its last rows in it); its
  // index is handed out again by a later add_block(). No allocation, no throw: host memory is
  // freed, a file keeps its size (the block is reused in place).
  virtual void release_block(size_t index) noexcept = 0;
  virtual uint16_t* block(size_t index) = 0;
  virtual const uint16_t* block(size_t index) const = 0;
  // Blocks in use (added and not released).
  virtual size_t blocks() const = 0;
  // Where the rows live, for messages and tests: "host memory" or the file's path.
  virtual std::string where() const = 0;

  size_t block_elems() const { return block_elems_; }
  // Bytes the blocks hold (the file may be larger by its growth headroom).
  uint64_t bytes() const { return uint64_t(blocks()) * block_elems_ * 2; }

 private:
  size_t block_elems_;
};

// Blocks on the heap.
std::unique_ptr<BackingArena> make_host_backing(size_t block_elems);
// Blocks in the file `path`, created or truncated (mode 0600), grown with ftruncate and remapped
// (mremap on Linux, munmap + mmap elsewhere); the file is unmapped and closed, but kept, when the
// arena is destroyed. Throws KVSDK_E_IO when the file cannot be created, KVSDK_E_UNSUPPORTED on
// platforms without mmap.
std::unique_ptr<BackingArena> open_file_backing(const std::string& path, size_t block_elems);

}  // namespace kvsdk::cpu
