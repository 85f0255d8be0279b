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

Context::~Context() {
  if (arena_) {
    try {
      const DeviceScope on_device(*this);
      if (queue_) device_backend_->queue_destroy(queue_);  // (waits for its work first)
      ops_->free(arena_);
    } catch (...) {  // (a failed device cannot take its memory back either)
    }
  }
  count_live(-1);
}

backend::DeviceQueue* Context::create_queue() {
  if (!arena_ || !device_backend_) return nullptr;
  try {
    const int32_t previous = device_backend_->select_device(device_);
    backend::DeviceQueue* queue = nullptr;
    try {
      queue = device_backend_->queue_create();
    } catch (...) {
      device_backend_->select_device(previous);
      throw;
    }
    device_backend_->select_device(previous);
    return queue;
  } catch (...) {  // the constructor fails: nothing else will free the arena
    try {
      const int32_t previous = device_backend_->select_device(device_);
      ops_->free(arena_);
      device_backend_->select_device(previous);
    } catch (...) {
    }
    throw;
  }
}

void* Context::allocate_arena() const {
  const backend::Ops& ops = *ops_;
  const uint64_t budget = budget_;
  if (!ops.device_memory) return nullptr;
  KVSDK_REQUIRE(budget > 0, "a ", ops.name, " context needs budget_bytes > 0: its caches live in ",
                "one device allocation of exactly the budget, made when the context is created");
  if (budget > std::numeric_limits<size_t>::max()) {
    fail(KVSDK_E_NO_MEMORY, "budget_bytes ", budget, " exceeds the address space");
  }
  // (Not a DeviceScope: the regions it would lock are made after the arena.)
  const int32_t previous = device_backend_ ? device_backend_->select_device(device_) : 0;
  void* arena = ops.alloc(size_t(budget));
  if (device_backend_) device_backend_->select_device(previous);
  if (!arena) {
    fail(KVSDK_E_NO_MEMORY, "the ", ops.name, " device cannot allocate the budget's arena (",
         budget, " bytes)");
  }
  return arena;
}

Context::DeviceScope::DeviceScope(const Context& ctx) : device_(ctx.device_backend_) {
  if (ctx.regions_) hold_ = std::unique_lock<std::recursive_mutex>(ctx.regions_->lock());
  if (device_) {
    previous_ = device_->select_device(ctx.device_);
    previous_queue_ = device_->bind_queue(ctx.queue_);
  }
}

Context::DeviceScope::~DeviceScope() {
  if (!device_) return;
  device_->bind_queue(previous_queue_);
  try {
    device_->select_device(previous_);
  } catch (...) {  // (the device failed; the call that follows reports it)
  }
}

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
