#include "util/thread_pool.h"

#include <algorithm>

#include "util/spin_wait.h"

namespace kvsdk {

namespace {
thread_local size_t t_slot = 0;

// Polls `ready` for at most ThreadPool::kSpin; true when it became ready.
template <class Ready>
bool poll_for(const Ready& ready) {
  const auto until = std::chrono::steady_clock::now() + ThreadPool::kSpin;
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    spin_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return false;
  }
}
}  // namespace

size_t ThreadPool::current_slot() { return t_slot; }

ThreadPool::ThreadPool(size_t n_threads) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(n_threads - 1);
  try {
    for (size_t s = 1; s < n_threads; ++s) workers_.emplace_back([this, s] { worker(s); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::worker(size_t slot) {
  t_slot = slot;
  size_t seen = 0;
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    lock.unlock();
    poll_for([&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    });
    lock.lock();
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    work_on_job();
    lock.lock();
  }
}

void ThreadPool::work_on_job() {
  std::unique_lock<std::mutex> lock(m_);
  while (next_ < n_tasks_) {
    const size_t i = next_++;
    const Trampoline call = call_;
    const void* fn = fn_;
    lock.unlock();
    std::exception_ptr e;
    try {
      call(fn, i);
    } catch (...) {
      e = std::current_exception();
    }
    lock.lock();
    if (e && !error_) error_ = e;
    if (++finished_ == n_tasks_) done_.notify_all();
  }
}

void ThreadPool::run_erased(size_t n_tasks, Trampoline call, const void* fn) {
  if (n_tasks == 0) return;
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (workers_.empty() || n_tasks == 1 || !busy.owns_lock()) {
    for (size_t i = 0; i < n_tasks; ++i) call(fn, i);  // exceptions propagate as they are
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_);
    call_ = call, fn_ = fn;
    n_tasks_ = n_tasks, next_ = 0, finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  // The caller works too, in its own slot (0, or whatever slot it already has).
  work_on_job();
  poll_for([&] { return finished_.load(std::memory_order_acquire) == n_tasks; });
  std::unique_lock<std::mutex> lock(m_);
  done_.wait(lock, [&] { return finished_ == n_tasks_; });
  n_tasks_ = 0;  // workers that wake late find nothing to claim
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace kvsdk
