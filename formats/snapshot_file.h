// Snapshot files: atomic full saves, read-only mapping for loads, and journal appends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "journal.h"
#include "sink.h"

namespace kvsdk::format {

// Writes `path` atomically: `write` fills a temporary file in the same directory, which is then
// fsync-ed and renamed over `path`, and the directory is fsync-ed. On any failure the temporary
// file is removed and `path` is untouched. Throws KVSDK_E_IO.
void save_file_atomically(const std::string& path, const std::function<void(Sink&)>& write);

// A whole file mapped read-only (or read into memory where mapping is not possible).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws KVSDK_E_IO
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;
  std::vector<unsigned char> copy_;
};

// Appends already-built frames (FlatBuffers) of one journal delta to `path`, which must be the
// file `base` describes: throws KVSDK_E_STATE otherwise, KVSDK_E_IO on I/O errors. What an
// interrupted earlier append left past base.journal_end (a torn frame, the sound frames of a
// delta whose last frame is missing: what a load drops) is cut off first; sound frames a load
// would not drop that way (a complete delta, frames out of sequence) mean another writer, and
// KVSDK_E_STATE. Holds an exclusive flock on `path` meanwhile; KVSDK_E_STATE when another
// append holds it. Returns the new journal end.
uint64_t append_journal(const std::string& path, const JournalBase& base,
                        const std::vector<std::vector<uint8_t>>& parts, int zstd_level);

}  // namespace kvsdk::format
