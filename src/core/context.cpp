#include "core/context.h"

#include <limits>

namespace kvsdk {

uint64_t Context::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

bool Context::try_reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (budget_ != 0 && (bytes > budget_ || used_ > budget_ - bytes)) return false;
  used_ += bytes;
  return true;
}

void Context::release(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ = bytes > used_ ? 0 : used_ - bytes;
}

uint64_t Context::available() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (budget_ == 0) return std::numeric_limits<uint64_t>::max();
  return budget_ - used_;
}

}  // namespace kvsdk
