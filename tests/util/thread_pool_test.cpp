// The context's thread pool: every task runs exactly once, on distinct slots per job, exceptions
// reach the caller, a job submitted while the pool is busy runs on its caller's thread, and
// workers stop polling for jobs once their spin is over.
#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <time.h>
#include <vector>

namespace kvsdk {
namespace {

TEST(ThreadPool, RunsEveryTaskOnceAcrossTheCallerAndTheWorkers) {
  for (size_t threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t n : {0, 1, 3, 100}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<std::atomic<int>> slot_used(threads);
      pool.run(n, [&](size_t i) {
        hits[i].fetch_add(1);
        const size_t slot = ThreadPool::current_slot();
        ASSERT_LT(slot, threads);
        slot_used[slot].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "task " << i;
    }
  }
}

TEST(ThreadPool, ZeroThreadsMeansEveryCore) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), std::max(1u, std::thread::hardware_concurrency()));
}

TEST(ThreadPool, TheCallerIsSlotZeroAndWorkersHaveTheirOwnSlots) {
  ThreadPool pool(3);
  EXPECT_EQ(ThreadPool::current_slot(), 0u);
  std::atomic<int> on_caller{0};
  const std::thread::id caller = std::this_thread::get_id();
  pool.run(64, [&](size_t) {
    const bool here = std::this_thread::get_id() == caller;
    EXPECT_EQ(here, ThreadPool::current_slot() == 0);
    on_caller += here;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  EXPECT_GT(on_caller.load(), 0) << "the calling thread takes part";
}

TEST(ThreadPool, TheFirstExceptionReachesTheCallerAfterEveryTaskRan) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.run(10,
                        [&](size_t i) {
                          ++ran;
                          if (i == 3) throw std::runtime_error("task 3");
                        }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 10);
  // The pool still works afterwards.
  std::atomic<int> again{0};
  pool.run(5, [&](size_t) { ++again; });
  EXPECT_EQ(again.load(), 5);
}

TEST(ThreadPool, AJobWhileThePoolIsBusyRunsOnItsCallersThread) {
  ThreadPool pool(2);
  std::atomic<bool> inside{false}, release{false};
  std::thread first([&] {
    pool.run(2, [&](size_t i) {
      if (i == 0) {
        inside = true;
        while (!release) std::this_thread::yield();
      }
    });
  });
  while (!inside) std::this_thread::yield();
  const std::thread::id me = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  pool.run(8, [&](size_t) { elsewhere += std::this_thread::get_id() != me; });
  EXPECT_EQ(elsewhere.load(), 0);
  release = true;
  first.join();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Workers poll for the next job for kSpin only: an idle pool must not burn a core.
TEST(ThreadPool, IdleWorkersSleepAfterTheirSpin) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  pool.run(8, [&](size_t) { ran.fetch_add(1); });
  ASSERT_EQ(ran.load(), 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // far past kSpin
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double used = process_cpu_seconds() - before;
  // Two workers polling throughout would use 0.4 s of CPU.
  EXPECT_LT(used, 0.05) << "the pool used " << used << " s of CPU while idle";
  // And a job after the sleep still runs everywhere.
  pool.run(8, [&](size_t) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 16);
}

}  // namespace
}  // namespace kvsdk
