// A process killed (SIGKILL) at random points while saving never damages the previous snapshot:
// full saves are atomic (temp file + fsync + rename) and a torn journal append is dropped.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "kvsdk.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

const kvsdk_geometry kGeo = make_geometry(4, 4, 2, 32);
constexpr size_t kStep = 16;  // tokens per save step

// The cache after `steps` steps: step s appends kStep tokens with seed s.
CachePtr reference(kvsdk_context* ctx, size_t steps) {
  auto c = make_cache(ctx, kGeo);
  for (size_t s = 0; s < steps; ++s) fill(c.get(), kGeo, kStep, int32_t(s * kStep), uint32_t(s + 1));
  return c;
}

// Child: grows the cache and saves after every step until killed.
[[noreturn]] void saver(const std::string& path, bool journal) {
  auto ctx = make_context();
  auto c = make_cache(ctx.get(), kGeo);
  fill(c.get(), kGeo, kStep, 0, 1);
  kvsdk_cache* loaded = nullptr;
  if (kvsdk_cache_load(&loaded, ctx.get(), path.c_str(), nullptr, nullptr) != KVSDK_OK) _exit(2);
  // Continue from what is on disk so the file's content stays a prefix of the reference.
  c.reset(loaded);
  size_t tokens = 0;
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  kvsdk_cache_stats_get(c.get(), &st);
  tokens = st.appended_tokens / kGeo.n_layers;
  for (size_t s = tokens / kStep;; ++s) {
    fill(c.get(), kGeo, kStep, int32_t(s * kStep), uint32_t(s + 1));
    const kvsdk_status r = journal ? kvsdk_cache_save_delta(c.get(), path.c_str(), nullptr)
                                   : kvsdk_cache_save(c.get(), path.c_str(), nullptr);
    if (r != KVSDK_OK) _exit(4);
  }
}

// Waits (up to 20 s) until `path` is replaced or grows.
void wait_for_a_save(const std::string& path) {
  struct stat before;
  if (stat(path.c_str(), &before) != 0) return;
  for (int i = 0; i < 20000; ++i) {
    struct stat now;
    if (stat(path.c_str(), &now) == 0 &&
        (now.st_ino != before.st_ino || now.st_size != before.st_size)) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void kill_during_saves(bool journal) {
  TempDir dir;
  const std::string path = dir.file("crash.kvsnap");
  auto ctx = make_context();
  {
    auto first = reference(ctx.get(), 1);
    ASSERT_EQ(kvsdk_cache_save(first.get(), path.c_str(), nullptr), KVSDK_OK);
  }
  std::mt19937 rng(journal ? 7 : 3);
  size_t last_steps = 1;
  for (int round = 0; round < 12; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) saver(path, journal);
    // Every other round first waits for one completed save (a new file or a longer journal), so
    // the test makes progress however slow the machine (sanitizers, shared CI); then the kill
    // lands at a random point of a later save.
    if (round % 2 == 1) wait_for_a_save(path);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver stopped by itself with " << WEXITSTATUS(status);
    kvsdk_cache* c = nullptr;
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(kvsdk_cache_load(&c, ctx.get(), path.c_str(), nullptr, &info), KVSDK_OK)
        << "round " << round << ": " << kvsdk_last_error();
    CachePtr loaded(c);
    EXPECT_LE(info.journal_frames_dropped, 1u);
    const CacheDump d = dump(loaded.get());
    const size_t steps = d.stats.appended_tokens / kGeo.n_layers / kStep;
    EXPECT_GE(steps, last_steps) << "a saved state was lost";
    last_steps = steps;
    EXPECT_TRUE(d == dump(reference(ctx.get(), steps).get())) << "round " << round;
  }
  // The child really saved many times (else nothing was tested). Killed mid-save, a full save
  // may leave its temporary file next to the snapshot; it never replaces the snapshot.
  EXPECT_GE(last_steps, 7u);
}

TEST(CrashSafety, KilledFullSavesLeaveTheLastCompleteSnapshot) { kill_during_saves(false); }

TEST(CrashSafety, KilledJournalAppendsLeaveTheLastCompleteDelta) { kill_during_saves(true); }

}  // namespace
