// Where snapshot bytes go: a file, a caller's buffer, a growing vector, or nowhere (size query).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace kvsdk::format {

class Sink {
 public:
  virtual ~Sink() = default;
  // Writes all `size` bytes or throws kvsdk::Error.
  virtual void write(const void* data, size_t size) = 0;
  uint64_t written() const { return written_; }

 protected:
  uint64_t written_ = 0;
};

// Counts bytes only: the size query of kvsdk_cache_save_to_buffer.
class CountingSink final : public Sink {
 public:
  void write(const void*, size_t size) override { written_ += size; }
};

// Fills a caller's fixed buffer; fails once the snapshot would overflow it.
class BufferSink final : public Sink {
 public:
  BufferSink(void* buf, size_t capacity) : buf_(static_cast<unsigned char*>(buf)), cap_(capacity) {}
  void write(const void* data, size_t size) override {
    if (size > cap_ - written_) {
      fail(KVSDK_E_INVALID_ARG, "capacity ", cap_,
           " bytes is too small for the snapshot (query the size with buf = NULL first)");
    }
    if (size) std::memcpy(buf_ + written_, data, size);
    written_ += size;
  }

 private:
  unsigned char* buf_;
  size_t cap_;
};

class VectorSink final : public Sink {
 public:
  explicit VectorSink(std::vector<unsigned char>& out) : out_(out) {}
  void write(const void* data, size_t size) override {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    out_.insert(out_.end(), p, p + size);
    written_ += size;
  }

 private:
  std::vector<unsigned char>& out_;
};

}  // namespace kvsdk::format
