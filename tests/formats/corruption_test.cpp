// Corrupt input never crashes, never leaks and always gives a clear status: truncation at every
// frame boundary and at random offsets, bit flips in every region, wrong magic, newer major
// version, absurd counts and sizes (hand-built files with valid checksums).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "container.h"
#include "frame_writer.h"
#include "kvsdk.h"
#include "kvsdk_generated.h"
#include "sink.h"
#include "snapshot_test_util.h"
#include "test_util.h"
#include "xxhash64.h"

using namespace kvsdk_test;
namespace fmt = kvsdk::format;
namespace fb = kvsdk::fb;

namespace {

kvsdk_status try_load(kvsdk_context* ctx, const std::vector<unsigned char>& bytes,
                      kvsdk_load_info* info = nullptr) {
  kvsdk_cache* c = reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1));  // must stay untouched
  const kvsdk_status st =
      kvsdk_cache_load_from_buffer(&c, ctx, bytes.empty() ? "" : (const void*)bytes.data(),
                                   bytes.size(), nullptr, info);
  if (st == KVSDK_OK) {
    kvsdk_cache_destroy(c);
  } else {
    EXPECT_EQ(c, reinterpret_cast<kvsdk_cache*>(uintptr_t(0x1))) << "out touched on failure";
  }
  return st;
}

// Offsets of every frame header of a snapshot (full part and journal), and of the trailer.
struct Layout {
  std::vector<uint64_t> frames;
  uint64_t trailer = 0;
  uint64_t base_end = 0;
};

Layout layout_of(const std::vector<unsigned char>& f) {
  Layout l;
  uint64_t pos = fmt::kFileHeaderBytes;
  while (pos + fmt::kFrameHeaderBytes <= f.size()) {
    if (std::memcmp(&f[pos], "KVFR", 4) != 0) {
      l.trailer = pos;
      l.base_end = pos + fmt::kTrailerBytes;
      pos = l.base_end;
      continue;
    }
    l.frames.push_back(pos);
    uint32_t payload;
    std::memcpy(&payload, &f[pos + 8], 4);
    pos += fmt::kFrameHeaderBytes + payload;
  }
  return l;
}

class Corruption : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx = make_context();
    a = make_cache(ctx.get(), g);
    fill(a.get(), g, 12, 0, 3);
    kvsdk_save_options o;
    kvsdk_save_options_init(&o);
    o.max_frame_bytes = 300;  // several frames per layer
    path = dir.file("c.kvsnap");
    ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), &o), KVSDK_OK);
    base = read_file(path);
    fill(a.get(), g, 2, 12, 4);
    ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
    file = read_file(path);
    lay = layout_of(file);
    ASSERT_EQ(lay.base_end, base.size());
    ASSERT_GT(lay.frames.size(), 6u);
    ASSERT_EQ(try_load(ctx.get(), file), KVSDK_OK);
  }
  kvsdk_geometry g = make_geometry(2, 4, 2, 8);
  TempDir dir;
  ContextPtr ctx;
  CachePtr a;
  std::string path;
  std::vector<unsigned char> base, file;
  Layout lay;
};

TEST_F(Corruption, TruncationAtEveryFrameBoundaryIsCorrupt) {
  std::vector<uint64_t> cuts = {0, 1, 7, 8, 31, 32, lay.trailer, lay.trailer + 8, base.size() - 1};
  for (uint64_t f : lay.frames) {
    if (f >= lay.base_end) continue;
    for (uint64_t d : {0, 1, 8, 16, 31, 32, 33}) cuts.push_back(f + d);
    if (f > 0) cuts.push_back(f - 1);
  }
  for (uint64_t cut : cuts) {
    std::vector<unsigned char> t(file.begin(), file.begin() + long(cut));
    EXPECT_EQ(try_load(ctx.get(), t), KVSDK_E_CORRUPT) << "cut at " << cut;
  }
  EXPECT_NE(std::strstr(kvsdk_last_error(), "corrupt"), nullptr) << kvsdk_last_error();
}

TEST_F(Corruption, TruncationAtRandomOffsets) {
  std::mt19937 rng(42);
  for (int i = 0; i < 300; ++i) {
    const uint64_t cut = rng() % file.size();
    std::vector<unsigned char> t(file.begin(), file.begin() + long(cut));
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    const kvsdk_status st = try_load(ctx.get(), t, &info);
    if (cut < lay.base_end) {
      EXPECT_EQ(st, KVSDK_E_CORRUPT) << "cut at " << cut;
    } else {
      EXPECT_EQ(st, KVSDK_OK) << "cut in the journal at " << cut;
      EXPECT_EQ(info.journal_frames_dropped, cut > lay.base_end ? 1u : 0u);
    }
  }
}

TEST_F(Corruption, BitFlipsInEveryRegion) {
  // Every byte of the file, one bit each (the bit rotates with the offset).
  for (uint64_t i = 0; i < file.size(); ++i) {
    std::vector<unsigned char> t = file;
    t[i] ^= uint8_t(1u << (i % 8));
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    const kvsdk_status st = try_load(ctx.get(), t, &info);
    if (i < lay.base_end) {
      const bool major_byte = i == 8 || i == 9;
      if (major_byte) {
        EXPECT_TRUE(st == KVSDK_E_CORRUPT || st == KVSDK_E_VERSION) << "flip at " << i;
      } else {
        EXPECT_EQ(st, KVSDK_E_CORRUPT) << "flip at " << i;
      }
    } else {
      // A damaged journal frame is indistinguishable from a torn append: dropped, not applied.
      EXPECT_EQ(st, KVSDK_OK) << "flip at " << i;
      EXPECT_EQ(info.journal_frames_dropped, 1u) << "flip at " << i;
      EXPECT_EQ(info.journal_frames_applied, 0u) << "flip at " << i;
    }
  }
}

TEST_F(Corruption, WrongMagicAndNewerMajor) {
  std::vector<unsigned char> t = file;
  std::memcpy(t.data(), "GGUFxxxx", 8);
  EXPECT_EQ(try_load(ctx.get(), t), KVSDK_E_CORRUPT);
  EXPECT_NE(std::strstr(kvsdk_last_error(), "magic"), nullptr) << kvsdk_last_error();
  t = file;
  t[8] = uint8_t(fmt::kFormatMajor + 1);  // newer major: refused before anything else is read
  EXPECT_EQ(try_load(ctx.get(), t), KVSDK_E_VERSION);
  EXPECT_NE(std::strstr(kvsdk_last_error(), "newer"), nullptr) << kvsdk_last_error();
  t[8] = 0;
  t[9] = 1;  // major 256
  EXPECT_EQ(try_load(ctx.get(), t), KVSDK_E_VERSION);
  EXPECT_EQ(try_load(ctx.get(), {}), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), std::vector<unsigned char>(1000, 0)), KVSDK_E_CORRUPT);
  // A newer minor of the same major loads (the header hash covers it, so re-seal it).
  t = file;
  t[10] = 7;
  fmt::FileHeader h = fmt::decode_file_header(file.data());
  h.minor = 7;
  fmt::encode_file_header(h, t.data());
  // The trailer's file hash covers the header too: a changed header without resealing fails.
  EXPECT_EQ(try_load(ctx.get(), t), KVSDK_E_CORRUPT);
  // Resealed: a newer minor of our major loads and is reported.
  const fmt::Trailer tr = fmt::decode_trailer(&file[lay.trailer], h.snapshot_id, h.major);
  fmt::Trailer sealed = tr;
  fmt::RecordHashStream records(h.major, 0);
  records.update(t.data(), fmt::kFileHeaderBytes);
  for (uint64_t f : lay.frames) {
    if (f < lay.trailer) records.update(&t[f], fmt::kFrameHeaderBytes);
  }
  sealed.records_hash = records.digest();
  fmt::encode_trailer(sealed, h.snapshot_id, &t[lay.trailer], h.major);
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  EXPECT_EQ(try_load(ctx.get(), t, &info), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(info.format_minor, 7u);
  EXPECT_EQ(info.journal_frames_applied, 1u);
}

// Hand-built snapshots whose checksums are valid but whose contents are absurd.
class Crafted : public ::testing::Test {
 protected:
  struct Layer {
    uint64_t appended;
    std::vector<uint64_t> head_tokens;
  };
  static flatbuffers::Offset<fb::Metadata> metadata(flatbuffers::FlatBufferBuilder& b,
                                                    uint32_t layers, uint32_t kv, uint32_t dim,
                                                    const std::vector<Layer>& ls,
                                                    int method = 0, int residual = 128) {
    std::vector<flatbuffers::Offset<fb::LayerInfo>> infos;
    for (const Layer& l : ls) {
      infos.push_back(fb::CreateLayerInfo(b, l.appended, b.CreateVector(l.head_tokens)));
    }
    const auto geo = fb::CreateGeometry(b, layers, kv, kv, dim, 0, 1, 10000.0f, 0.25f);
    const auto pol = fb::CreatePolicy(b, method, 0, 32, residual, 4, 32, 32, 7, 0, 0.5f, 0.5f, 0.05f);
    return fb::CreateMetadata(b, 1, 0, 0, geo, pol, 0, b.CreateVector(infos));
  }
  // Writes header, the given frames, index and trailer, then `journal` frames.
  static std::vector<unsigned char> build(
      const std::vector<std::pair<fmt::FrameKind, std::vector<uint8_t>>>& frames,
      const std::vector<std::vector<uint8_t>>& journal = {}) {
    std::vector<unsigned char> out;
    fmt::VectorSink sink(out);
    fmt::FrameWriter w(sink, 1234, 3);
    w.write_file_header();
    for (const auto& [kind, fbuf] : frames) w.write_frame(kind, fbuf.data(), fbuf.size());
    w.write_index_and_trailer();
    for (const auto& j : journal) w.write_frame(fmt::FrameKind::kJournal, j.data(), j.size());
    return out;
  }
  // A one-part delta for layer 0 head 0 of a 1-layer, head_dim 4 cache.
  static std::vector<uint8_t> delta(uint64_t seq, const std::vector<fb::Segment>& segs,
                                    size_t new_rows, uint64_t appended = 3) {
    flatbuffers::FlatBufferBuilder b;
    std::vector<int32_t> pos(new_rows, 9);
    std::vector<uint16_t> kv(new_rows * 4, 0x3c00);
    const auto rows = fb::CreateExactRows(b, b.CreateVector(pos), b.CreateVector(kv), b.CreateVector(kv));
    const auto hd = fb::CreateHeadDelta(b, 0, 0, b.CreateVectorOfStructs(segs), rows);
    const std::vector<uint64_t> app = {appended};
    const auto d = fb::CreateJournalDelta(b, seq, 0, 1, b.CreateVector(&hd, 1), b.CreateVector(app));
    return finish(b, fb::Payload::JournalDelta, d);
  }
  template <class T>
  static std::vector<uint8_t> finish(flatbuffers::FlatBufferBuilder& b, fb::Payload type,
                                     flatbuffers::Offset<T> payload) {
    b.Finish(fb::CreateFrame(b, type, payload.Union()), fb::FrameIdentifier());
    return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
  }
  static std::vector<uint8_t> meta_frame(uint32_t layers, uint32_t kv, uint32_t dim,
                                         const std::vector<Layer>& ls, int method = 0,
                                         int residual = 128) {
    flatbuffers::FlatBufferBuilder b;
    return finish(b, fb::Payload::Metadata, metadata(b, layers, kv, dim, ls, method, residual));
  }
  static std::vector<uint8_t> rows_frame(uint32_t layer, uint32_t head, uint64_t begin,
                                         size_t n, size_t key_elems, size_t value_elems,
                                         int32_t pos0 = 0) {
    flatbuffers::FlatBufferBuilder b;
    std::vector<int32_t> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = pos0 + int32_t(i);
    std::vector<uint16_t> k(key_elems, 0x3c00), v(value_elems, 0x3c00);
    const auto rows = fb::CreateExactRows(b, b.CreateVector(pos), b.CreateVector(k), b.CreateVector(v));
    const auto hr = fb::CreateHeadRows(b, layer, head, begin, rows);
    return finish(b, fb::Payload::TierChunk, fb::CreateTierChunk(b, b.CreateVector(&hr, 1)));
  }
  ContextPtr ctx = make_context();
};

TEST_F(Crafted, ConsistentHandBuiltFileLoads) {
  // The control: the crafting helpers make a sound file.
  const auto f = build({{fmt::FrameKind::kMetadata, meta_frame(1, 1, 4, {{2, {2}}})},
                        {fmt::FrameKind::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}});
  EXPECT_EQ(try_load(ctx.get(), f), KVSDK_OK) << kvsdk_last_error();
}

TEST_F(Crafted, AbsurdCountsAndSizesAreCorrupt) {
  using K = fmt::FrameKind;
  const auto meta = meta_frame(1, 1, 4, {{2, {2}}});
  const std::vector<std::vector<std::pair<K, std::vector<uint8_t>>>> cases = {
      // Declares 2^40 rows (and 1e9 rows, which would fit an unlimited budget) but holds 2.
      {{K::kMetadata, meta_frame(1, 1, 4, {{2, {1ull << 40}}})}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}},
      {{K::kMetadata, meta_frame(1, 1, 4, {{2, {1000000000}}})}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}},
      // Absurd geometry.
      {{K::kMetadata, meta_frame(1000000, 1, 4, {{2, {2}}})}},
      {{K::kMetadata, meta_frame(1, 0, 4, {{2, {}}})}},
      {{K::kMetadata, meta_frame(1, 1, 4096, {{2, {2}}})}},
      // Layer list shorter than the geometry; head list of the wrong length.
      {{K::kMetadata, meta_frame(2, 1, 4, {{2, {2}}})}},
      {{K::kMetadata, meta_frame(1, 1, 4, {{2, {2, 2}}})}},
      // Invalid policy value.
      {{K::kMetadata, meta_frame(1, 1, 4, {{2, {2}}}, 999)}},
      // A KIVI window left unresolved (caches resolve KVSDK_QUANT_RESIDUAL_AUTO before saving).
      {{K::kMetadata, meta_frame(1, 1, 4, {{2, {2}}}, KVSDK_METHOD_KIVI, KVSDK_QUANT_RESIDUAL_AUTO)}},
      {{K::kMetadata, meta_frame(1, 1, 4, {{2, {2}}}, 0, KVSDK_QUANT_RESIDUAL_AUTO)}},
      // Rows: wrong array sizes, out-of-range head/layer, out of order, too many, too few.
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 7, 8)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 800)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 5, 0, 2, 8, 8)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(9, 0, 0, 2, 8, 8)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 1, 2, 8, 8)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 0, 3, 12, 12)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 0, 1, 4, 4)}},
      {{K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8, -5)}},
      // Frame order: rows before metadata, two metadata frames, a journal before the index.
      {{K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}, {K::kMetadata, meta}},
      {{K::kMetadata, meta}, {K::kMetadata, meta}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}},
      // A frame whose kind does not match its contents.
      {{K::kMetadata, meta}, {K::kIndex, rows_frame(0, 0, 0, 2, 8, 8)}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(try_load(ctx.get(), build(cases[i])), KVSDK_E_CORRUPT)
        << "case " << i << ": " << kvsdk_last_error();
  }
  // A declared size beyond the budget fails early with KVSDK_E_BUDGET.
  auto tight = make_context(1000);
  EXPECT_EQ(try_load(tight.get(), build({{K::kMetadata, meta_frame(1, 1, 4, {{2, {1000000000}}})}})),
            KVSDK_E_BUDGET);
}

TEST_F(Crafted, InconsistentJournalDeltasAreCorrupt) {
  using K = fmt::FrameKind;
  const std::vector<std::pair<K, std::vector<uint8_t>>> base = {
      {K::kMetadata, meta_frame(1, 1, 4, {{2, {2}}})}, {K::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}};
  const uint64_t kNew = ~0ull;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  // Control: keep both rows, add one.
  ASSERT_EQ(try_load(ctx.get(), build(base, {delta(1, {{0, 2}, {kNew, 1}}, 1)}), &info), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_EQ(info.journal_frames_applied, 1u);
  const std::vector<std::vector<uint8_t>> bad = {
      delta(1, {{1, 1}, {0, 1}}, 0),            // copies go backwards (would duplicate rows)
      delta(1, {{0, 1}, {0, 1}}, 0),            // the same row twice
      delta(1, {{0, 3}}, 0),                    // beyond the previous rows
      delta(1, {{1ull << 62, 1ull << 62}}, 0),  // absurd range
      delta(1, {{kNew, 2}}, 1),                 // needs more new rows than sent
      delta(1, {{kNew, 1ull << 62}}, 1),        // absurd new-row count
      delta(1, {{0, 2}}, 1),                    // new rows left over
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(try_load(ctx.get(), build(base, {bad[i]})), KVSDK_E_CORRUPT)
        << "case " << i << ": " << kvsdk_last_error();
  }
  // Sound frames out of sequence are corruption, not a torn tail.
  EXPECT_EQ(try_load(ctx.get(), build(base, {delta(2, {{0, 2}}, 0)})), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), build(base, {delta(1, {{0, 2}}, 0), delta(1, {{0, 2}}, 0)})),
            KVSDK_E_CORRUPT);
}

TEST_F(Crafted, AbsurdFrameHeadersAreCorrupt) {
  const auto good = build({{fmt::FrameKind::kMetadata, meta_frame(1, 1, 4, {{2, {2}}})},
                           {fmt::FrameKind::kTierChunk, rows_frame(0, 0, 0, 2, 8, 8)}});
  // Re-seal the first frame header with absurd sizes: the header hash is valid, the sizes not.
  auto reseal = [&](uint32_t payload, uint32_t raw, uint8_t kind) {
    std::vector<unsigned char> t = good;
    fmt::FrameHeader h;
    EXPECT_TRUE(fmt::decode_frame_header(&t[32], 1234, &h));
    h.payload_bytes = payload;
    h.raw_bytes = raw;
    h.kind = kind;
    fmt::encode_frame_header(h, 1234, &t[32]);
    return t;
  };
  fmt::FrameHeader h;
  ASSERT_TRUE(fmt::decode_frame_header(&good[32], 1234, &h));
  EXPECT_EQ(try_load(ctx.get(), reseal(0xFFFFFFFFu, h.raw_bytes, h.kind)), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), reseal(h.payload_bytes, 0xFFFFFFFFu, h.kind)), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), reseal(h.payload_bytes, h.raw_bytes + 1, h.kind)), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), reseal(h.payload_bytes, 0, h.kind)), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), reseal(h.payload_bytes, h.raw_bytes, 99)), KVSDK_E_CORRUPT);
  EXPECT_EQ(try_load(ctx.get(), reseal(h.payload_bytes, h.raw_bytes, 4)), KVSDK_E_CORRUPT);
}

TEST(CorruptionFiles, DirectoriesAndEmptyFilesAreRejected) {
  TempDir dir;
  auto ctx = make_context();
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_load(&c, ctx.get(), dir.path().c_str(), nullptr, nullptr), KVSDK_E_IO);
  write_file(dir.file("empty"), {});
  EXPECT_EQ(kvsdk_cache_load(&c, ctx.get(), dir.file("empty").c_str(), nullptr, nullptr),
            KVSDK_E_CORRUPT);
  EXPECT_EQ(c, nullptr);
}

}  // namespace
