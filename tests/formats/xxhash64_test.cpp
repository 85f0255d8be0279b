// XXH64 matches the reference: the published empty-input value, and zstd's frame checksum (the
// low 32 bits of XXH64 of the content) for every length class; streaming equals one-shot.
// XXH3-64 (format 6 records): the published empty-input value; record_hash picks XXH3 from
// format 6 and XXH64 before; its stream equals one-shot for both.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <vector>

#include "xxhash64.h"

using kvsdk::format::xxh64;
using kvsdk::format::Xxh64Stream;
using kvsdk::format::record_hash;
using kvsdk::format::RecordHashStream;
using kvsdk::format::xxh3_64;

namespace {

uint32_t zstd_checksum(const std::vector<unsigned char>& data) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
  std::vector<unsigned char> out(ZSTD_compressBound(data.size()));
  const size_t n = ZSTD_compress2(c, out.data(), out.size(), data.data(), data.size());
  ZSTD_freeCCtx(c);
  uint32_t sum;
  std::memcpy(&sum, out.data() + n - 4, 4);
  return sum;
}

TEST(Xxh64, EmptyInputMatchesThePublishedValue) {
  EXPECT_EQ(xxh64("", 0, 0), 0xEF46DB3751D8E999ull);
}

TEST(Xxh64, MatchesZstdFrameChecksumsForEveryLengthClass) {
  std::vector<unsigned char> data(3000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 131 + (i >> 7));
  for (size_t len : {0, 1, 3, 4, 7, 8, 15, 31, 32, 33, 63, 64, 100, 1000, 2999}) {
    std::vector<unsigned char> d(data.begin(), data.begin() + long(len));
    EXPECT_EQ(uint32_t(xxh64(d.data(), d.size(), 0)), zstd_checksum(d)) << "length " << len;
  }
}

TEST(Xxh64, StreamingEqualsOneShotAtEverySplit) {
  std::vector<unsigned char> data(200);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 3);
  for (size_t len : {0, 5, 31, 32, 64, 200}) {
    for (size_t split = 0; split <= len; ++split) {
      Xxh64Stream s(99);
      s.update(data.data(), split);
      s.update(data.data() + split, len - split);
      ASSERT_EQ(s.digest(), xxh64(data.data(), len, 99)) << len << " split " << split;
    }
  }
  EXPECT_NE(xxh64(data.data(), 64, 1), xxh64(data.data(), 64, 2)) << "the seed matters";
}

TEST(Xxh3, EmptyInputMatchesThePublishedValue) {
  EXPECT_EQ(xxh3_64("", 0, 0), 0x2D06800538D394C2ull);
}

TEST(RecordHash, Xxh3FromFormat6AndXxh64Before) {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 31 + 7);
  for (size_t len : {size_t(0), size_t(3), size_t(24), size_t(129), size_t(240), size_t(1000)}) {
    for (uint16_t major = 1; major <= 5; ++major) {
      EXPECT_EQ(record_hash(major, data.data(), len, 5), xxh64(data.data(), len, 5)) << len;
    }
    EXPECT_EQ(record_hash(6, data.data(), len, 5), xxh3_64(data.data(), len, 5)) << len;
    EXPECT_EQ(record_hash(7, data.data(), len, 5), xxh3_64(data.data(), len, 5)) << len;
  }
  EXPECT_NE(xxh3_64(data.data(), 64, 1), xxh3_64(data.data(), 64, 2)) << "the seed matters";
  EXPECT_NE(xxh3_64(data.data(), 64, 1), xxh64(data.data(), 64, 1));
}

TEST(RecordHash, StreamingEqualsOneShotForBothHashes) {
  std::vector<unsigned char> data(700);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 13 + 1);
  for (uint16_t major : {uint16_t(5), uint16_t(6)}) {
    for (size_t len : {size_t(0), size_t(32), size_t(300), size_t(700)}) {
      for (size_t split = 0; split <= len; split += 37) {
        RecordHashStream s(major, 9);
        s.update(data.data(), split);
        s.update(data.data() + split, len - split);
        ASSERT_EQ(s.digest(), record_hash(major, data.data(), len, 9))
            << major << " " << len << " split " << split;
      }
    }
  }
  // A stream reset to another format hashes as that format.
  RecordHashStream s(6, 0);
  s.update(data.data(), 100);
  s.reset(5, 0);
  s.update(data.data(), 50);
  EXPECT_EQ(s.digest(), xxh64(data.data(), 50, 0));
  s.reset(6, 3);
  s.update(data.data(), 50);
  EXPECT_EQ(s.digest(), xxh3_64(data.data(), 50, 3));
}

}  // namespace
