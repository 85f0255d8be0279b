// The allocator of stored rows: large buffers are backed by transparent huge pages.
//
// Why: a cache's rows are the bulk of its memory, and they are written once, page by page, when
// they are appended or loaded. With 4 KiB pages that first touch costs a page fault per 4 KiB:
// measured on this project's 2-core x86-64 VM, copying 128 MiB into fresh memory takes 63 ms with
// 4 KiB pages and 13.5 ms once the buffer is advised MADV_HUGEPAGE (one fault per 2 MiB), so
// faults, not the copy, were most of a large snapshot load. Most Linux systems (Debian's default
// included) give huge pages only to memory advised so ("madvise" mode).
//
// What it costs: nothing in bytes. A buffer of at least 2 MiB starts on a 2 MiB boundary (address
// space only: glibc's aligned allocation leaves the padding untouched) and only its whole 2 MiB
// blocks are advised; its tail keeps 4 KiB pages, so it never commits more memory than a plain
// allocation that is written in full. Smaller buffers are plain malloc. Elsewhere than Linux
// every buffer is plain malloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvsdk {

constexpr size_t kHugePageBytes = size_t(2) << 20;

// Advises the whole huge pages inside [p, p + bytes) (no-op elsewhere than Linux). Failure is
// harmless (the kernel then keeps 4 KiB pages), so it is ignored.
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t begin = (uintptr_t(p) + kHugePageBytes - 1) & ~uintptr_t(kHugePageBytes - 1);
  const uintptr_t end = (uintptr_t(p) + bytes) & ~uintptr_t(kHugePageBytes - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

template <class T>
struct RowAllocator {
  using value_type = T;
  RowAllocator() = default;
  template <class U>
  RowAllocator(const RowAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    const size_t bytes = n * sizeof(T);
    void* p = nullptr;
#if defined(__linux__)
    if (bytes >= kHugePageBytes) {
      if (posix_memalign(&p, kHugePageBytes, bytes) != 0) throw std::bad_alloc();
      advise_huge_pages(p, bytes);
      return static_cast<T*>(p);
    }
#endif
    p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }

  template <class U>
  bool operator==(const RowAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const RowAllocator<U>&) const noexcept { return false; }
};

// A vector of stored rows (keys, values, positions).
template <class T>
using RowVector = std::vector<T, RowAllocator<T>>;

}  // namespace kvsdk
