// Journal deltas: appends and evictions since the last save are recorded exactly; a torn tail (a
// torn frame, or the frames of a delta whose last frame is missing) is dropped and counted, and
// the next delta replaces it; a delta only continues the file of the cache's own last save/load.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "core/cache.h"
#include "kvsdk.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

CachePtr load_file(kvsdk_context* ctx, const std::string& path, kvsdk_load_info* info = nullptr,
                   kvsdk_status* status = nullptr) {
  kvsdk_cache* c = nullptr;
  if (info) info->struct_size = sizeof *info;
  const kvsdk_status st = kvsdk_cache_load(&c, ctx, path.c_str(), nullptr, info);
  if (status) *status = st;
  return CachePtr(c);
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

// Replaces the cache's storage with `layers` (as eviction would leave it), keeping its journal
// base. The rows live on a side context: the journal only looks at rows.
void replace_rows(kvsdk_cache* c, std::vector<kvsdk::LayerState> layers) {
  static const auto side = std::make_shared<kvsdk::Context>(KVSDK_BACKEND_CPU, 0, 0);
  c->impl = kvsdk::Cache::restore(side, c->impl->geometry(), c->impl->policy(), std::move(layers));
}

std::vector<kvsdk::LayerState> copy_rows(const kvsdk_cache* c) {
  std::vector<kvsdk::LayerState> out;
  for (uint32_t l = 0; l < c->impl->geometry().n_layers; ++l) out.push_back(c->impl->layer_image(l));
  return out;
}

class Journal : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx = make_context();
    a = make_cache(ctx.get(), g);
    fill(a.get(), g, 30, 0, 1);
    path = dir.file("j.kvsnap");
    ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  }
  kvsdk_geometry g = make_geometry(3, 4, 2, 16);
  TempDir dir;
  ContextPtr ctx;
  CachePtr a;
  std::string path;
};

TEST_F(Journal, AppendOnlyDeltasReplayExactly) {
  int32_t pos = 30;
  for (int d = 1; d <= 4; ++d) {
    fill(a.get(), g, 1 + d, pos, 10 + d);
    pos += 1 + d;
    const uint64_t before = file_size(path);
    ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
    EXPECT_LT(file_size(path) - before, 3000u) << "a delta holds only the new rows";
    kvsdk_load_info info{};
    kvsdk_status st;
    auto b = load_file(ctx.get(), path, &info, &st);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(info.journal_frames_applied, uint32_t(d));
    EXPECT_EQ(info.journal_frames_dropped, 0u);
    EXPECT_TRUE(dump(a.get()) == dump(b.get())) << "after delta " << d;
  }
}

TEST_F(Journal, UnchangedCacheGivesAnEmptyDelta) {
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  kvsdk_load_info info{};
  auto b = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(b);
  EXPECT_EQ(info.journal_frames_applied, 1u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST_F(Journal, EvictionSinceTheLastSaveStaysExact) {
  // Remove rows from the middle of heads (as eviction will), then append: the delta must
  // describe survivors + new rows, not just "rows past the old count".
  auto layers = copy_rows(a.get());
  const size_t dim = g.head_dim;
  auto erase_rows = [&](kvsdk::ExactStore& e, size_t from, size_t n) {
    e.positions.erase(e.positions.begin() + from, e.positions.begin() + from + n);
    e.k.erase(e.k.begin() + from * dim, e.k.begin() + (from + n) * dim);
    e.v.erase(e.v.begin() + from * dim, e.v.begin() + (from + n) * dim);
  };
  erase_rows(layers[0].heads[0], 5, 10);
  erase_rows(layers[0].heads[1], 0, 1);
  erase_rows(layers[2].heads[1], 29, 1);
  erase_rows(layers[2].heads[1], 3, 2);
  replace_rows(a.get(), std::move(layers));
  fill(a.get(), g, 2, 30, 77);
  const uint64_t before = file_size(path);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_LT(file_size(path) - before, 2000u) << "survivors are referenced, not rewritten";
  auto b = load_file(ctx.get(), path);
  ASSERT_TRUE(b) << kvsdk_last_error();
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  // A second delta on top of the evicted state.
  fill(a.get(), g, 1, 32, 78);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  b = load_file(ctx.get(), path);
  ASSERT_TRUE(b);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST_F(Journal, ReorderedOrRewrittenRowsStayExact) {
  // Not something eviction does, but the delta must stay exact whatever changed.
  auto layers = copy_rows(a.get());
  auto& e = layers[1].heads[0];
  std::swap(e.positions[0], e.positions[7]);
  e.k[3] ^= 1;
  replace_rows(a.get(), std::move(layers));
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  auto b = load_file(ctx.get(), path);
  ASSERT_TRUE(b) << kvsdk_last_error();
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST_F(Journal, MultiFrameDeltasAndTornTails) {
  fill(a.get(), g, 5, 30, 2);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  const auto after_first = dump(a.get());
  const uint64_t first_end = file_size(path);
  fill(a.get(), g, 6, 35, 3);
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.max_frame_bytes = 200;  // ~3 rows per frame: the delta spans many frames
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), &o), KVSDK_OK);
  const auto full = read_file(path);
  kvsdk_load_info info{};
  auto b = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(b);
  EXPECT_GT(info.journal_frames_applied, 4u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  // Cut the second delta anywhere (around every frame boundary and header field, and at a
  // stride through the payloads): the load gives the state after the first delta.
  std::vector<uint64_t> cuts;
  for (uint64_t f = first_end; f < full.size();) {
    for (uint64_t d : {0, 1, 4, 8, 16, 31, 32, 33}) cuts.push_back(f + d);
    uint32_t payload;
    std::memcpy(&payload, &full[f + 8], 4);
    f += 32 + payload;
    cuts.push_back(f - 1);
  }
  for (uint64_t cut = first_end; cut < full.size(); cut += 29) cuts.push_back(cut);
  for (uint64_t cut : cuts) {
    if (cut >= full.size()) continue;
    std::vector<unsigned char> torn(full.begin(), full.begin() + long(cut));
    kvsdk_load_info ti{};
    ti.struct_size = sizeof ti;
    kvsdk_status st;
    auto t = load_buffer(ctx.get(), torn, &st, &ti);
    ASSERT_EQ(st, KVSDK_OK) << "cut at " << cut << ": " << kvsdk_last_error();
    EXPECT_EQ(ti.journal_frames_applied, 1u);
    EXPECT_EQ(ti.journal_frames_dropped > 0, cut > first_end) << "cut at " << cut;
    ASSERT_TRUE(dump(t.get()) == after_first) << "cut at " << cut;
  }
}

TEST_F(Journal, TornDeltaLoadsThePreviousStateAndAFullSaveRecovers) {
  fill(a.get(), g, 2, 30, 4);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  const uint64_t end = file_size(path);
  fill(a.get(), g, 2, 32, 5);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  // Simulate a crash in the middle of the second delta's append.
  auto bytes = read_file(path);
  const uint64_t mid = end + (bytes.size() - end) / 2;
  bytes.resize(mid);
  write_file(path, bytes);
  kvsdk_load_info info{};
  auto b = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(b);
  EXPECT_EQ(info.journal_frames_dropped, 1u);
  // The file lost frames this cache wrote: its base is gone, so a delta is refused (nothing
  // written) and a full save recovers.
  const auto torn = read_file(path);
  EXPECT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_E_STATE);
  EXPECT_EQ(read_file(path), torn);
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK);
  fill(a.get(), g, 1, 34, 6);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  b = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(b);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

// Offsets where the journal frames from `from` on begin, and the file's end.
std::vector<uint64_t> frame_starts(const std::vector<unsigned char>& bytes, uint64_t from) {
  std::vector<uint64_t> starts;
  for (uint64_t f = from; f + 32 <= bytes.size();) {
    starts.push_back(f);
    uint32_t payload;
    std::memcpy(&payload, &bytes[f + 8], 4);
    f += 32 + payload;
  }
  return starts;
}

// Grows the fixture's cache to 430 tokens and saves it in full: a base large enough that the
// deltas of the tests below stay a small journal behind it.
void grow_base(kvsdk_cache* a, const kvsdk_geometry& g, const std::string& path) {
  fill(a, g, 400, 30, 50);
  ASSERT_EQ(kvsdk_cache_save(a, path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
}

TEST_F(Journal, CrashInsideAMultiFrameDeltaDoesNotBlockLaterDeltas) {
  // A crash after some but not all frames of a delta: a load drops that delta's complete frames
  // (they belong to an incomplete delta), and the loaded cache's next delta replaces them
  // instead of mistaking them for another writer's.
  grow_base(a.get(), g, path);
  fill(a.get(), g, 5, 430, 2);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  const auto after_first = dump(a.get());
  const uint64_t first_end = file_size(path);
  fill(a.get(), g, 6, 435, 3);
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.max_frame_bytes = 200;  // ~3 rows per frame: the delta spans many frames
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), &o), KVSDK_OK);
  const auto full = read_file(path);
  const std::vector<uint64_t> starts = frame_starts(full, first_end);
  ASSERT_GE(starts.size(), 4u);
  struct Cut {
    uint64_t at;
    uint32_t dropped;  // complete frames before the cut, plus the torn one if any
  };
  const std::vector<Cut> cuts = {
      {starts[1], 1},                                  // first frame complete, the rest missing
      {starts[2], 2},                                  // two complete frames
      {starts.back(), uint32_t(starts.size() - 1)},    // all but the last frame
      {starts[1] + (starts[2] - starts[1]) / 2, 2},    // a complete frame, then a torn one
      {starts[2] + 5, 3},                              // torn inside the next frame's header
      {first_end + 40, 1},                             // torn inside the first frame
  };
  for (const Cut& cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut.at));
    write_file(path, std::vector<unsigned char>(full.begin(), full.begin() + long(cut.at)));
    kvsdk_load_info info{};
    kvsdk_status st;
    auto b = load_file(ctx.get(), path, &info, &st);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(info.journal_frames_applied, 1u);
    EXPECT_EQ(info.journal_frames_dropped, cut.dropped);
    ASSERT_TRUE(dump(b.get()) == after_first);
    // The writer of the lost frames no longer has its base in the file: refused, untouched.
    EXPECT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_E_STATE);
    // A second cache loaded from the same torn file, to check the other-writer refusal below.
    auto other = load_file(ctx.get(), path);
    ASSERT_TRUE(other);
    // The loaded cache continues: its (multi-frame) delta replaces the unfinished one.
    fill(b.get(), g, 7, 435, 9);
    ASSERT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
    const auto written = read_file(path);
    const uint32_t new_frames = uint32_t(frame_starts(written, first_end).size());
    EXPECT_GT(new_frames, 1u);
    auto c = load_file(ctx.get(), path, &info, &st);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(info.journal_frames_applied, 1u + new_frames);
    EXPECT_EQ(info.journal_frames_dropped, 0u);
    EXPECT_TRUE(dump(b.get()) == dump(c.get()));
    // And again, single-frame, on top.
    fill(b.get(), g, 1, 442, 10);
    ASSERT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
    c = load_file(ctx.get(), path, &info, &st);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    EXPECT_EQ(info.journal_frames_applied, 2u + new_frames);
    EXPECT_EQ(info.journal_frames_dropped, 0u);
    EXPECT_TRUE(dump(b.get()) == dump(c.get()));
    // The other cache loaded the same state, but the journal now holds complete deltas it did
    // not write: refused, nothing written.
    const auto before = read_file(path);
    fill(other.get(), g, 1, 435, 11);
    EXPECT_EQ(kvsdk_cache_save_delta(other.get(), path.c_str(), nullptr), KVSDK_E_STATE);
    EXPECT_EQ(read_file(path), before);
  }
}

TEST_F(Journal, AnotherWritersDeltaIsNeverCutEvenWhenATornOneFollows) {
  grow_base(a.get(), g, path);
  const auto base = read_file(path);
  auto b = load_file(ctx.get(), path);
  ASSERT_TRUE(b);
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.max_frame_bytes = 200;
  // `a` writes a complete multi-frame delta, then crashes inside the next one.
  fill(a.get(), g, 6, 430, 3);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), &o), KVSDK_OK);
  const uint64_t first_end = file_size(path);
  fill(a.get(), g, 6, 436, 4);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), &o), KVSDK_OK);
  auto bytes = read_file(path);
  const auto starts = frame_starts(bytes, first_end);
  ASSERT_GE(starts.size(), 2u);
  bytes.resize(starts[1]);
  write_file(path, bytes);
  // `b` still has the base only: the complete delta after it is another writer's.
  fill(b.get(), g, 1, 430, 5);
  EXPECT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), &o), KVSDK_E_STATE);
  EXPECT_EQ(read_file(path), bytes);
  // Sound frames out of sequence (here the second delta's first frame right after the base) are
  // no crash artefact either.
  std::vector<unsigned char> skipped(base.begin(), base.end());
  skipped.insert(skipped.end(), bytes.begin() + long(first_end), bytes.end());
  write_file(path, skipped);
  EXPECT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), &o), KVSDK_E_STATE);
  EXPECT_EQ(read_file(path), skipped);
  // A cache loaded from the torn file applied the complete delta: it cuts the incomplete one.
  write_file(path, bytes);
  kvsdk_load_info info{};
  auto d = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(d) << kvsdk_last_error();
  EXPECT_EQ(info.journal_frames_dropped, 1u);
  fill(d.get(), g, 2, 436, 6);
  ASSERT_EQ(kvsdk_cache_save_delta(d.get(), path.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
  auto c = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(c) << kvsdk_last_error();
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  EXPECT_TRUE(dump(d.get()) == dump(c.get()));
  // `b` is still refused.
  EXPECT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), &o), KVSDK_E_STATE);
}

TEST_F(Journal, AnAppendInProgressElsewhereIsNotCut) {
  // Another append holds the file's lock while it writes: its frames so far look like an
  // unfinished delta, but they are not a crash's, so this delta waits its turn (refused).
  auto b = load_file(ctx.get(), path);
  ASSERT_TRUE(b);
  fill(b.get(), g, 2, 30, 7);
  const auto before = read_file(path);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  EXPECT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), nullptr), KVSDK_E_STATE);
  EXPECT_EQ(read_file(path), before);
  close(fd);
  ASSERT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  auto c = load_file(ctx.get(), path);
  ASSERT_TRUE(c);
  EXPECT_TRUE(dump(b.get()) == dump(c.get()));
}

TEST_F(Journal, GarbageAfterTheJournalIsATornTail) {
  fill(a.get(), g, 1, 30, 4);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK);
  auto bytes = read_file(path);
  bytes.insert(bytes.end(), {'K', 'V', 'F', 'R', 4, 0, 0, 0, 1, 2, 3});
  write_file(path, bytes);
  kvsdk_load_info info{};
  auto b = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(b) << kvsdk_last_error();
  EXPECT_EQ(info.journal_frames_applied, 1u);
  EXPECT_EQ(info.journal_frames_dropped, 1u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  // A delta from the cache cuts the garbage off and continues.
  fill(a.get(), g, 1, 31, 5);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  b = load_file(ctx.get(), path, &info);
  ASSERT_TRUE(b);
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST_F(Journal, DeltaAfterLoadContinuesTheFile) {
  auto b = load_file(ctx.get(), path);
  ASSERT_TRUE(b);
  fill(b.get(), g, 3, 30, 9);
  ASSERT_EQ(kvsdk_cache_save_delta(b.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  auto c = load_file(ctx.get(), path);
  ASSERT_TRUE(c);
  EXPECT_TRUE(dump(b.get()) == dump(c.get()));
}

TEST_F(Journal, DeltaOnlyContinuesTheCachesOwnLastSave) {
  // Never saved: STATE.
  auto fresh = make_cache(ctx.get(), g);
  EXPECT_EQ(kvsdk_cache_save_delta(fresh.get(), path.c_str(), nullptr), KVSDK_E_STATE);
  // Another cache's file: STATE, and that file is untouched.
  const std::string other = dir.file("other.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(fresh.get(), other.c_str(), nullptr), KVSDK_OK);
  const auto other_bytes = read_file(other);
  EXPECT_EQ(kvsdk_cache_save_delta(a.get(), other.c_str(), nullptr), KVSDK_E_STATE);
  EXPECT_EQ(read_file(other), other_bytes);
  // After saving a changed state elsewhere, the old file is no longer the base. (Saving the
  // same state again gives the same snapshot id: the old file then still holds exactly the base
  // a delta continues, so continuing it would be correct.)
  fill(a.get(), g, 1, 30, 4);
  ASSERT_EQ(kvsdk_cache_save(a.get(), dir.file("moved.kvsnap").c_str(), nullptr), KVSDK_OK);
  const auto old_bytes = read_file(path);
  EXPECT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_E_STATE);
  EXPECT_EQ(read_file(path), old_bytes);
  EXPECT_EQ(kvsdk_cache_save_delta(a.get(), dir.file("missing").c_str(), nullptr), KVSDK_E_IO);
  // Two caches loaded from one file: the second to journal is refused.
  auto b1 = load_file(ctx.get(), path);
  auto b2 = load_file(ctx.get(), path);
  ASSERT_TRUE(b1 && b2);
  fill(b1.get(), g, 1, 30, 1);
  fill(b2.get(), g, 1, 30, 2);
  ASSERT_EQ(kvsdk_cache_save_delta(b1.get(), path.c_str(), nullptr), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_save_delta(b2.get(), path.c_str(), nullptr), KVSDK_E_STATE);
  auto c = load_file(ctx.get(), path);
  ASSERT_TRUE(c);
  EXPECT_TRUE(dump(b1.get()) == dump(c.get()));
  EXPECT_EQ(kvsdk_cache_save_delta(nullptr, path.c_str(), nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_save_delta(a.get(), nullptr, nullptr), KVSDK_E_INVALID_ARG);
}

TEST_F(Journal, EqualStatesGiveByteIdenticalSnapshots) {
  const std::string first = dir.file("first.kvsnap"), second = dir.file("second.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), first.c_str(), nullptr), KVSDK_OK);
  auto b = load_file(ctx.get(), first);
  ASSERT_TRUE(b);
  ASSERT_EQ(kvsdk_cache_save(b.get(), second.c_str(), nullptr), KVSDK_OK);
  EXPECT_TRUE(read_file(first) == read_file(second));
  EXPECT_TRUE(save_buffer(a.get()) == read_file(first));
  fill(b.get(), g, 1, 30, 5);
  ASSERT_EQ(kvsdk_cache_save(b.get(), second.c_str(), nullptr), KVSDK_OK);
  EXPECT_FALSE(read_file(first) == read_file(second));
}

TEST_F(Journal, BufferSavesDoNotMoveTheJournalBase) {
  const auto buf = save_buffer(a.get());
  fill(a.get(), g, 2, 30, 3);
  ASSERT_EQ(kvsdk_cache_save_delta(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  auto b = load_file(ctx.get(), path);
  ASSERT_TRUE(b);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  // The buffer, written to another file, is not this cache's base.
  const std::string other = dir.file("from-buffer.kvsnap");
  write_file(other, buf);
  EXPECT_EQ(kvsdk_cache_save_delta(a.get(), other.c_str(), nullptr), KVSDK_E_STATE);
  // But a cache loaded from those bytes continues that file.
  kvsdk_status st;
  auto c = load_buffer(ctx.get(), buf, &st);
  ASSERT_EQ(st, KVSDK_OK);
  fill(c.get(), g, 1, 30, 4);
  ASSERT_EQ(kvsdk_cache_save_delta(c.get(), other.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  auto d = load_file(ctx.get(), other);
  ASSERT_TRUE(d);
  EXPECT_TRUE(dump(c.get()) == dump(d.get()));
}

}  // namespace
