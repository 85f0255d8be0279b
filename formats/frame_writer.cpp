#include "frame_writer.h"

#include <algorithm>

#include "kvsdk_generated.h"
#include "util/thread_pool.h"

namespace kvsdk::format {

// A queued frame and its reusable buffers (capacity kept from frame to frame).
struct FrameWriter::Pending {
  FrameKind kind = FrameKind::kMetadata;
  BuildFn build;  // empty: the FlatBuffer is [data, data + size) (the caller's, or `copy`)
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::vector<uint8_t> copy;
  size_t size_hint = 0;
  std::vector<unsigned char> payload;  // the zstd frame, kept until it is written
  uint32_t raw_bytes = 0;
  uint64_t hash = 0;
  uint8_t flags = 0;  // what `build` returned
};

// What a thread slot builds and compresses frames with: the FlatBuffer is only needed until its
// frame is compressed, so one builder per thread serves every frame the thread takes.
struct FrameWriter::Slot {
  explicit Slot(int level) : zstd(level) {}
  ZstdCompressor zstd;
  flatbuffers::FlatBufferBuilder fbb{1024};
  size_t fbb_capacity = 1024;  // at least: its initial size, the largest buffer it built
};

FrameWriter::FrameWriter(Sink& sink, uint64_t snapshot_id, int zstd_level, uint64_t start_offset,
                         ThreadPool* pool)
    : sink_(sink), id_(snapshot_id), offset_(start_offset), level_(zstd_level), pool_(pool) {
  const size_t threads = pool ? pool->size() : 1;
  // 2 frames per thread: a batch of unequal frames (a layer's last, shorter chunk; small tier
  // records) keeps every thread busy until the batch's tail.
  window_.resize(threads > 1 ? 2 * threads : 1);
  slots_.resize(threads);
}

FrameWriter::~FrameWriter() = default;

void FrameWriter::emit(const void* data, size_t size, bool record) {
  sink_.write(data, size);
  if (record) records_hash_.update(data, size);
  offset_ += size;
}

void FrameWriter::continue_format(uint16_t major) {
  major_ = major;
  records_hash_.reset(major, 0);
}

void FrameWriter::write_file_header(uint16_t major, uint16_t minor) {
  continue_format(major);
  FileHeader h;
  h.major = major;
  h.minor = minor;
  h.snapshot_id = id_;
  unsigned char buf[kFileHeaderBytes];
  encode_file_header(h, buf);
  emit(buf, sizeof buf, true);
}

void FrameWriter::write_frame(FrameKind kind, BuildFn build, size_t size_hint) {
  std::unique_ptr<Pending>& p = window_[queued_];
  if (!p) p = std::make_unique<Pending>();
  p->kind = kind;
  p->build = std::move(build);
  p->size_hint = size_hint;
  if (++queued_ == window_.size()) flush();
}

void FrameWriter::write_frame(FrameKind kind, const uint8_t* flatbuffer, size_t size,
                              uint8_t flags) {
  std::unique_ptr<Pending>& p = window_[queued_];
  if (!p) p = std::make_unique<Pending>();
  p->kind = kind;
  p->build = nullptr;
  p->flags = flags;
  if (window_.size() == 1) {
    // Compressed before this call returns: the caller's bytes need no copy.
    p->data = flatbuffer;
  } else {
    p->copy.assign(flatbuffer, flatbuffer + size);
    p->data = p->copy.data();
  }
  p->size = size;
  if (++queued_ == window_.size()) flush();
}

void FrameWriter::prepare(size_t i) {
  Pending& p = *window_[i];
  const size_t slot_index = ThreadPool::current_slot();
  if (slot_index >= slots_.size()) {
    fail(KVSDK_E_INTERNAL, "frame compressed on thread slot ", slot_index,
         " of a writer set up for ", slots_.size());
  }
  std::unique_ptr<Slot>& slot = slots_[slot_index];
  if (!slot) slot = std::make_unique<Slot>(level_);
  const uint8_t* data;
  size_t size;
  if (p.build) {
    if (p.size_hint > slot->fbb_capacity) {
      // A builder that allocates the frame's size at once (on first use) replaces a smaller one.
      slot->fbb = flatbuffers::FlatBufferBuilder(p.size_hint);
      slot->fbb_capacity = p.size_hint;
    }
    slot->fbb.Clear();
    p.flags = p.build(slot->fbb);
    p.build = nullptr;  // releases what the closure holds
    data = slot->fbb.GetBufferPointer();
    size = slot->fbb.GetSize();
    slot->fbb_capacity = std::max(slot->fbb_capacity, size);
  } else {
    data = p.data;
    size = p.size;
  }
  if (size == 0 || size > kMaxRawFrameBytes) {
    fail(KVSDK_E_INTERNAL, "frame of ", size, " bytes is outside the format's limits");
  }
  slot->zstd.compress(data, size, p.payload);
  if (p.payload.size() > UINT32_MAX) fail(KVSDK_E_INTERNAL, "compressed frame too large");
  p.raw_bytes = uint32_t(size);
  p.hash = record_hash(major_, p.payload.data(), p.payload.size(), id_);
}

void FrameWriter::flush() {
  const size_t n = queued_;
  if (n == 0) return;
  queued_ = 0;  // a failed flush leaves nothing queued (the save fails as a whole)
  if (pool_ && n > 1) {
    pool_->run(n, [this](size_t i) { prepare(i); });
  } else {
    for (size_t i = 0; i < n; ++i) prepare(i);
  }
  for (size_t i = 0; i < n; ++i) {
    Pending& p = *window_[i];
    FrameHeader h;
    h.kind = uint8_t(p.kind);
    h.flags = p.flags;
    h.payload_bytes = uint32_t(p.payload.size());
    h.raw_bytes = p.raw_bytes;
    h.payload_hash = p.hash;
    unsigned char hdr[kFrameHeaderBytes];
    encode_frame_header(h, id_, hdr, major_);
    frames_.push_back({offset_, h.payload_bytes, h.kind});
    emit(hdr, sizeof hdr, true);
    emit(p.payload.data(), p.payload.size(), false);
  }
}

void FrameWriter::write_index_and_trailer() {
  flush();
  flatbuffers::FlatBufferBuilder fbb(64 + frames_.size() * sizeof(fb::FrameRef));
  std::vector<fb::FrameRef> refs;
  refs.reserve(frames_.size());
  for (const FrameRecord& f : frames_) refs.emplace_back(f.offset, f.payload_bytes, f.kind);
  const auto index = fb::CreateIndex(fbb, fbb.CreateVectorOfStructs(refs));
  fbb.Finish(fb::CreateFrame(fbb, fb::Payload::Index, index.Union()), fb::FrameIdentifier());
  Trailer t;
  t.index_offset = offset_;
  write_frame(FrameKind::kIndex, fbb.GetBufferPointer(), fbb.GetSize());
  flush();
  t.records_hash = records_hash_.digest();
  unsigned char buf[kTrailerBytes];
  encode_trailer(t, id_, buf, major_);
  emit(buf, sizeof buf, false);
}

}  // namespace kvsdk::format
