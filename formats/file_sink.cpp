#include "file_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/error.h"

namespace kvsdk::format {

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(KVSDK_E_IO, "cannot write '", path, "': ", std::strerror(errno));
    }
    p += n;
    size -= size_t(n);
  }
}

void FdSink::write(const void* data, size_t size) {
  write_all(fd_, data, size, path_);
  written_ += size;
}

DirectFileSink::DirectFileSink(int fd, std::string path, bool writer_thread)
    : fd_(fd), path_(std::move(path)), threaded_(writer_thread) {
#ifdef O_DIRECT
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_DIRECT) != 0) return;  // e.g. tmpfs: EINVAL
  for (unsigned char*& stage : stage_) {
    void* p = nullptr;
    if (::posix_memalign(&p, kAlign, kStageBytes) != 0) {
      leave_direct_mode();  // (no writes yet: cannot fail where setting it did not)
      return;
    }
    stage = static_cast<unsigned char*>(p);
  }
  staging_ = direct_ = true;
#endif
}

DirectFileSink::~DirectFileSink() {
  stop_writer();
  for (unsigned char* stage : stage_) std::free(stage);
}

void DirectFileSink::stop_writer() noexcept {
  if (!writer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  writer_.join();  // (it writes a pending stage first)
}

void DirectFileSink::leave_direct_mode() {
#ifdef O_DIRECT
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
    fail(KVSDK_E_IO, "cannot write '", path_, "' through the page cache: ", std::strerror(errno));
  }
#endif
  direct_ = false;
}

void DirectFileSink::write_stage(const unsigned char* p, size_t n) {
  size_t done = 0;
  while (direct_ && done < n) {
    const ssize_t w = ::write(fd_, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EINVAL) {
      fail(KVSDK_E_IO, "cannot write '", path_, "': ", std::strerror(errno));
    }
    if (w < 0 || size_t(w) % kAlign != 0) {
      // Refused at write time (a file system that took the flag but not this alignment), or a
      // short write that leaves the offset unaligned: the rest goes through the page cache.
      if (w > 0) done += size_t(w);
      leave_direct_mode();
      break;
    }
    done += size_t(w);
  }
  if (done < n) write_all(fd_, p + done, n - done, path_);
}

void DirectFileSink::writer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return pending_ > 0 || stop_; });
    if (pending_ == 0) return;
    const unsigned char* stage = stage_[next_];
    lock.unlock();
    std::exception_ptr error;
    try {
      write_stage(stage, kStageBytes);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    next_ = (next_ + 1) % kStages;
    --pending_;
    if (error) error_ = error;
    changed_.notify_all();
    if (error) {
      pending_ = 0;  // (the writes after a failed one are not made)
      return;
    }
  }
}

void DirectFileSink::hand_off() {
  if (!threaded_) {
    write_stage(stage_[filling_], kStageBytes);
    staged_ = 0;
    return;
  }
  if (!writer_.joinable()) writer_ = std::thread([this] { writer_loop(); });
  std::unique_lock<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  ++pending_;  // the stage filling_, right after the others pending
  changed_.notify_all();
  filling_ = (filling_ + 1) % kStages;
  staged_ = 0;
  changed_.wait(lock, [this] { return pending_ < kStages || error_; });  // filling_ is free
  if (error_) std::rethrow_exception(error_);
}

void DirectFileSink::write(const void* data, size_t size) {
  if (!staging_) {
    write_all(fd_, data, size, path_);
    written_ += size;
    return;
  }
  const unsigned char* p = static_cast<const unsigned char*>(data);
  size_t left = size;
  while (left > 0) {
    const size_t take = std::min(left, kStageBytes - staged_);
    std::memcpy(stage_[filling_] + staged_, p, take);
    staged_ += take;
    p += take;
    left -= take;
    if (staged_ == kStageBytes) hand_off();
  }
  written_ += size;
}

void DirectFileSink::finish() {
  if (!staging_) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return pending_ == 0; });
  }
  stop_writer();
  staging_ = false;  // whatever happens below, no more stages
  if (error_) std::rethrow_exception(error_);
  // The whole blocks bypass the cache; the tail (not a multiple of the block size) cannot.
  const size_t whole = direct_ ? staged_ / kAlign * kAlign : 0;
  if (whole > 0) write_stage(stage_[filling_], whole);
  if (direct_) leave_direct_mode();
  write_all(fd_, stage_[filling_] + whole, staged_ - whole, path_);
  staged_ = 0;
}

}  // namespace kvsdk::format
