// DirectFileSink (formats/file_sink.h): the file's bytes are exactly what was written, in order,
// whether the writes bypass the page cache (staged, on a writer thread or the calling one) or not
// (file systems that refuse O_DIRECT); a failed write surfaces as KVSDK_E_IO from write() or
// finish().
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "file_sink.h"
#include "snapshot_test_util.h"
#include "util/error.h"

namespace {

using kvsdk::format::DirectFileSink;

std::vector<unsigned char> read_back(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Whether `dir`'s file system takes O_DIRECT (what the sink should find out for itself).
bool takes_direct_io(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

// Writes `total` bytes in pieces of varied sizes (1 byte up to several stages), checks the file.
void write_and_check(const std::string& dir, size_t total, bool expect_direct, bool threaded) {
  std::mt19937 rng{uint32_t(total)};
  std::vector<unsigned char> data(total);
  for (auto& b : data) b = uint8_t(rng());
  const std::string path = dir + "/out.bin";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  {
    DirectFileSink sink(fd, path, threaded);
    EXPECT_EQ(sink.direct(), expect_direct);
    size_t at = 0;
    const size_t pieces[] = {1, 7, 4096, 3 * DirectFileSink::kStageBytes + 5, 100000, 4095,
                             DirectFileSink::kStageBytes};
    for (size_t i = 0; at < total; ++i) {
      const size_t n = std::min(pieces[i % std::size(pieces)], total - at);
      sink.write(data.data() + at, n);
      at += n;
    }
    sink.finish();
    EXPECT_EQ(sink.written(), total);
    EXPECT_FALSE(sink.direct()) << "finish() leaves the descriptor for plain writes";
  }
  // The descriptor takes unaligned writes again (journal appends continue a file this way).
  const unsigned char tail[3] = {1, 2, 3};
  ASSERT_EQ(::write(fd, tail, 3), 3);
  ::close(fd);
  data.insert(data.end(), tail, tail + 3);
  EXPECT_TRUE(read_back(path) == data) << total << " bytes";
}

TEST(DirectFileSink, TheFileHoldsEveryByteInOrder) {
  kvsdk_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const bool direct = takes_direct_io(dir.path());
  if (!direct) std::printf("note: %s refuses O_DIRECT: the plain-write path runs\n", dir.path().c_str());
  for (size_t total : {size_t(0), size_t(1), size_t(4096), size_t(5000),
                       DirectFileSink::kStageBytes, DirectFileSink::kStageBytes + 1,
                       // more than the whole ring: write() waits for the writer thread
                       size_t(DirectFileSink::kStages + 3) * DirectFileSink::kStageBytes + 12345}) {
    write_and_check(dir.path(), total, direct, /*threaded=*/true);
    write_and_check(dir.path(), total, direct, /*threaded=*/false);
  }
}

// Descriptors that refuse O_DIRECT (tmpfs on older kernels, network file systems; a socket here,
// drained by a reader thread) get plain writes of the same bytes.
TEST(DirectFileSink, DescriptorsWithoutDirectIoGetPlainWrites) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  std::vector<unsigned char> got;
  std::thread reader([&] {
    unsigned char buf[65536];
    for (ssize_t n; (n = ::read(fds[1], buf, sizeof buf)) > 0;) got.insert(got.end(), buf, buf + n);
  });
  std::vector<unsigned char> data(3 * DirectFileSink::kStageBytes + 77);
  std::mt19937 rng{5};
  for (auto& b : data) b = uint8_t(rng());
  {
    DirectFileSink sink(fds[0], "socket", /*writer_thread=*/true);
    EXPECT_FALSE(sink.direct());
    sink.write(data.data(), 10);
    sink.write(data.data() + 10, data.size() - 10);
    sink.finish();
  }
  ::close(fds[0]);
  reader.join();
  ::close(fds[1]);
  EXPECT_TRUE(got == data);
}

// A device that is always full: the error of a staged write (on the writer thread) or of a plain
// one comes back as KVSDK_E_IO, from write() or at the latest from finish(), never lost.
TEST(DirectFileSink, AFailedWriteIsAnIoError) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "no /dev/full here";
  std::vector<unsigned char> chunk(DirectFileSink::kStageBytes / 2 + 1, 7);
  for (bool threaded : {true, false}) {
    kvsdk_status status = KVSDK_OK;
    try {
      DirectFileSink sink(fd, "/dev/full", threaded);
      for (int i = 0; i < 4 * DirectFileSink::kStages; ++i) sink.write(chunk.data(), chunk.size());
      sink.finish();
    } catch (const kvsdk::Error& e) {
      status = e.status();
      EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    }
    EXPECT_EQ(status, KVSDK_E_IO) << (threaded ? "writer thread" : "calling thread");
  }
  ::close(fd);
}

}  // namespace
