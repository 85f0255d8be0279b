// Snapshot format 6 (formats/container.h): exact f16 rows as byte planes in frames flagged
// kFrameShuffled, and XXH3-64 record hashes; older formats still verify with XXH64.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "container.h"
#include "kvsdk.h"
#include "snapshot_mutation.h"
#include "snapshot_test_util.h"
#include "test_util.h"
#include "util/error.h"
#include "xxhash64.h"
#include "byte_planes.h"
#include "zstd_frame.h"

using namespace kvsdk_test;
namespace fmt = kvsdk::format;

namespace {

// Enough rows per head that each frame's byte planes fill zstd blocks (where shuffling pays).
kvsdk_geometry shuffle_geometry() { return make_geometry(2, 4, 2, 64); }

struct FrameInfo {
  uint64_t offset;
  uint8_t kind, flags;
};

// The base frames of a file (up to the trailer), read from their raw header fields.
std::vector<FrameInfo> base_frames(const std::vector<unsigned char>& f, uint64_t* trailer) {
  std::vector<FrameInfo> out;
  uint64_t pos = fmt::kFileHeaderBytes;
  while (pos + fmt::kFrameHeaderBytes <= f.size() &&
         std::memcmp(&f[pos], fmt::kFrameMagic, 4) == 0) {
    out.push_back({pos, f[pos + 4], f[pos + 5]});
    uint32_t payload = 0;
    for (int i = 3; i >= 0; --i) payload = (payload << 8) | f[pos + 8 + i];
    pos += fmt::kFrameHeaderBytes + payload;
  }
  *trailer = pos;
  return out;
}

// Sets frame `i`'s flags byte and re-seals every frame header and the trailer with the file's
// own hash, so that only the reader's check of the flags can refuse the result.
std::vector<unsigned char> with_flags(std::vector<unsigned char> f, size_t i, uint8_t flags) {
  const fmt::FileHeader h = fmt::decode_file_header(f.data());
  uint64_t trailer = 0;
  const std::vector<FrameInfo> frames = base_frames(f, &trailer);
  EXPECT_LT(i, frames.size());
  f[frames[i].offset + 5] = flags;
  fmt::RecordHashStream records(h.major, 0);
  records.update(f.data(), fmt::kFileHeaderBytes);
  for (const FrameInfo& fr : frames) {
    unsigned char* p = &f[fr.offset];
    const uint64_t hh = fmt::record_hash(h.major, p, 24, h.snapshot_id);
    for (int b = 0; b < 8; ++b) p[24 + b] = uint8_t(hh >> (8 * b));
    records.update(p, fmt::kFrameHeaderBytes);
  }
  fmt::Trailer t = fmt::decode_trailer(&f[trailer], h.snapshot_id, h.major);
  t.records_hash = records.digest();
  fmt::encode_trailer(t, h.snapshot_id, &f[trailer], h.major);
  return f;
}

// Undoes the byte planes of every ExactRows table of a shuffled frame, in place.
void unshuffle_rows(MutableFrame& f) {
  const kvsdk::fb::TierChunk* c = f.root()->payload_as_TierChunk();
  ASSERT_NE(c, nullptr);
  ASSERT_NE(c->heads(), nullptr);
  for (const kvsdk::fb::HeadRows* hr : *c->heads()) {
    for (const flatbuffers::Vector<uint16_t>* vec : {hr->exact()->keys(), hr->exact()->values()}) {
      const size_t n = vec->size();
      std::vector<uint16_t> plain;
      const unsigned char* b = vec->Data();
      fmt::append_unshuffled(b, b + n, n, plain);
      std::memcpy(mutable_data(vec), plain.data(), 2 * n);
    }
  }
}

// The file rewritten with every frame's rows as they are (byte planes undone, no flags) under
// the header `major`.`minor`: what a writer that never shuffles would have written.
std::vector<unsigned char> unshuffled_as(const std::vector<unsigned char>& file, uint16_t major,
                                         uint16_t minor) {
  const fmt::FileHeader fh = fmt::decode_file_header(file.data());
  std::vector<unsigned char> out;
  fmt::VectorSink sink(out);
  fmt::FrameWriter w(sink, fh.snapshot_id, 1);
  w.write_file_header(major, minor);
  fmt::ZstdDecompressor zstd;
  std::vector<unsigned char> raw;
  for (uint64_t pos = fmt::kFileHeaderBytes; pos < file.size();) {
    fmt::FrameHeader h;
    EXPECT_TRUE(fmt::decode_frame_header(&file[pos], fh.snapshot_id, &h, fh.major));
    const uint64_t payload = pos + fmt::kFrameHeaderBytes;
    zstd.decompress(&file[payload], h.payload_bytes, h.raw_bytes, raw);
    pos = payload + h.payload_bytes;
    if (h.kind == uint8_t(fmt::FrameKind::kIndex)) break;  // no journal in these files
    MutableFrame f{fmt::FrameKind(h.kind), false, 0, std::vector<uint8_t>(raw.begin(), raw.end())};
    if (h.flags & fmt::kFrameShuffled) unshuffle_rows(f);
    w.write_frame(f.kind, f.flatbuffer.data(), f.flatbuffer.size());
  }
  w.write_index_and_trailer();
  return out;
}

size_t shuffled_frames(const std::vector<unsigned char>& f) {
  uint64_t trailer = 0;
  size_t n = 0;
  for (const FrameInfo& fr : base_frames(f, &trailer)) n += (fr.flags & fmt::kFrameShuffled) != 0;
  return n;
}

struct Saved {
  ContextPtr ctx;
  CachePtr cache;
  std::vector<unsigned char> file;
};

Saved saved_cache(size_t rows) {
  Saved s;
  const kvsdk_geometry g = shuffle_geometry();
  s.ctx = make_context();
  s.cache = make_cache(s.ctx.get(), g);
  fill(s.cache.get(), g, rows, 0, 5);
  s.file = save_buffer(s.cache.get());
  return s;
}

TEST(ShuffledFrames, RowsRoundTripExactlyAndTheFileIsFormat6) {
  Saved s = saved_cache(2000);
  const fmt::FileHeader h = fmt::decode_file_header(s.file.data());
  EXPECT_EQ(h.major, 6);
  EXPECT_EQ(h.minor, 0);
  EXPECT_EQ(KVSDK_SNAPSHOT_FORMAT_MAJOR, 6);
  // Every tier frame of these rows is shuffled (the sample says it pays for f16 rows of one
  // distribution), and only tier frames.
  uint64_t trailer = 0;
  size_t tier = 0;
  for (const FrameInfo& f : base_frames(s.file, &trailer)) {
    if (f.kind == uint8_t(fmt::FrameKind::kTierChunk)) {
      ++tier;
      EXPECT_EQ(f.flags, fmt::kFrameShuffled);
    } else {
      EXPECT_EQ(f.flags, 0);
    }
  }
  EXPECT_GT(tier, 0u);
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  kvsdk_status st = KVSDK_OK;
  CachePtr b = load_buffer(s.ctx.get(), s.file, &st, &info);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(info.format_major, 6u);
  EXPECT_TRUE(dump(s.cache.get()) == dump(b.get()));
}

TEST(ShuffledFrames, PlanesCompressSmallerThanTheRowsAsTheyAre) {
  Saved s = saved_cache(2000);
  const std::vector<unsigned char> plain = unshuffled_as(s.file, 6, 0);
  EXPECT_EQ(shuffled_frames(plain), 0u);
  EXPECT_LT(s.file.size(), plain.size());
}

// Frames whose rows are below kMinShuffledFrameBytes are written as they are, unprobed (both
// planes would share one zstd block's statistics); at and above it the probe decides.
TEST(ShuffledFrames, SmallFramesAreWrittenAsTheyAre) {
  const kvsdk_geometry g = shuffle_geometry();
  const size_t row = size_t(g.n_kv_heads) * (4 * g.head_dim + 4);  // a layer's row, every head
  const size_t below = fmt::kMinShuffledFrameBytes / row - 1;
  Saved small = saved_cache(below);
  EXPECT_EQ(shuffled_frames(small.file), 0u);
  Saved large = saved_cache(fmt::kMinShuffledFrameBytes / row + 1);
  EXPECT_GT(shuffled_frames(large.file), 0u);
}

TEST(ShuffledFrames, UnshuffledFramesOfFormat6AndOlderFormatsLoadTheSameRows) {
  Saved s = saved_cache(1100);  // frames above kMinShuffledFrameBytes
  ASSERT_GT(shuffled_frames(s.file), 0u);
  for (const auto& [major, minor] : {std::pair<uint16_t, uint16_t>{6, 0}, {4, 1}, {1, 3}}) {
    const std::vector<unsigned char> plain = unshuffled_as(s.file, major, minor);
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    kvsdk_status st = KVSDK_OK;
    CachePtr b = load_buffer(s.ctx.get(), plain, &st, &info);
    ASSERT_EQ(st, KVSDK_OK) << major << "." << minor << ": " << kvsdk_last_error();
    EXPECT_EQ(info.format_major, major);
    EXPECT_TRUE(dump(s.cache.get()) == dump(b.get())) << major << "." << minor;
  }
}

TEST(ShuffledFrames, TheReaderHonoursTheFlag) {
  Saved s = saved_cache(1100);
  uint64_t trailer = 0;
  const std::vector<FrameInfo> frames = base_frames(s.file, &trailer);
  size_t tier = frames.size();
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].flags == fmt::kFrameShuffled) tier = i;
  }
  ASSERT_LT(tier, frames.size());
  // Re-sealed unchanged: still loads (the re-sealing itself is sound).
  kvsdk_status st = KVSDK_OK;
  CachePtr same = load_buffer(s.ctx.get(), with_flags(s.file, tier, fmt::kFrameShuffled), &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(dump(s.cache.get()) == dump(same.get()));
  // Byte planes read as rows: a valid file, other rows.
  CachePtr other = load_buffer(s.ctx.get(), with_flags(s.file, tier, 0), &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  EXPECT_FALSE(dump(s.cache.get()) == dump(other.get()));
}

TEST(ShuffledFrames, UnknownFlagsAndFlagsOnOtherFramesAreCorrupt) {
  Saved s = saved_cache(1100);
  uint64_t trailer = 0;
  const std::vector<FrameInfo> frames = base_frames(s.file, &trailer);
  for (size_t i = 0; i < frames.size(); ++i) {
    const bool tier = frames[i].kind == uint8_t(fmt::FrameKind::kTierChunk);
    std::vector<uint8_t> bad = {2, 0x80, 0x81, 0xff};
    if (!tier) bad.push_back(fmt::kFrameShuffled);  // only tier frames may be shuffled
    for (uint8_t flags : bad) {
      kvsdk_status st = KVSDK_OK;
      load_buffer(s.ctx.get(), with_flags(s.file, i, flags), &st);
      EXPECT_EQ(st, KVSDK_E_CORRUPT) << "frame " << i << " flags " << int(flags);
    }
  }
  // The flag in a file of an older format (written unshuffled as 4.1, re-sealed with XXH64).
  const std::vector<unsigned char> v4 = unshuffled_as(s.file, 4, 1);
  const std::vector<FrameInfo> v4_frames = base_frames(v4, &trailer);
  for (size_t i = 0; i < v4_frames.size(); ++i) {
    if (v4_frames[i].kind != uint8_t(fmt::FrameKind::kTierChunk)) continue;
    kvsdk_status st = KVSDK_OK;
    load_buffer(s.ctx.get(), with_flags(v4, i, 0), &st);
    EXPECT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    load_buffer(s.ctx.get(), with_flags(v4, i, fmt::kFrameShuffled), &st);
    EXPECT_EQ(st, KVSDK_E_CORRUPT) << "a shuffled frame in a format 4 file";
  }
}

TEST(ShuffledFrames, Format6RecordsUseXxh3AndOlderOnesXxh64) {
  Saved s = saved_cache(100);
  const fmt::FileHeader h = fmt::decode_file_header(s.file.data());
  uint64_t stored = 0;
  for (int b = 7; b >= 0; --b) stored = (stored << 8) | s.file[24 + b];
  EXPECT_EQ(stored, fmt::xxh3_64(s.file.data(), 24, h.snapshot_id));
  EXPECT_NE(stored, fmt::xxh64(s.file.data(), 24, h.snapshot_id));
  // The same header bytes claiming major 5: the hash no longer verifies (a 5.x reader refuses
  // a 6.x file by its major first, KVSDK_E_VERSION, corruption_test.cpp).
  std::vector<unsigned char> v5 = s.file;
  v5[8] = 5;
  EXPECT_THROW(fmt::decode_file_header(v5.data()), kvsdk::Error);
  const std::vector<unsigned char> v4 = unshuffled_as(s.file, 4, 1);
  stored = 0;
  for (int b = 7; b >= 0; --b) stored = (stored << 8) | v4[24 + b];
  EXPECT_EQ(stored, fmt::xxh64(v4.data(), 24, h.snapshot_id));
}

TEST(ShuffledFrames, JournalDeltasContinueAFormat6File) {
  TempDir dir;
  const kvsdk_geometry g = shuffle_geometry();
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  fill(a.get(), g, 600, 0, 3);
  const std::string path = dir.file("a.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  fill(a.get(), g, 40, 600, 4);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  fill(a.get(), g, 40, 640, 6);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  const std::vector<unsigned char> file = read_file(path);
  EXPECT_EQ(fmt::decode_file_header(file.data()).major, 6);
  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(raw);
  EXPECT_EQ(info.journal_frames_applied, 2u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST(ShuffledFrames, ByteplanesRoundTripAcrossChunkSizes) {
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(4095), size_t(4096), size_t(4097),
                   size_t(10000)}) {
    std::vector<uint16_t> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = uint16_t(i * 40503u + 17);
    std::vector<unsigned char> planes(2 * n);
    fmt::shuffle_f16(src.data(), n, planes.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(planes[i], uint8_t(src[i])) << n << " " << i;
      ASSERT_EQ(planes[n + i], uint8_t(src[i] >> 8)) << n << " " << i;
    }
    std::vector<uint16_t> back = {0xabcd};  // appended after what is there
    fmt::append_unshuffled(planes.data(), planes.data() + n, n, back);
    ASSERT_EQ(back.size(), n + 1);
    EXPECT_EQ(back[0], 0xabcd);
    EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin() + 1)) << n;
  }
}

}  // namespace
