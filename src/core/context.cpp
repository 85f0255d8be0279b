#include "core/context.h"

#include <atomic>
#include <limits>

#include "zstd_frame.h"

namespace kvsdk {

namespace {
std::atomic<int64_t> g_live_contexts{0};
}

void Context::count_live(int delta) {
  if (g_live_contexts.fetch_add(delta) + delta == 0) format::release_idle_zstd_contexts();
}

Context::~Context() { count_live(-1); }

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
