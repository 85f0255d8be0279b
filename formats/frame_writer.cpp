#include "frame_writer.h"

#include "kvsdk_generated.h"

namespace kvsdk::format {

FrameWriter::FrameWriter(Sink& sink, uint64_t snapshot_id, int zstd_level, uint64_t start_offset)
    : sink_(sink), id_(snapshot_id), offset_(start_offset), zstd_(zstd_level) {}

void FrameWriter::emit(const void* data, size_t size, bool record) {
  sink_.write(data, size);
  if (record) records_hash_.update(data, size);
  offset_ += size;
}

void FrameWriter::write_file_header(uint16_t major, uint16_t minor) {
  FileHeader h;
  h.major = major;
  h.minor = minor;
  h.snapshot_id = id_;
  unsigned char buf[kFileHeaderBytes];
  encode_file_header(h, buf);
  emit(buf, sizeof buf, true);
}

void FrameWriter::write_frame(FrameKind kind, const uint8_t* flatbuffer, size_t size) {
  if (size == 0 || size > kMaxRawFrameBytes) {
    fail(KVSDK_E_INTERNAL, "frame of ", size, " bytes is outside the format's limits");
  }
  zstd_.compress(flatbuffer, size, scratch_);
  if (scratch_.size() > UINT32_MAX) fail(KVSDK_E_INTERNAL, "compressed frame too large");
  FrameHeader h;
  h.kind = uint8_t(kind);
  h.payload_bytes = uint32_t(scratch_.size());
  h.raw_bytes = uint32_t(size);
  h.payload_hash = xxh64(scratch_.data(), scratch_.size(), id_);
  unsigned char hdr[kFrameHeaderBytes];
  encode_frame_header(h, id_, hdr);
  frames_.push_back({offset_, h.payload_bytes, h.kind});
  emit(hdr, sizeof hdr, true);
  emit(scratch_.data(), scratch_.size(), false);
}

void FrameWriter::write_index_and_trailer() {
  flatbuffers::FlatBufferBuilder fbb(64 + frames_.size() * sizeof(fb::FrameRef));
  std::vector<fb::FrameRef> refs;
  refs.reserve(frames_.size());
  for (const FrameRecord& f : frames_) refs.emplace_back(f.offset, f.payload_bytes, f.kind);
  const auto index = fb::CreateIndex(fbb, fbb.CreateVectorOfStructs(refs));
  fbb.Finish(fb::CreateFrame(fbb, fb::Payload::Index, index.Union()), fb::FrameIdentifier());
  Trailer t;
  t.index_offset = offset_;
  write_frame(FrameKind::kIndex, fbb.GetBufferPointer(), fbb.GetSize());
  t.records_hash = records_hash_.digest();
  unsigned char buf[kTrailerBytes];
  encode_trailer(t, id_, buf);
  emit(buf, sizeof buf, false);
}

}  // namespace kvsdk::format
