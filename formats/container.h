// The snapshot container: the fixed-size binary records around the FlatBuffer frames.
//
//   FileHeader (32 bytes)   magic "KVSDKSNP", format major/minor, snapshot id, header hash
//   Frame*                  FrameHeader (32 bytes) + zstd frame of one FlatBuffer (kvsdk.fbs):
//                             one METADATA frame, then TIER_CHUNK frames (rows of every layer)
//   Frame (INDEX)           footer index: offset, size and kind of every frame above
//   Trailer (32 bytes)      magic "KVSDKEND", index offset, hash of all records before it
//   Frame* (JOURNAL)        deltas appended later by kvsdk_cache_save_delta
//
// All integers are little-endian. Header, frame header and trailer end with a hash of their other
// bytes seeded with the snapshot id (XXH64 up to format 5, XXH3-64 from 6: xxhash64.h), so a record
// copied from another snapshot (e.g. a stale journal frame) does not verify. The payload hash in
// each FrameHeader lets a reader reject a garbled or torn frame before decompressing it; zstd's
// content checksum then checks the decompressed FlatBuffer. The trailer's hash covers the file
// header and every frame header in order; since each frame header carries its payload's hash, that
// binds every byte, frame order and the index (a two-level hash) without hashing the payloads a
// second time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsdk::format {

// The newest format this library reads and writes. Files without compressed-tier states are
// still written as 1.kFormatMinorV1 so that kvsdk versions reading only major 1 keep loading them.
// 2: compressed-tier states (TierChunk.tiers); 3: journal deltas may describe them field by field
// (JournalDelta.tier_deltas), which a major-2 reader would misapply, so it must refuse such files.
// 3.1: journal deltas may give H2O scores as differences (HeadScores.score_base/score_diffs); a
// 3.0 reader finds no `values` there and refuses the delta as corrupt, so deltas continue a 3.0
// file in 3.0.
// 4: compressed-store records are typed tables (TierChunk.typed_tiers, JournalDelta.typed_tiers,
// TierRecordDelta.tier_type / TierFieldDelta.field_id; formats/tier_schema.h) instead of named
// TierStates, which a major-3 reader would not find: it must refuse such files. Everything else
// is as in 3.1. Deltas continue a file in its own format (a 3.x file gets 3.x deltas); 1.x, 2.0
// and 3.x files keep loading through the TierState path.
// 4.1 (and 1.3 for major-1 files): Policy.evict_slack (field 17). An older reader ignores it and
// continues with exact eviction (slack 0), which is still a correct cache; a newer reader gives
// files without it slack 0.
// 5.0: Metadata.prefix (PrefixRef): the cache continues a shared prefix (kvsdk_cache_create_on_prefix),
// which the file references by content hash or embeds. A 4.x reader would load such a cache
// without its prefix, so only these files carry major 5; every other file is written as before.
// 6.0: everything of 5.0, plus
//   - XXH3-64 (seeded as before) instead of XXH64 for the file header, frame header, payload and
//     trailer hashes (the records hash included);
//   - FrameHeader.flags (byte 5, zero before 6.0): kFrameShuffled on a TIER_CHUNK frame says that
//     in every ExactRows table of its FlatBuffer, the bytes of `keys` and of `values` (each a
//     vector of n f16 values, 2n bytes) are byte-plane shuffled: the n low bytes first, then the
//     n high bytes (the Blosc "shuffle" filter with element size 2). Nothing else in the frame
//     is (the FlatBuffer stays verifiable as is; `positions`, metadata and compressed-store
//     records keep their bytes). f16 values of similar magnitude share their high byte (sign,
//     exponent, top mantissa bits) while their low bytes are near random, so the planes compress
//     better and faster than interleaved bytes. Only the exact rows are shuffled so that the
//     reader unshuffles while copying them into the cache's stores (one pass over the bytes,
//     as the plain copy was) and the writer shuffles while copying them into the frame.
//     The writer chooses per frame (snapshot_writer.cpp: a sample of the frame's rows compressed
//     both ways) and sets the flag only where it shuffled; any other flag bit, or the flag on
//     another frame kind, is corrupt.
// A 5.x reader refuses 6.x files (KVSDK_E_VERSION); its header hash would not verify anyway.
// Files with exact rows are written as 6.0 (the frame headers, which say whether a frame is
// shuffled, follow the file header, and frames stream out as they are compressed, so the writer
// commits to 6.0 before it knows whether some frame shuffles); files without exact rows (all
// layers compressed, no prefix) keep the lower majors above. Journal deltas continue a file in its
// format: a 6.x file's deltas use XXH3 (and its journal base XXH3 row fingerprints) but are not
// shuffled.
constexpr uint16_t kFormatMajor = 6;  // the newest major this library reads
constexpr uint16_t kFormatMinor = 0;
constexpr uint16_t kFormatMajorPrefix = 5;  // files with a prefix and no exact rows
constexpr uint16_t kFormatMinorPrefix = 0;
constexpr uint16_t kFormatMajorTyped = 4;  // files without a prefix
constexpr uint16_t kFormatMinorTyped = 1;
constexpr uint16_t kFormatMajorV1 = 1;
constexpr uint16_t kFormatMinorV1 = 3;  // 1: eviction policy state; 2: policy fields 12..16;
                                        // 3: policy field 17

constexpr size_t kFileHeaderBytes = 32;
constexpr size_t kFrameHeaderBytes = 32;
constexpr size_t kTrailerBytes = 32;
constexpr char kFileMagic[8] = {'K', 'V', 'S', 'D', 'K', 'S', 'N', 'P'};
constexpr char kTrailerMagic[8] = {'K', 'V', 'S', 'D', 'K', 'E', 'N', 'D'};
constexpr char kFrameMagic[4] = {'K', 'V', 'F', 'R'};

// Limits a reader enforces before allocating anything a frame header claims.
constexpr uint64_t kMaxFrameBytesOption = 256ull << 20;             // max_frame_bytes limit
constexpr uint64_t kMaxRawFrameBytes = kMaxFrameBytesOption + (4ull << 20);  // + FlatBuffer overhead
constexpr uint64_t kDefaultFrameBytes = 8ull << 20;
// kvsdk_save_options.max_journal_percent: limit (0, the default, never compacts).
constexpr uint32_t kMaxJournalPercent = 100000;

enum class FrameKind : uint8_t { kMetadata = 1, kTierChunk = 2, kIndex = 3, kJournal = 4 };
const char* frame_kind_name(uint8_t kind);

struct FileHeader {
  uint16_t major = kFormatMajorTyped;
  uint16_t minor = kFormatMinorTyped;
  uint64_t snapshot_id = 0;
};

// FrameHeader.flags bits (format 6 on; 0 before).
constexpr uint8_t kFrameShuffled = 1;  // TIER_CHUNK: ExactRows keys/values are byte planes

struct FrameHeader {
  uint8_t kind = 0;
  uint8_t flags = 0;           // kFrame* bits; 0 in files before format 6
  uint32_t payload_bytes = 0;  // compressed (zstd frame) bytes that follow the header
  uint32_t raw_bytes = 0;      // the FlatBuffer's size after decompression
  uint64_t payload_hash = 0;   // record_hash of the compressed bytes, seeded with the snapshot id
};

struct Trailer {
  uint64_t index_offset = 0;   // file offset of the INDEX frame's header
  uint64_t records_hash = 0;   // record_hash (seed 0) of the file header and every frame header
};

// Encoders write exactly k*Bytes bytes to `out`. `major`: the file's format major, which picks
// the hash (record_hash) and which flags a frame header may carry; the file header's is h.major.
// The default (5) is for tools and tests that handle files of the formats before 6.
void encode_file_header(const FileHeader& h, unsigned char* out);
void encode_frame_header(const FrameHeader& h, uint64_t snapshot_id, unsigned char* out,
                         uint16_t major = kFormatMajorPrefix);
void encode_trailer(const Trailer& t, uint64_t snapshot_id, unsigned char* out,
                    uint16_t major = kFormatMajorPrefix);

// Decoders read exactly k*Bytes bytes and throw kvsdk::Error: KVSDK_E_CORRUPT for a bad magic,
// hash or field, KVSDK_E_VERSION for a newer major format (checked before the header hash, since
// a newer major may lay the header out differently).
FileHeader decode_file_header(const unsigned char* in);
// Returns false (no throw) when the bytes are not a sound frame header of this snapshot: the
// journal reader treats that as a torn tail, the snapshot reader as corruption.
bool decode_frame_header(const unsigned char* in, uint64_t snapshot_id, FrameHeader* out,
                         uint16_t major = kFormatMajorPrefix);
Trailer decode_trailer(const unsigned char* in, uint64_t snapshot_id,
                       uint16_t major = kFormatMajorPrefix);

}  // namespace kvsdk::format
