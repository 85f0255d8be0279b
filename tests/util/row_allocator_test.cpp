// RowAllocator (src/util/row_allocator.h): large row buffers start on a huge-page boundary and
// their whole huge pages are advised MADV_HUGEPAGE (Linux: VmFlags "hg" in /proc/self/smaps);
// small ones are plain allocations; contents behave as in any vector.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "util/row_allocator.h"

namespace {

#if defined(__linux__)
// The VmFlags of the mapping that holds `addr`, from /proc/self/smaps ("" when not found).
std::string vm_flags_at(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const uintptr_t a = uintptr_t(addr);
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}
#endif

TEST(RowAllocator, LargeBuffersStartOnAHugePageAndAreAdvised) {
  kvsdk::RowVector<uint16_t> rows(3 * kvsdk::kHugePageBytes / sizeof(uint16_t));
  std::iota(rows.begin(), rows.end(), uint16_t(0));
  EXPECT_EQ(rows[12345], uint16_t(12345));
#if defined(__linux__)
  EXPECT_EQ(uintptr_t(rows.data()) % kvsdk::kHugePageBytes, 0u);
  const std::string flags = vm_flags_at(rows.data() + kvsdk::kHugePageBytes / sizeof(uint16_t));
  if (flags.empty()) {
    // qemu-user (the aarch64 preset's test runner) shows its own mappings, not the guest's.
    GTEST_SKIP() << "no VmFlags for the buffer in /proc/self/smaps (an emulator?)";
  }
  if (flags.find(" hg") == std::string::npos) {
    // Whether this system shows an madvise at all: qemu-user accepts MADV_HUGEPAGE without
    // passing it on (the aarch64 preset's test runner). A mapping advised here directly must
    // show "hg"; where it does, the allocator's buffer must too.
    const size_t bytes = 2 * kvsdk::kHugePageBytes;
    void* probe = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    kvsdk::advise_huge_pages(probe, bytes);
    const bool shown = vm_flags_at(static_cast<char*>(probe) + kvsdk::kHugePageBytes).find(" hg") !=
                       std::string::npos;
    munmap(probe, bytes);
    if (!shown) GTEST_SKIP() << "madvise(MADV_HUGEPAGE) does not show in smaps here (an emulator?)";
  }
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
#else
  GTEST_SKIP() << "huge pages are advised on Linux only";
#endif
}

TEST(RowAllocator, SmallBuffersArePlainAndGrowLikeAnyVector) {
  kvsdk::RowVector<int32_t> positions;
  for (int32_t i = 0; i < 1000; ++i) positions.push_back(i);
  EXPECT_EQ(positions.size(), 1000u);
  EXPECT_EQ(positions[999], 999);
  kvsdk::RowVector<int32_t> copy = positions;
  EXPECT_EQ(copy, positions);
}

}  // namespace
