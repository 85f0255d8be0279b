// XXH64 matches the reference: the published empty-input value, and zstd's frame checksum (the
// low 32 bits of XXH64 of the content) for every length class; streaming equals one-shot.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <vector>

#include "xxhash64.h"

using kvsdk::format::xxh64;
using kvsdk::format::Xxh64Stream;

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

}  // namespace
