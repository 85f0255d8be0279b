// Waiting for another thread's next step when it comes within microseconds: a thread blocked on
// a condition variable is woken through the kernel, which on the virtual machines and
// power-managed cores kvsdk runs on costs tens to hundreds of microseconds (idle-state exit,
// scheduling), as much as the work being waited for. So a waiter first spins for a short
// budget, watching a counter the other thread bumps (under the mutex) with every change it
// publishes, and blocks on the condition variable only after that.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace kvsdk {

// A hint to the core that this is a spin loop (x86 PAUSE, Arm YIELD).
inline void spin_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield");
#endif
}

// Returns whether `ready` (evaluated with `lock` held) became true before `deadline`: spinning
// for up to `spin` first (re-evaluating whenever `generation` moves), then blocking on `cv`.
// `lock` is held on entry and on return.
template <class Ready>
bool spin_then_wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                    const std::atomic<uint64_t>& generation, std::chrono::microseconds spin,
                    std::chrono::steady_clock::time_point deadline, Ready ready) {
  if (ready()) return true;
  const auto spin_end = std::min(std::chrono::steady_clock::now() + spin, deadline);
  uint64_t seen = generation.load(std::memory_order_acquire);
  lock.unlock();
  while (std::chrono::steady_clock::now() < spin_end) {
    for (int i = 0; i < 64; ++i) {
      if (generation.load(std::memory_order_acquire) != seen) break;
      spin_pause();
    }
    if (generation.load(std::memory_order_acquire) == seen) continue;
    lock.lock();
    if (ready()) return true;
    seen = generation.load(std::memory_order_acquire);
    lock.unlock();
  }
  lock.lock();
  return cv.wait_until(lock, deadline, ready);
}

}  // namespace kvsdk
