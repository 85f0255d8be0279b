// Writes container records (formats/container.h) to a sink: the file header, frames (FlatBuffer
// -> zstd frame -> frame header + payload), the footer index and the trailer. Keeps the list of
// frames for the index and the running hash of the records (header, frame headers) for the
// trailer.
//
// Frames are built, compressed and hashed on a thread pool (the context's; nullptr = the calling
// thread alone) and written in the order they were queued, so the bytes are those of a
// single-threaded writer whatever the pool's size: zstd output depends only on the input and the
// parameters, never on which context or thread compressed it. Frames wait in a window of
// 2 per pool thread (1 without a pool): when it is full, its frames are built and compressed in
// parallel (each with its thread slot's FlatBuffer builder and zstd context), then written in
// order and the window reused. Memory beyond the caller's, all kept for reuse until the writer
// goes: per thread, one FlatBuffer (the raw frame: max_frame_bytes plus FlatBuffer overhead)
// and a zstd context; per window entry, one compressed payload (ZSTD_compressBound of the raw
// frame, slightly more than it). So about 3 frames per pool thread (48 MiB at 2 threads and the
// default 8 MiB frames; 2 frames on one thread, as before), never a copy of the snapshot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "container.h"
#include "sink.h"
#include "xxhash64.h"
#include "zstd_frame.h"

namespace kvsdk {
class ThreadPool;
}

namespace kvsdk::format {

struct FrameRecord {
  uint64_t offset;
  uint32_t payload_bytes;
  uint8_t kind;
};

class FrameWriter {
 public:
  // Fills a cleared builder with one finished FlatBuffer (root Frame); returns the frame's flags
  // (container.h: kFrameShuffled when it shuffled its rows, else 0).
  using BuildFn = std::function<uint8_t(flatbuffers::FlatBufferBuilder&)>;

  // `start_offset`: where the sink's first byte lands in the file (journal appends start at the
  // journal end). `pool`: where frames are built and compressed (nullptr: this thread); it must
  // outlive the writer.
  FrameWriter(Sink& sink, uint64_t snapshot_id, int zstd_level, uint64_t start_offset = 0,
              ThreadPool* pool = nullptr);
  ~FrameWriter();
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

  // Writes the file header with the given format version (before any frame); the major picks
  // the hash of every record after it (xxhash64.h: record_hash).
  void write_file_header(uint16_t major = kFormatMajorTyped, uint16_t minor = kFormatMinorTyped);
  // For a writer that continues a file (journal appends) instead of writing its header: the
  // file's format major.
  void continue_format(uint16_t major);
  uint16_t format_major() const { return major_; }
  // Queues a frame of `kind` whose FlatBuffer `build` makes. `build` may run on any pool thread,
  // concurrently with other frames' builds and after this call returns (until the next flush):
  // it may only read what outlives that and nothing that changes meanwhile. `size_hint`: about
  // how large the FlatBuffer will be, so that its builder is allocated once at that size instead
  // of growing (and copying) to it; 0 when unknown.
  void write_frame(FrameKind kind, BuildFn build, size_t size_hint = 0);
  // Queues one finished FlatBuffer (copied when it has to wait for the window) with frame
  // `flags` (container.h; a shuffled frame copied from another file keeps its flag).
  void write_frame(FrameKind kind, const uint8_t* flatbuffer, size_t size, uint8_t flags = 0);
  // Builds, compresses and writes every queued frame.
  void flush();
  // Writes the INDEX frame listing every frame written so far, then the trailer.
  void write_index_and_trailer();

  // The offset after, and the list of, the frames written so far (queued ones count once
  // flushed).
  uint64_t offset() const { return offset_; }
  const std::vector<FrameRecord>& frames() const { return frames_; }

 private:
  struct Pending;
  struct Slot;
  // Writes bytes; `record` bytes (file and frame headers) also enter the trailer's hash.
  void emit(const void* data, size_t size, bool record);
  // Builds, compresses and hashes pending frame `i` on the calling thread.
  void prepare(size_t i);

  Sink& sink_;
  uint64_t id_;
  uint64_t offset_;
  int level_;
  ThreadPool* pool_;
  uint16_t major_ = kFormatMajorPrefix;
  RecordHashStream records_hash_{kFormatMajorPrefix, 0};
  std::vector<FrameRecord> frames_;
  std::vector<std::unique_ptr<Pending>> window_;
  size_t queued_ = 0;
  // Per thread slot of the pool (ThreadPool::current_slot), made on first use.
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace kvsdk::format
