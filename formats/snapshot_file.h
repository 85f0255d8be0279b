// Snapshot files: atomic full saves, read-only mapping for loads, and journal appends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "journal.h"
#include "sink.h"

namespace kvsdk {
class ThreadPool;
}

namespace kvsdk::format {

// Writes `path` atomically: `write` fills a temporary file in the same directory, which is then
// fsync-ed and renamed over `path`, and the directory is fsync-ed. On any failure the temporary
// file is removed and `path` is untouched. Throws KVSDK_E_IO.
//
// The temporary file is unnamed where the system allows (Linux O_TMPFILE, linked via
// /proc/self/fd): a process killed while writing it leaves nothing behind. It is named
// `path`.tmp-XXXXXX only for the instant between linking and renaming, or, elsewhere, for the
// whole write (mkstemp). Its writer holds an exclusive flock on it while it has that name, and
// each save first removes the `path`.tmp-XXXXXX files of this user that nobody holds a lock on
// (orphans of killed writers); a save in progress in another process keeps its file. `write`
// runs once, or a second time (into a named file) if an unnamed file cannot be linked.
// The bytes go through a DirectFileSink (file_sink.h); `writer_thread`: its disk writes run on a
// thread of its own (saves on a context with a pool of 2+ threads), else on the calling thread.
void save_file_atomically(const std::string& path, const std::function<void(Sink&)>& write,
                          bool writer_thread = false);

// Tests: false makes save_file_atomically use the named temporary file, as on systems without
// O_TMPFILE. Process-wide; true by default.
void set_unnamed_temp_files(bool allowed);

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
// append holds it. `pool`: where the frames are compressed and hashed (FrameWriter; nullptr: this
// thread). Returns the new journal end.
uint64_t append_journal(const std::string& path, const JournalBase& base,
                        const std::vector<std::vector<uint8_t>>& parts, int zstd_level,
                        ThreadPool* pool = nullptr);

}  // namespace kvsdk::format
