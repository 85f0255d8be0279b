#include "specache_backing.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"

#if defined(__unix__) || defined(__APPLE__)
#define KVSDK_HAVE_MMAP 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace kvsdk::cpu {

namespace {

class HostBacking final : public BackingArena {
 public:
  using BackingArena::BackingArena;
  size_t add_block() override {
    if (released_ > 0) {  // the lowest released index (rare: only after a truncation)
      const size_t i = size_t(std::find(blocks_.begin(), blocks_.end(), nullptr) - blocks_.begin());
      blocks_[i] = std::make_unique<uint16_t[]>(block_elems());  // may throw: nothing changed
      --released_;
      return i;
    }
    blocks_.reserve(blocks_.size() + 1);  // may throw before anything changes
    blocks_.push_back(std::make_unique<uint16_t[]>(block_elems()));  // value-initialized: zeros
    return blocks_.size() - 1;
  }
  void release_block(size_t i) noexcept override {
    blocks_[i].reset();
    ++released_;
  }
  uint16_t* block(size_t i) override { return blocks_[i].get(); }
  const uint16_t* block(size_t i) const override { return blocks_[i].get(); }
  size_t blocks() const override { return blocks_.size() - released_; }
  std::string where() const override { return "host memory"; }

 private:
  std::vector<std::unique_ptr<uint16_t[]>> blocks_;  // null: released
  size_t released_ = 0;
};

#ifdef KVSDK_HAVE_MMAP
class FileBacking final : public BackingArena {
 public:
  FileBacking(const std::string& path, size_t block_elems)
      : BackingArena(block_elems), path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      fail(KVSDK_E_IO, "cannot create the SpeCache backing file '", path, "': ",
           std::strerror(errno));
    }
  }
  ~FileBacking() override {
    if (map_) ::munmap(map_, mapped_);
    ::close(fd_);
  }

  size_t add_block() override {
    if (released_ > 0) {  // reused in place, zeroed as a new block reads
      const size_t i = size_t(std::find(free_.begin(), free_.end(), char(1)) - free_.begin());
      std::fill_n(block(i), block_elems(), uint16_t(0));
      free_[i] = 0;
      --released_;
      return i;
    }
    // Room for this block's flag now (geometric, amortized), so that release_block() never
    // allocates.
    if (free_.size() == free_.capacity()) free_.reserve(std::max<size_t>(16, 2 * free_.size()));
    const size_t block_bytes = block_elems() * 2;
    if ((blocks_ + 1) * block_bytes > mapped_) {
      // Grow geometrically so that appends stay amortized O(1) in remaps.
      const size_t want = std::max<size_t>(mapped_ * 2, 16 * block_bytes);
      grow(want);
    }
    free_.push_back(0);  // (reserved above)
    // ftruncate zero-fills, so a new block reads as zeros.
    return blocks_++;
  }
  void release_block(size_t i) noexcept override {
    free_[i] = 1;
    ++released_;
  }
  uint16_t* block(size_t i) override { return base() + i * block_elems(); }
  const uint16_t* block(size_t i) const override {
    return reinterpret_cast<const uint16_t*>(map_) + i * block_elems();
  }
  size_t blocks() const override { return blocks_ - released_; }
  std::string where() const override { return path_; }

 private:
  uint16_t* base() { return reinterpret_cast<uint16_t*>(map_); }
  void grow(size_t bytes) {
    if (::ftruncate(fd_, off_t(bytes)) != 0) {
      const int err = errno;
      if (::ftruncate(fd_, off_t(mapped_)) != 0) { /* best effort: the old size still works */ }
      fail(KVSDK_E_IO, "cannot grow the SpeCache backing file '", path_, "' to ", bytes,
           " bytes: ", std::strerror(err));
    }
    void* m = MAP_FAILED;
#if defined(__linux__)
    if (map_) m = ::mremap(map_, mapped_, bytes, MREMAP_MAYMOVE);
#endif
    if (m == MAP_FAILED) {
      m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (m == MAP_FAILED) {
        const int err = errno;
        if (::ftruncate(fd_, off_t(mapped_)) != 0) { /* best effort */ }
        fail(KVSDK_E_NO_MEMORY, "cannot map ", bytes, " bytes of the SpeCache backing file '",
             path_, "': ", std::strerror(err));
      }
      if (map_) ::munmap(map_, mapped_);
    }
    map_ = m;
    mapped_ = bytes;
  }

  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t mapped_ = 0;  // bytes mapped = the file's size
  size_t blocks_ = 0;  // blocks ever added (released ones included)
  std::vector<char> free_;  // [blocks_]: 1 = released, to be reused
  size_t released_ = 0;
};
#endif

}  // namespace

std::unique_ptr<BackingArena> make_host_backing(size_t block_elems) {
  return std::make_unique<HostBacking>(block_elems);
}

std::unique_ptr<BackingArena> open_file_backing(const std::string& path, size_t block_elems) {
#ifdef KVSDK_HAVE_MMAP
  return std::make_unique<FileBacking>(path, block_elems);
#else
  (void)block_elems;
  fail(KVSDK_E_UNSUPPORTED, "a SpeCache backing file needs mmap (POSIX); '", path,
       "' cannot be used on this platform");
#endif
}

}  // namespace kvsdk::cpu
