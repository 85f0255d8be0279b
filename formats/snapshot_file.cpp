#include "snapshot_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "container.h"
#include "core/error.h"
#include "frame_writer.h"
#include "kvsdk_generated.h"
#include "xxhash64.h"
#include "zstd_frame.h"

namespace kvsdk::format {

namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  fail(KVSDK_E_IO, what, " '", path, "': ", std::strerror(errno));
}

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("cannot write", path);
    }
    p += n;
    size -= size_t(n);
  }
}

bool read_all(int fd, uint64_t offset, void* out, size_t size) {
  unsigned char* p = static_cast<unsigned char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= size_t(n);
    offset += uint64_t(n);
  }
  return true;
}

class FdSink final : public Sink {
 public:
  FdSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void write(const void* data, size_t size) override {
    write_all(fd_, data, size, path_);
    written_ += size;
  }

 private:
  int fd_;
  std::string path_;
};

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Closes a descriptor on every path out of a scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void save_file_atomically(const std::string& path, const std::function<void(Sink&)>& write) {
  KVSDK_REQUIRE(!path.empty(), "path is empty");
  std::string tmp = path + ".tmp-XXXXXX";
  Fd f;
  f.fd = ::mkstemp(tmp.data());
  if (f.fd < 0) io_fail("cannot create a temporary file next to", path);
  try {
    FdSink sink(f.fd, tmp);
    write(sink);
    if (::fsync(f.fd) != 0) io_fail("cannot sync", tmp);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) io_fail("cannot close", tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail("cannot rename the snapshot to", path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable only once the directory entry is on disk.
  const std::string dir = directory_of(path);
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0 || ::fsync(d.fd) != 0) io_fail("cannot sync directory", dir);
}

MappedFile::MappedFile(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) io_fail("cannot open", path);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) io_fail("cannot stat", path);
  if (!S_ISREG(st.st_mode)) fail(KVSDK_E_IO, "'", path, "' is not a regular file");
  size_ = size_t(st.st_size);
  if (size_ == 0) return;
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (m != MAP_FAILED) {
    map_ = m;
    data_ = static_cast<const unsigned char*>(m);
    return;
  }
  copy_.resize(size_);
  if (!read_all(f.fd, 0, copy_.data(), size_)) io_fail("cannot read", path);
  data_ = copy_.data();
}

MappedFile::~MappedFile() {
  if (map_) ::munmap(map_, size_);
}

namespace {

// Verifier limits for the journal frames past a cache's journal end (as the reader's).
constexpr flatbuffers::uoffset_t kMaxDepth = 16;
constexpr flatbuffers::uoffset_t kMaxTables = 1u << 20;

// Decides whether the bytes of `path` from `base.journal_end` to `size` are a torn tail that a
// delta may cut: returns an empty string if so, else why not. A load applies a delta only once
// all its frames are sound and in order (snapshot_reader.cpp, read_journal); a crash while
// appending leaves the frames of one unfinished delta, the last of them possibly torn. So the
// tail may be cut when it holds the first frames, in order, of delta number next_sequence, none
// of them its last frame, followed by the end of the file or by bytes that are no sound frame
// (everything from there on is unreachable to a load). Anything else that verifies was written
// on purpose: a complete delta (another writer continued this file) or frames a load would
// not take for a crash artefact.
std::string foreign_journal_tail(int fd, uint64_t size, const JournalBase& base,
                                 const std::string& path) {
  uint64_t pos = base.journal_end;
  uint32_t part = 0, parts = 0;
  std::vector<unsigned char> payload, raw;
  ZstdDecompressor zstd;
  while (pos < size) {
    unsigned char fh[kFrameHeaderBytes];
    FrameHeader h;
    if (size - pos < kFrameHeaderBytes) return {};
    if (!read_all(fd, pos, fh, sizeof fh)) io_fail("cannot read", path);
    if (!decode_frame_header(fh, base.snapshot_id, &h)) return {};
    if (size - pos - kFrameHeaderBytes < h.payload_bytes) return {};
    payload.resize(h.payload_bytes);
    if (!read_all(fd, pos + kFrameHeaderBytes, payload.data(), payload.size())) {
      io_fail("cannot read", path);
    }
    if (xxh64(payload.data(), payload.size(), base.snapshot_id) != h.payload_hash) return {};
    // A sound frame of this snapshot.
    if (h.kind != uint8_t(FrameKind::kJournal)) return "a frame that is not a journal frame";
    try {
      zstd.decompress(payload.data(), payload.size(), h.raw_bytes, raw);
    } catch (const Error&) {
      return "a journal frame that does not decompress";
    }
    flatbuffers::Verifier v(raw.data(), raw.size(), kMaxDepth, kMaxTables);
    if (!fb::VerifyFrameBuffer(v)) return "a journal frame that fails verification";
    const fb::JournalDelta* d = fb::GetFrame(raw.data())->payload_as_JournalDelta();
    if (!d) return "a journal frame without a delta";
    if (d->sequence() != base.next_sequence || d->part() != part || d->parts() == 0 ||
        d->part() >= d->parts() || (part > 0 && d->parts() != parts)) {
      return "journal frames out of sequence";
    }
    if (d->part() + 1 == d->parts()) return "complete deltas";
    parts = d->parts();
    ++part;
    pos += kFrameHeaderBytes + h.payload_bytes;
  }
  return {};
}

}  // namespace

uint64_t append_journal(const std::string& path, const JournalBase& base,
                        const std::vector<std::vector<uint8_t>>& parts, int zstd_level) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f.fd < 0) io_fail("cannot open", path);
  // One appender at a time: another process's append in progress looks like a torn tail.
  if (::flock(f.fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    fail(KVSDK_E_STATE, "'", path, "' is being written by another save right now");
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) io_fail("cannot stat", path);
  const uint64_t size = uint64_t(st.st_size);
  // Is this the file of the cache's last save/load? Same snapshot id, trailer where we left it.
  unsigned char hdr[kFileHeaderBytes], trl[kTrailerBytes];
  bool same = size >= base.journal_end && base.base_end >= kFileHeaderBytes + kTrailerBytes &&
              read_all(f.fd, 0, hdr, sizeof hdr) &&
              read_all(f.fd, base.base_end - kTrailerBytes, trl, sizeof trl);
  if (same) {
    try {
      same = decode_file_header(hdr).snapshot_id == base.snapshot_id;
      decode_trailer(trl, base.snapshot_id);
    } catch (const Error&) {
      same = false;
    }
  }
  if (!same) {
    fail(KVSDK_E_STATE, "'", path, "' is not the snapshot this cache last saved or loaded ",
         "(save it in full first)");
  }
  if (size > base.journal_end) {
    // Bytes past our journal: what a crash while appending leaves (torn frames, the frames of
    // an unfinished delta) is cut off; anything else means someone else journals into this file.
    const std::string foreign = foreign_journal_tail(f.fd, size, base, path);
    if (!foreign.empty()) {
      fail(KVSDK_E_STATE, "'", path, "' has journal frames this cache did not write (", foreign,
           " after its last delta)");
    }
    // Durably cut before writing: sound frames of the old tail must not outlive the cut behind
    // a torn new frame, where a load could take them for the rest of the new delta.
    if (::ftruncate(f.fd, off_t(base.journal_end)) != 0 || ::fsync(f.fd) != 0) {
      io_fail("cannot cut the torn tail of", path);
    }
  }
  if (::lseek(f.fd, off_t(base.journal_end), SEEK_SET) < 0) io_fail("cannot seek in", path);
  FdSink sink(f.fd, path);
  FrameWriter out(sink, base.snapshot_id, zstd_level, base.journal_end);
  try {
    for (const std::vector<uint8_t>& p : parts) {
      out.write_frame(FrameKind::kJournal, p.data(), p.size());
    }
    if (::fsync(f.fd) != 0) io_fail("cannot sync", path);
  } catch (...) {
    // Best effort: leave no partial delta behind (a load would drop it anyway, and the next
    // delta cuts whatever remains).
    if (::ftruncate(f.fd, off_t(base.journal_end)) == 0) ::fsync(f.fd);
    throw;
  }
  return out.offset();
}

}  // namespace kvsdk::format
