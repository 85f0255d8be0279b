#include "container.h"

#include <cstring>

#include "util/error.h"
#include "xxhash64.h"

namespace kvsdk::format {

namespace {

void put16(unsigned char* p, uint16_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
}
void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint16_t get16(const unsigned char* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* frame_kind_name(uint8_t kind) {
  switch (FrameKind(kind)) {
    case FrameKind::kMetadata: return "metadata";
    case FrameKind::kTierChunk: return "tier_chunk";
    case FrameKind::kIndex: return "index";
    case FrameKind::kJournal: return "journal";
  }
  return "unknown";
}

// File header: magic[8] major u16 minor u16 header_bytes u32 snapshot_id u64 hash u64.
void encode_file_header(const FileHeader& h, unsigned char* out) {
  std::memset(out, 0, kFileHeaderBytes);
  std::memcpy(out, kFileMagic, 8);
  put16(out + 8, h.major);
  put16(out + 10, h.minor);
  put32(out + 12, uint32_t(kFileHeaderBytes));
  put64(out + 16, h.snapshot_id);
  put64(out + 24, record_hash(h.major, out, 24, h.snapshot_id));
}

FileHeader decode_file_header(const unsigned char* in) {
  if (std::memcmp(in, kFileMagic, 8) != 0) {
    fail(KVSDK_E_CORRUPT, "not a kvsdk snapshot (bad magic)");
  }
  FileHeader h;
  h.major = get16(in + 8);
  h.minor = get16(in + 10);
  if (h.major > kFormatMajor) {
    fail(KVSDK_E_VERSION, "snapshot format ", h.major, ".", h.minor,
         " is newer than this library reads (", kFormatMajor, ".x); upgrade kvsdk");
  }
  if (h.major < 1) fail(KVSDK_E_CORRUPT, "snapshot format major version 0 does not exist");
  h.snapshot_id = get64(in + 16);
  if (get32(in + 12) != kFileHeaderBytes ||
      get64(in + 24) != record_hash(h.major, in, 24, h.snapshot_id)) {
    fail(KVSDK_E_CORRUPT, "snapshot header checksum mismatch");
  }
  return h;
}

// Frame header: magic[4] kind u8 flags u8 reserved u16 payload u32 raw u32 payload_hash u64
// header_hash u64.
// A frame's flags are sound for its kind and the file's format.
static bool flags_valid(uint8_t flags, uint8_t kind, uint16_t major) {
  if (flags == 0) return true;
  return major >= 6 && flags == kFrameShuffled && kind == uint8_t(FrameKind::kTierChunk);
}

void encode_frame_header(const FrameHeader& h, uint64_t snapshot_id, unsigned char* out,
                         uint16_t major) {
  if (!flags_valid(h.flags, h.kind, major)) {
    fail(KVSDK_E_INTERNAL, "frame flags ", int(h.flags), " on a ", frame_kind_name(h.kind),
         " frame of a format ", major, " file");
  }
  std::memset(out, 0, kFrameHeaderBytes);
  std::memcpy(out, kFrameMagic, 4);
  out[4] = h.kind;
  out[5] = h.flags;
  put32(out + 8, h.payload_bytes);
  put32(out + 12, h.raw_bytes);
  put64(out + 16, h.payload_hash);
  put64(out + 24, record_hash(major, out, 24, snapshot_id));
}

bool decode_frame_header(const unsigned char* in, uint64_t snapshot_id, FrameHeader* out,
                         uint16_t major) {
  if (std::memcmp(in, kFrameMagic, 4) != 0) return false;
  if (get64(in + 24) != record_hash(major, in, 24, snapshot_id)) return false;
  if (get16(in + 6) != 0) return false;  // reserved
  FrameHeader h;
  h.kind = in[4];
  h.flags = in[5];
  if (!flags_valid(h.flags, h.kind, major)) return false;
  h.payload_bytes = get32(in + 8);
  h.raw_bytes = get32(in + 12);
  h.payload_hash = get64(in + 16);
  if (h.kind < uint8_t(FrameKind::kMetadata) || h.kind > uint8_t(FrameKind::kJournal)) return false;
  if (h.raw_bytes == 0 || h.raw_bytes > kMaxRawFrameBytes || h.payload_bytes == 0) return false;
  *out = h;
  return true;
}

// Trailer: magic[8] index_offset u64 records_hash u64 trailer_hash u64.
void encode_trailer(const Trailer& t, uint64_t snapshot_id, unsigned char* out, uint16_t major) {
  std::memcpy(out, kTrailerMagic, 8);
  put64(out + 8, t.index_offset);
  put64(out + 16, t.records_hash);
  put64(out + 24, record_hash(major, out, 24, snapshot_id));
}

Trailer decode_trailer(const unsigned char* in, uint64_t snapshot_id, uint16_t major) {
  if (std::memcmp(in, kTrailerMagic, 8) != 0 ||
      get64(in + 24) != record_hash(major, in, 24, snapshot_id)) {
    fail(KVSDK_E_CORRUPT, "snapshot trailer is missing or damaged");
  }
  Trailer t;
  t.index_offset = get64(in + 8);
  t.records_hash = get64(in + 16);
  return t;
}

}  // namespace kvsdk::format
