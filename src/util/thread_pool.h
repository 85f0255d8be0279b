// The context's thread pool (kvsdk_context_options.n_threads): n_threads - 1 worker threads plus
// the calling thread, which always takes part. Between jobs a worker first polls for the next
// one for at most kSpin, then sleeps on a condition variable, so an idle context costs no CPU
// after that. Why poll: a decode step posts one short job per layer (a few hundred microseconds
// at 32k tokens), and waking a sleeping thread costs tens to hundreds of microseconds on
// virtual machines and phones; the caller polls for the last task the same way.
//
// One job at a time: a call to run() while another thread's job occupies the pool runs its tasks
// on the calling thread alone instead of waiting (an app that attends from several threads at
// once gets its own threads' parallelism, never a queue behind another conversation). Tasks of a
// job must not call run() on the same pool (they would run serially, which is correct but slow).
//
// Each thread knows its slot (0 for any thread outside the pool, 1 .. size()-1 for the workers),
// so per-slot working memory needs no locking: a job's tasks never share a slot.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kvsdk {

class ThreadPool {
 public:
  // n_threads: total threads including the caller's; 0 = every core the system reports.
  // Throws std::system_error when a thread cannot be started (nothing is left running).
  explicit ThreadPool(size_t n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }
  // How long a worker polls for the next job, and the caller for its job's last task, before
  // sleeping.
  static constexpr std::chrono::microseconds kSpin{100};
  // The slot of the calling thread (see above).
  static size_t current_slot();

  // Runs task(i) for i in [0, n_tasks) across the pool and the calling thread, and returns when
  // every task has finished. The first exception a task throws is rethrown here (the other tasks
  // still run to completion). Allocates nothing.
  template <class F>
  void run(size_t n_tasks, const F& task) {
    run_erased(n_tasks, [](const void* f, size_t i) { (*static_cast<const F*>(f))(i); }, &task);
  }

 private:
  using Trampoline = void (*)(const void*, size_t);
  void run_erased(size_t n_tasks, Trampoline call, const void* fn);
  void worker(size_t slot);
  void work_on_job();  // claims and runs tasks of the current job until none are left

  std::vector<std::thread> workers_;
  std::mutex busy_;  // held by the thread whose job occupies the pool
  std::mutex m_;
  std::condition_variable wake_, done_;
  // Written under m_; atomic so that the polls above may read them without it.
  std::atomic<bool> stop_{false};
  std::atomic<size_t> generation_{0};  // bumped for every job
  std::atomic<size_t> finished_{0};
  // The current job (guarded by m_).
  Trampoline call_ = nullptr;
  const void* fn_ = nullptr;
  size_t n_tasks_ = 0, next_ = 0;
  std::exception_ptr error_;
};

}  // namespace kvsdk
