// Writes container records (formats/container.h) to a sink: the file header, frames (FlatBuffer
// -> zstd frame -> frame header + payload), the footer index and the trailer. Keeps the list of
// frames for the index and the running hash of the records (header, frame headers) for the
// trailer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "container.h"
#include "sink.h"
#include "xxhash64.h"
#include "zstd_frame.h"

namespace kvsdk::format {

struct FrameRecord {
  uint64_t offset;
  uint32_t payload_bytes;
  uint8_t kind;
};

class FrameWriter {
 public:
  // `start_offset`: where the sink's first byte lands in the file (journal appends start at the
  // journal end).
  FrameWriter(Sink& sink, uint64_t snapshot_id, int zstd_level, uint64_t start_offset = 0);

  // Writes the file header with the given format version.
  void write_file_header(uint16_t major = kFormatMajorTyped, uint16_t minor = kFormatMinorTyped);
  // Compresses one finished FlatBuffer and writes it as a frame of `kind`.
  void write_frame(FrameKind kind, const uint8_t* flatbuffer, size_t size);
  // Writes the INDEX frame listing every frame written so far, then the trailer.
  void write_index_and_trailer();

  uint64_t offset() const { return offset_; }
  const std::vector<FrameRecord>& frames() const { return frames_; }

 private:
  // Writes bytes; `record` bytes (file and frame headers) also enter the trailer's hash.
  void emit(const void* data, size_t size, bool record);

  Sink& sink_;
  uint64_t id_;
  uint64_t offset_;
  ZstdCompressor zstd_;
  Xxh64Stream records_hash_;
  std::vector<FrameRecord> frames_;
  std::vector<unsigned char> scratch_;
};

}  // namespace kvsdk::format
