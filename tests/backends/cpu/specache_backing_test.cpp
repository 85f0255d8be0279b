// SpeCache's backing arenas: host memory and an mmap'ed file hold the same rows through many
// growths (the file mapping moves), new blocks read as zeros, the file has the blocks' size, and
// a file that cannot be created is KVSDK_E_IO.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "reference_attention.h"
#include "specache.h"
#include "specache_backing.h"
#include "util/error.h"

using namespace kvsdk::cpu;
using namespace kvsdk_test;

namespace {

std::string temp_path() {
  char path[] = "/tmp/kvsdk_specache_backing_XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  return path;
}

TEST(SpeCacheBacking, HostAndFileArenasHoldTheSameBlocks) {
  const std::string path = temp_path();
  const size_t elems = 1000;
  auto host = make_host_backing(elems);
  auto file = open_file_backing(path, elems);
  EXPECT_EQ(host->where(), "host memory");
  EXPECT_EQ(file->where(), path);
  for (size_t b = 0; b < 100; ++b) {  // 100 blocks: the mapping grows (and may move) 3 times
    ASSERT_EQ(host->add_block(), b);
    ASSERT_EQ(file->add_block(), b);
    for (size_t i = 0; i < elems; ++i) {
      ASSERT_EQ(file->block(b)[i], 0u);
      ASSERT_EQ(host->block(b)[i], 0u);
      host->block(b)[i] = file->block(b)[i] = uint16_t(b * 7919 + i);
    }
  }
  for (size_t b = 0; b < 100; ++b) {
    for (size_t i = 0; i < elems; i += 37) ASSERT_EQ(file->block(b)[i], uint16_t(b * 7919 + i)) << b;
  }
  EXPECT_EQ(host->bytes(), 100u * elems * 2);
  EXPECT_EQ(file->bytes(), host->bytes());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_GE(uint64_t(st.st_size), file->bytes());  // plus growth headroom
  file.reset();
  EXPECT_EQ(stat(path.c_str(), &st), 0);  // kept after the arena is gone
  std::remove(path.c_str());
}

TEST(SpeCacheBacking, StoresInAFileReadBackTheirRows) {
  const std::string path = temp_path();
  const size_t dim = 16, n = 200;
  std::shared_ptr<BackingArena> arena = open_file_backing(path, SpeCacheBackingStore::block_elems(dim));
  SpeCacheBackingStore a(dim, arena), b(dim, arena), host(dim);
  const std::vector<float> k = normal_rows(n * dim, 1), v = normal_rows(n * dim, 2);
  for (size_t t = 0; t < n; t += 25) {  // interleaved growth of two heads in one file
    a.append(&k[t * dim], &v[t * dim], 25);
    b.append(&v[t * dim], &k[t * dim], 25);
    host.append(&k[t * dim], &v[t * dim], 25);
  }
  ASSERT_EQ(a.size(), n);
  for (size_t t = 0; t < n; ++t) {
    for (size_t d = 0; d < dim; ++d) {
      ASSERT_EQ(a.key_row(t)[d], kvsdk::f32_to_f16(k[t * dim + d]));
      ASSERT_EQ(a.value_row(t)[d], host.value_row(t)[d]);
      ASSERT_EQ(b.key_row(t)[d], kvsdk::f32_to_f16(v[t * dim + d]));
    }
  }
  EXPECT_EQ(a.bytes(), host.bytes());
  EXPECT_EQ(arena->bytes(), a.bytes() + b.bytes());
  std::remove(path.c_str());
}

// kvsdk_cache_truncate: a head that removes rows gives blocks left empty back to its arena, which
// hands them out again (zeroed) before it grows; the rows kept and the rows appended afterwards
// read as in a store that never held the removed ones.
TEST(SpeCacheBacking, RemovedRowsGiveTheirBlocksBack) {
  const std::string path = temp_path();
  const size_t dim = 8, n = 150, B = SpeCacheBackingStore::kBlockTokens;
  for (const bool in_file : {false, true}) {
    SCOPED_TRACE(in_file ? "file" : "host");
    std::shared_ptr<BackingArena> arena =
        in_file ? std::shared_ptr<BackingArena>(
                      open_file_backing(path, SpeCacheBackingStore::block_elems(dim)))
                : make_host_backing(SpeCacheBackingStore::block_elems(dim));
    SpeCacheBackingStore a(dim, arena), never(dim, arena);
    const std::vector<float> k = normal_rows(n * dim, 3), v = normal_rows(n * dim, 4);
    std::vector<int32_t> pos(n);
    for (size_t t = 0; t < n; ++t) pos[t] = int32_t(t);
    pos[100] = 10;  // an older position after the cut stays (removal goes by position)
    a.append(k.data(), v.data(), n);  // 3 blocks
    ASSERT_EQ(arena->blocks(), 3u);
    EXPECT_EQ(a.remove_from(2, pos.data(), 60), n - 61);  // keeps rows 0..59 and row 100
    ASSERT_EQ(a.size(), 61u);
    EXPECT_EQ(a.bytes(), uint64_t(2 * B * dim * 2));  // blocks 1 and 2 went back
    EXPECT_EQ(arena->bytes(), a.bytes());
    EXPECT_EQ(a.remove_from(0, pos.data(), 1000), 0u);  // nothing at or past 1000
    // The store that never held the removed rows, appended in the released blocks.
    never.append(k.data(), v.data(), 60);
    never.append(&k[100 * dim], &v[100 * dim], 1);
    EXPECT_EQ(arena->blocks(), 2u);  // block 1 was reused
    for (size_t t = 0; t < 61; ++t) {
      for (size_t d = 0; d < dim; ++d) {
        ASSERT_EQ(a.key_row(t)[d], never.key_row(t)[d]) << t;
        ASSERT_EQ(a.value_row(t)[d], never.value_row(t)[d]) << t;
      }
    }
    a.append(k.data(), v.data(), 10);  // grows into a reused, zeroed block
    EXPECT_EQ(a.key_row(70)[3], kvsdk::f32_to_f16(k[9 * dim + 3]));
    EXPECT_EQ(arena->blocks(), 3u);
  }
  std::remove(path.c_str());
}

TEST(SpeCacheBacking, UncreatableFileIsAnIoError) {
  try {
    open_file_backing("/nonexistent-dir-kvsdk/backing.bin", 64);
    ADD_FAILURE() << "accepted";
  } catch (const kvsdk::Error& e) {
    EXPECT_EQ(e.status(), KVSDK_E_IO);
  }
  // A store refuses an arena whose blocks do not fit its dimension.
  std::shared_ptr<BackingArena> arena = make_host_backing(10);
  EXPECT_THROW(SpeCacheBackingStore(16, arena), kvsdk::Error);
}

}  // namespace
