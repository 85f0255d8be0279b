// Sinks that write snapshot bytes to a file descriptor.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "sink.h"

namespace kvsdk::format {

// Writes all `size` bytes at the descriptor's offset (retrying short writes and EINTR); throws
// KVSDK_E_IO naming `path` otherwise.
void write_all(int fd, const void* data, size_t size, const std::string& path);

// Plain write(2)s through the page cache: journal appends (small, at the end of a file).
class FdSink final : public Sink {
 public:
  FdSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void write(const void* data, size_t size) override;

 private:
  int fd_;
  std::string path_;
};

// A new file of a full save, written past the page cache (O_DIRECT) where the file system allows,
// on a writer thread of its own. Why: the file is fsync-ed at once, so caching its pages buys
// nothing, and allocating hundreds of MiB of fresh page-cache pages for it costs more than the
// disk writes on machines where new pages are expensive (docs/benchmarks.md, "Snapshot save /
// load": a virtual machine's first touch of a page; the same pattern as a phone under memory
// pressure); and direct writes wait on the disk without using the CPU, so they overlap the
// compression of the next frames. Bytes are staged in a ring of kStages aligned buffers of
// kStageBytes: write() fills one while the writer thread writes the full ones in order, and
// blocks only when all are full (24 MiB: about one window of compressed frames of a save on two
// threads, see frame_writer.h, so the disk writes of a window overlap the next one's compression). finish() writes the rest through the page
// cache (O_DIRECT needs block-aligned sizes). Where O_DIRECT is refused (tmpfs, other systems)
// or the buffers cannot be allocated, every write goes straight to write(2) as FdSink's. Without
// `writer_thread` (a context of one thread: the app asked for no other) a full stage is written
// on the calling thread. The file's bytes are the same either way. Not thread-safe (one caller
// thread).
class DirectFileSink final : public Sink {
 public:
  static constexpr size_t kStageBytes = size_t(4) << 20;
  static constexpr int kStages = 6;
  static constexpr size_t kAlign = 4096;  // covers every Linux logical block size

  DirectFileSink(int fd, std::string path, bool writer_thread);
  ~DirectFileSink() override;
  DirectFileSink(const DirectFileSink&) = delete;
  DirectFileSink& operator=(const DirectFileSink&) = delete;

  // Throws KVSDK_E_IO, also for a failed write of an earlier stage.
  void write(const void* data, size_t size) override;
  // Writes what is still staged and waits for the writer; call once, after the last write and
  // before fsync. Throws KVSDK_E_IO.
  void finish();
  // Whether staged writes bypass the page cache (tests; read after finish()).
  bool direct() const { return direct_; }

 private:
  void hand_off();                                     // the full stage to the writer thread
  void writer_loop();
  void write_stage(const unsigned char* p, size_t n);  // n a multiple of kAlign where direct
  void leave_direct_mode();                            // the page cache for the rest of the file
  void stop_writer() noexcept;

  int fd_;
  std::string path_;
  unsigned char* stage_[kStages] = {};
  int filling_ = 0;      // the stage write() copies into
  size_t staged_ = 0;    // its bytes
  bool staging_ = false;  // stages exist (false: plain writes)
  bool direct_ = false;   // O_DIRECT is on: the writer thread's while it runs
  bool threaded_;         // full stages go to a writer thread
  std::thread writer_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int next_ = 0;     // the oldest full stage not yet written
  int pending_ = 0;  // full stages not yet written: next_, next_ + 1, ... (mod kStages)
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace kvsdk::format
