#include "snapshot_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "container.h"
#include "file_sink.h"
#include "frame_writer.h"
#include "kvsdk_generated.h"
#include "util/error.h"
#include "xxhash64.h"
#include "zstd_frame.h"

namespace kvsdk::format {

namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  fail(KVSDK_E_IO, what, " '", path, "': ", std::strerror(errno));
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

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string file_name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Closes a descriptor on every path out of a scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Temporary files of a save to `path` are named `path` + ".tmp-" + six characters of
// [A-Za-z0-9], as mkstemp names them. The writer holds an exclusive flock on its temporary file
// from its creation until it is renamed over `path` (or removed), so a temporary file nobody
// holds a lock on is an orphan of a writer that died.
constexpr char kTempInfix[] = ".tmp-";
constexpr size_t kTempInfixLength = sizeof kTempInfix - 1;
constexpr size_t kTempSuffixLength = 6;

bool is_temp_name_of(const std::string& name, const std::string& target) {
  if (name.size() != target.size() + kTempInfixLength + kTempSuffixLength ||
      name.compare(0, target.size(), target) != 0 ||
      name.compare(target.size(), kTempInfixLength, kTempInfix) != 0) {
    return false;
  }
  for (size_t i = target.size() + kTempInfixLength; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum) return false;
  }
  return true;
}

std::string random_temp_suffix() {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  // Unpredictability is not needed (a taken name is retried), only distinct names per process.
  thread_local std::mt19937_64 rng{
      uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (uint64_t(::getpid()) << 40) ^ uint64_t(reinterpret_cast<uintptr_t>(&rng))};
  std::string s(kTempSuffixLength, 'x');
  for (char& c : s) c = kChars[rng() % (sizeof kChars - 1)];
  return s;
}

// Removes the temporary files that earlier saves to `path` left behind when their process died
// (SIGKILL, power loss) between creating and renaming them: regular files of this user, named as
// above, that no process holds a lock on. A save in progress holds its lock, so its file stays.
// Best effort: errors leave a file where it is.
void remove_orphaned_temp_files(const std::string& path) {
  const std::string dir = directory_of(path);
  const std::string target = file_name_of(path);
  if (target.empty()) return;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> candidates;
  while (const dirent* e = ::readdir(d)) {
    if (is_temp_name_of(e->d_name, target)) candidates.emplace_back(e->d_name);
  }
  const int dfd = ::dirfd(d);
  for (const std::string& name : candidates) {
    Fd f;
    f.fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (f.fd < 0) continue;
    struct stat st;
    if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    // Held: a save is writing it right now. Any other failure (no lock support): keep it too.
    if (::flock(f.fd, LOCK_EX | LOCK_NB) != 0) continue;
    // Remove it only if the name still refers to the file we locked.
    struct stat now;
    if (::fstatat(dfd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == st.st_dev &&
        now.st_ino == st.st_ino) {
      ::unlinkat(dfd, name.c_str(), 0);
    }
  }
  ::closedir(d);
}

std::atomic<bool> g_unnamed_temp_files{true};

// Writes, syncs and renames over `path` a file opened with O_TMPFILE in `dir`: it has no name
// while it is written, so a writer killed meanwhile leaves nothing behind. It gets a temporary
// name (locked, see above) only for the instant between linking and renaming. Returns false,
// having removed whatever it made, where the system cannot link such a file; throws on errors
// that the named path would meet as well.
bool write_through_unnamed_file(const std::string& path, const std::string& dir,
                                const std::function<void(Sink&)>& write, bool writer_thread) {
#ifdef O_TMPFILE
  if (!g_unnamed_temp_files.load(std::memory_order_relaxed)) return false;
  // Linking needs /proc/self/fd (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
  if (::access("/proc/self/fd", X_OK) != 0) return false;
  Fd f;
  f.fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (f.fd < 0) return false;  // not supported by the kernel or this file system
  ::flock(f.fd, LOCK_EX);      // nobody else can reach the file yet: never blocks
  const std::string tmp_desc = path + kTempInfix + "(unnamed)";
  DirectFileSink sink(f.fd, tmp_desc, writer_thread);
  write(sink);
  sink.finish();
  if (::fsync(f.fd) != 0) io_fail("cannot sync", tmp_desc);
  const std::string proc = "/proc/self/fd/" + std::to_string(f.fd);
  std::string tmp;
  for (int attempt = 0;; ++attempt) {
    tmp = path + kTempInfix + random_temp_suffix();
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0) break;
    if (errno == EEXIST && attempt < 100) continue;
    return false;  // e.g. a sandbox that hides /proc: the caller writes a named file instead
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    io_fail("cannot rename the snapshot to", path);
  }
  return true;  // closing `f` releases the lock
#else
  (void)path, (void)dir, (void)write, (void)writer_thread;
  return false;
#endif
}

// The portable path: a named temporary file (mkstemp), locked while it exists under that name.
void write_through_named_file(const std::string& path, const std::function<void(Sink&)>& write,
                              bool writer_thread) {
  Fd f;
  std::string tmp;
  for (int attempt = 0;; ++attempt) {
    tmp = path + kTempInfix + std::string(kTempSuffixLength, 'X');
    f.fd = ::mkstemp(tmp.data());
    if (f.fd < 0) io_fail("cannot create a temporary file next to", path);
    ::fcntl(f.fd, F_SETFD, FD_CLOEXEC);
    // Between mkstemp and flock another save's cleanup may take the file for an orphan and
    // remove it (blocking here until it is done): then start over with a fresh file.
    ::flock(f.fd, LOCK_EX);
    struct stat mine, named;
    if (::fstat(f.fd, &mine) == 0 && ::stat(tmp.c_str(), &named) == 0 &&
        mine.st_dev == named.st_dev && mine.st_ino == named.st_ino) {
      break;
    }
    ::close(f.fd);
    f.fd = -1;
    if (attempt == 100) fail(KVSDK_E_IO, "cannot keep a temporary file next to '", path, "'");
  }
  try {
    DirectFileSink sink(f.fd, tmp, writer_thread);
    write(sink);
    sink.finish();
    if (::fsync(f.fd) != 0) io_fail("cannot sync", tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail("cannot rename the snapshot to", path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Closing `f` releases the lock, once the temporary name is gone.
}

}  // namespace

void set_unnamed_temp_files(bool allowed) {
  g_unnamed_temp_files.store(allowed, std::memory_order_relaxed);
}

void save_file_atomically(const std::string& path, const std::function<void(Sink&)>& write,
                          bool writer_thread) {
  KVSDK_REQUIRE(!path.empty(), "path is empty");
  const std::string dir = directory_of(path);
  remove_orphaned_temp_files(path);
  if (!write_through_unnamed_file(path, dir, write, writer_thread)) {
    write_through_named_file(path, write, writer_thread);
  }
  // The rename is durable only once the directory entry is on disk.
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
    if (!decode_frame_header(fh, base.snapshot_id, &h, base.format_major)) return {};
    if (size - pos - kFrameHeaderBytes < h.payload_bytes) return {};
    payload.resize(h.payload_bytes);
    if (!read_all(fd, pos + kFrameHeaderBytes, payload.data(), payload.size())) {
      io_fail("cannot read", path);
    }
    if (record_hash(base.format_major, payload.data(), payload.size(), base.snapshot_id) !=
        h.payload_hash) {
      return {};
    }
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
                        const std::vector<std::vector<uint8_t>>& parts, int zstd_level,
                        ThreadPool* pool) {
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
      decode_trailer(trl, base.snapshot_id, base.format_major);
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
  FrameWriter out(sink, base.snapshot_id, zstd_level, base.journal_end, pool);
  out.continue_format(base.format_major);
  try {
    for (const std::vector<uint8_t>& p : parts) {
      out.write_frame(FrameKind::kJournal, p.data(), p.size());
    }
    out.flush();  // a pool queues frames until its window is full
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
