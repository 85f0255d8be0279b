// Fibers on Boost.Context's fcontext (make_fcontext/jump_fcontext: a register switch, no system
// call; ucontext's swapcontext changes the signal mask on every switch, and under ASan its
// interceptor also clears the target stack's shadow, which made the kernel tests 20x slower).
// Each thread of a block gets its own stack (mmap'd, with a guard page below it so a runaway
// kernel frame faults instead of corrupting a neighbour) and runs until it finishes or waits at
// a barrier; the scheduler (the caller's stack) resumes runnable threads in thread order and
// releases a barrier once every live thread of its scope has arrived. Under AddressSanitizer
// every switch is announced (__sanitizer_start/finish_switch_fiber), so ASan follows the stacks
// and its reports inside kernels stay precise. Under ThreadSanitizer each thread slot is a TSan
// fiber (created once, reused like its stack) and every switch is announced with
// synchronization (__tsan_switch_to_fiber): the threads of a block run one at a time on one OS
// thread, so TSan sees them ordered, never racing each other (the shim cannot show those races
// anyway: docs/gpu.md), and it keeps following the host threads around the launches.
#include "block_runner.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <boost/context/detail/fcontext.hpp>

#if defined(__SANITIZE_ADDRESS__)
#define KVSDK_HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSDK_HOST_ASAN 1
#endif
#endif
#ifdef KVSDK_HOST_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__)
#define KVSDK_HOST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVSDK_HOST_TSAN 1
#endif
#endif
#ifdef KVSDK_HOST_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace kvsdk::cuda_host {
namespace {

namespace ctx = boost::context::detail;

constexpr unsigned kWarp = 32;
constexpr unsigned kMaxThreads = 1024;
// Kernel frames are small (registers become locals); sanitizers enlarge them several times.
#ifdef KVSDK_HOST_ASAN
constexpr size_t kStackBytes = size_t(1) << 20;
#else
constexpr size_t kStackBytes = size_t(256) << 10;
#endif

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Stack {
  void* base = nullptr;  // the guard page
  size_t bytes = 0;      // guard included
  Stack() = default;
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  Stack(Stack&& o) noexcept : base(o.base), bytes(o.bytes) { o.base = nullptr; }
  ~Stack() {
    if (base) munmap(base, bytes);
  }
  char* usable() const { return static_cast<char*>(base) + page(); }
  size_t usable_bytes() const { return bytes - page(); }
  static size_t page() { return size_t(sysconf(_SC_PAGESIZE)); }
  bool allocate() {
    bytes = kStackBytes + page();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return false;
    base = p;
    mprotect(base, page(), PROT_NONE);
    return true;
  }
};

struct Thread {
  ctx::fcontext_t ctx = nullptr;
  State state = State::kRunnable;
  Dim3 idx;
  unsigned linear = 0;
  uint64_t deposit = 0;
  unsigned src_lane = 0;
  uint64_t received = 0;
};

struct Block {
  std::vector<Thread> threads;
  ctx::fcontext_t scheduler = nullptr;
  Thread* current = nullptr;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  Dim3 block_idx, block_dim, grid_dim;
  int or_accumulator = 0, or_result = 0;
#ifdef KVSDK_HOST_ASAN
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_bytes = 0;
#endif
#ifdef KVSDK_HOST_TSAN
  void* tsan_scheduler = nullptr;  // the launching thread's TSan context
#endif
};

thread_local Block* g_block = nullptr;
thread_local std::vector<Stack> g_stacks;  // reused across blocks and launches
#ifdef KVSDK_HOST_TSAN
thread_local std::vector<void*> g_tsan_fibers;  // one per stack, reused the same way
#endif
const Dim3 kNoDim{0, 0, 0};

#ifdef KVSDK_HOST_ASAN
void enter_fiber(Thread& t, void** fake) {
  const Stack& s = g_stacks[t.linear];
  __sanitizer_start_switch_fiber(fake, s.usable(), s.usable_bytes());
}
#endif

// Fiber side of a switch back to the scheduler. `finished`: the fiber never runs again.
void to_scheduler(Thread& t, bool finished) {
  Block& b = *g_block;
  (void)t;
#ifdef KVSDK_HOST_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, b.scheduler_stack,
                                 b.scheduler_stack_bytes);
#else
  (void)finished;
#endif
#ifdef KVSDK_HOST_TSAN
  __tsan_switch_to_fiber(b.tsan_scheduler, 0);
#endif
  // Resumed by the scheduler's next jump, which hands over its own (new) context.
  b.scheduler = ctx::jump_fcontext(b.scheduler, nullptr).fctx;
#ifdef KVSDK_HOST_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_main(ctx::transfer_t from) {
  Block& b = *g_block;
  b.scheduler = from.fctx;
  Thread& t = *b.current;
#ifdef KVSDK_HOST_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b.scheduler_stack, &b.scheduler_stack_bytes);
#endif
  b.body(b.arg);
  t.state = State::kDone;
  to_scheduler(t, true);  // never resumed
}

void resume(Block& b, Thread& t) {
  b.current = &t;
#ifdef KVSDK_HOST_ASAN
  void* fake = nullptr;
  enter_fiber(t, &fake);
#endif
#ifdef KVSDK_HOST_TSAN
  __tsan_switch_to_fiber(g_tsan_fibers[t.linear], 0);
#endif
  t.ctx = ctx::jump_fcontext(t.ctx, nullptr).fctx;  // back here when the thread yields or ends
#ifdef KVSDK_HOST_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  b.current = nullptr;
}

// Releases a barrier whose scope has fully arrived; false when none can be released.
bool release(Block& b) {
  size_t live = 0, at_block = 0;
  for (const Thread& t : b.threads) {
    live += t.state != State::kDone;
    at_block += t.state == State::kAtBlockBarrier;
  }
  if (at_block > 0 && at_block == live) {
    b.or_result = b.or_accumulator;
    b.or_accumulator = 0;
    for (Thread& t : b.threads) {
      if (t.state == State::kAtBlockBarrier) t.state = State::kRunnable;
    }
    return true;
  }
  bool released = false;
  const size_t n = b.threads.size();
  for (size_t w0 = 0; w0 < n; w0 += kWarp) {
    const size_t w1 = std::min(n, w0 + kWarp);
    size_t warp_live = 0, waiting = 0;
    for (size_t i = w0; i < w1; ++i) {
      warp_live += b.threads[i].state != State::kDone;
      waiting += b.threads[i].state == State::kAtWarpBarrier;
    }
    if (waiting == 0 || waiting != warp_live) continue;
    for (size_t i = w0; i < w1; ++i) {
      Thread& t = b.threads[i];
      if (t.state != State::kAtWarpBarrier) continue;
      const size_t src = w0 + t.src_lane;
      const bool valid = t.src_lane < kWarp && src < w1 && b.threads[src].state != State::kDone;
      t.received = valid ? b.threads[src].deposit : t.deposit;
    }
    for (size_t i = w0; i < w1; ++i) {
      if (b.threads[i].state == State::kAtWarpBarrier) b.threads[i].state = State::kRunnable;
    }
    released = true;
  }
  return released;
}

bool run_block(Block& b, const char** error) {
  const unsigned n = b.block_dim.x * b.block_dim.y * b.block_dim.z;
  b.threads.assign(n, Thread{});
  b.or_accumulator = b.or_result = 0;
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.linear = i;
    t.idx = {i % b.block_dim.x, (i / b.block_dim.x) % b.block_dim.y,
             i / (b.block_dim.x * b.block_dim.y)};
    // make_fcontext takes the top of the stack (it grows down).
    t.ctx = ctx::make_fcontext(g_stacks[i].usable() + g_stacks[i].usable_bytes(),
                               g_stacks[i].usable_bytes(), fiber_main);
  }
  for (;;) {
    bool ran = false;
    for (Thread& t : b.threads) {
      if (t.state != State::kRunnable) continue;
      resume(b, t);
      ran = true;
    }
    if (ran) continue;
    bool done = true;
    for (const Thread& t : b.threads) done = done && t.state == State::kDone;
    if (done) return true;
    if (!release(b)) {
      // Threads wait at barriers that cannot complete (some at __syncthreads, others at a warp
      // shuffle): on a GPU this hangs or is undefined. The fibers are abandoned (their stacks are
      // reused by the next launch).
      *error = "barrier divergence: the threads of a block wait at different barriers";
      return false;
    }
  }
}

}  // namespace

const Dim3& thread_idx() { return g_block && g_block->current ? g_block->current->idx : kNoDim; }
const Dim3& block_idx() { return g_block ? g_block->block_idx : kNoDim; }
const Dim3& block_dim() { return g_block ? g_block->block_dim : kNoDim; }
const Dim3& grid_dim() { return g_block ? g_block->grid_dim : kNoDim; }

unsigned lane_id() { return g_block->current->linear % kWarp; }

int block_barrier(int predicate) {
  Block& b = *g_block;
  Thread& t = *b.current;
  b.or_accumulator |= predicate != 0;
  t.state = State::kAtBlockBarrier;
  to_scheduler(t, false);
  return b.or_result;
}

uint64_t warp_exchange(uint64_t value, unsigned src_lane) {
  Block& b = *g_block;
  Thread& t = *b.current;
  t.deposit = value;
  t.src_lane = src_lane;
  t.state = State::kAtWarpBarrier;
  to_scheduler(t, false);
  return t.received;
}

bool run_grid(Dim3 grid, Dim3 block, void (*body)(void*), void* arg, const char** error) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > kMaxThreads ||
      block.z > 64 || grid.y > 65535 || grid.z > 65535) {
    *error = "invalid launch configuration";
    return false;
  }
  if (g_block) {
    *error = "a kernel launched another kernel (dynamic parallelism is not supported)";
    return false;
  }
  while (g_stacks.size() < threads) {
    Stack s;
    if (!s.allocate()) {
      *error = "out of memory for thread stacks";
      return false;
    }
    g_stacks.push_back(std::move(s));
  }
#ifdef KVSDK_HOST_TSAN
  while (g_tsan_fibers.size() < threads) g_tsan_fibers.push_back(__tsan_create_fiber(0));
#endif
  Block b;
#ifdef KVSDK_HOST_TSAN
  b.tsan_scheduler = __tsan_get_current_fiber();
#endif
  b.body = body;
  b.arg = arg;
  b.block_dim = block;
  b.grid_dim = grid;
  g_block = &b;
  bool ok = true;
  for (unsigned z = 0; ok && z < grid.z; ++z) {
    for (unsigned y = 0; ok && y < grid.y; ++y) {
      for (unsigned x = 0; ok && x < grid.x; ++x) {
        b.block_idx = {x, y, z};
        ok = run_block(b, error);
      }
    }
  }
  g_block = nullptr;
  return ok;
}

}  // namespace kvsdk::cuda_host
