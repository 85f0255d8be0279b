// A process killed (SIGKILL) at random points while saving never damages the previous snapshot:
// full saves are atomic (temp file + fsync + rename) and a torn journal append is dropped. A killed
// full save leaves no temporary file behind for longer than the next save to the same path, and
// that cleanup never touches the temporary file of a save still in progress.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvsdk.h"
#include "snapshot_file.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

const kvsdk_geometry kGeo = make_geometry(4, 4, 2, 32);
constexpr size_t kStep = 16;  // tokens per save step

// The context of a forked saver. ThreadSanitizer cannot start threads in the child of a
// multi-threaded process (it dies: "starting new threads after multi-threaded fork"), and a save
// on a pool of 2+ threads writes its file on a thread of its own (formats/file_sink.h); under
// TSan the children therefore save on one thread, everywhere else on the default pool.
#if defined(__SANITIZE_THREAD__)  // GCC
#define KVSDK_TEST_UNDER_TSAN 1
#elif defined(__has_feature)     // Clang
#if __has_feature(thread_sanitizer)
#define KVSDK_TEST_UNDER_TSAN 1
#endif
#endif
#ifdef KVSDK_TEST_UNDER_TSAN
ContextPtr child_context() { return context_with_threads(1); }
#else
ContextPtr child_context() { return make_context(); }
#endif

// The cache after `steps` steps: step s appends kStep tokens with seed s.
CachePtr reference(kvsdk_context* ctx, size_t steps) {
  auto c = make_cache(ctx, kGeo);
  for (size_t s = 0; s < steps; ++s) fill(c.get(), kGeo, kStep, int32_t(s * kStep), uint32_t(s + 1));
  return c;
}

// Child: grows the cache and saves after every step until killed.
[[noreturn]] void saver(const std::string& path, bool journal) {
  auto ctx = child_context();
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

// Steps of the state a load of `path` gives now (0 when it cannot be loaded).
size_t loadable_steps(kvsdk_context* ctx, const std::string& path) {
  kvsdk_cache* c = nullptr;
  if (kvsdk_cache_load(&c, ctx, path.c_str(), nullptr, nullptr) != KVSDK_OK) return 0;
  CachePtr loaded(c);
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  kvsdk_cache_stats_get(loaded.get(), &st);
  return st.appended_tokens / kGeo.n_layers / kStep;
}

// Waits (up to 60 s) until a load of `path` shows more than `steps` steps: a save completed.
// Loading while the child writes is itself part of the contract (a torn tail is ignored), and
// unlike watching the file size it proves that a whole save finished, however slow the machine.
void wait_for_progress(kvsdk_context* ctx, const std::string& path, size_t steps) {
  for (int i = 0; i < 6000 && loadable_steps(ctx, path) <= steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Names in `dir` that start with `prefix`.
std::vector<std::string> entries_starting_with(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name);
  }
  closedir(d);
  return out;
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
    // Every other round first waits for one more completed save (seen by loading the file), so
    // the test makes progress however slow the machine (sanitizers, emulators, shared CI); then
    // the kill lands at a random point of a later save.
    if (round % 2 == 1) wait_for_progress(ctx.get(), path, last_steps);
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
  // The child really saved many times (else nothing was tested): six rounds waited for one more
  // completed save each.
  EXPECT_GE(last_steps, 7u);
  if (!journal) {
    // Killed mid-save, a full save never replaced the snapshot, and the next one leaves no
    // temporary file behind (an unnamed one vanishes with its writer; a named one is removed).
    auto last = reference(ctx.get(), last_steps);
    ASSERT_EQ(kvsdk_cache_save(last.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
    const size_t slash = path.find_last_of('/');
    EXPECT_EQ(entries_starting_with(path.substr(0, slash), path.substr(slash + 1) + ".tmp-"),
              std::vector<std::string>{});
  }
}

// True when descriptor `fd` of process `pid` is open for writing. A save's cleanup opens other
// saves' temporary files read-only to test their locks; those are not the save's own file (taking
// one for it let a kill land between the removal of an orphan and the creation of the save's
// file, leaving no temporary file at all).
bool open_for_writing(const std::string& fdinfo) {
  FILE* f = std::fopen(fdinfo.c_str(), "r");
  if (!f) return false;
  char line[256];
  unsigned long flags = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) {
    found = std::sscanf(line, "flags: %lo", &flags) == 1;
  }
  std::fclose(f);
  return found && (flags & O_ACCMODE) != O_RDONLY;
}

// True once process `pid` has a regular file in `dir` open for writing: a save's temporary file
// (named or, with O_TMPFILE, unnamed), from its creation to its rename. The savers below write
// nothing else there. (Not "holds bytes": a save stages its first MiBs before they reach the file,
// formats/file_sink.h, so a small or slow save's file stays empty for most of its life.)
bool writing_temp_file(pid_t pid, const std::string& dir) {
  char real[PATH_MAX];
  const std::string prefix = std::string(realpath(dir.c_str(), real) ? real : dir.c_str()) + "/";
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(fds.c_str());
  if (!d) return false;
  bool found = false;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string link = fds + "/" + e->d_name;
    char target[PATH_MAX];
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string t(target, size_t(n));
    struct stat st;
    if (t.compare(0, prefix.size(), prefix) == 0 &&
        stat(link.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        open_for_writing("/proc/" + std::to_string(pid) + "/fdinfo/" + e->d_name)) {
      found = true;
    }
  }
  closedir(d);
  return found;
}

// A child that builds a cache large enough for its save (zstd level 19) to take seconds, tells
// the parent through `ready` that it starts saving to `path`, and saves (exit 0 when done).
// `named`: through a named temporary file, as on systems without O_TMPFILE.
[[noreturn]] void slow_saver(const std::string& path, int ready, bool named) {
  if (named) kvsdk::format::set_unnamed_temp_files(false);
  auto ctx = child_context();
  auto c = make_cache(ctx.get(), kGeo);
  for (size_t s = 0; s < 32; ++s) fill(c.get(), kGeo, 256, int32_t(s * 256), uint32_t(s + 1));
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.zstd_level = 19;
  const char go = 1;
  if (write(ready, &go, 1) != 1) _exit(3);
  _exit(kvsdk_cache_save(c.get(), path.c_str(), &o) == KVSDK_OK ? 0 : 4);
}

// Forks slow_saver and SIGKILLs it while it writes its temporary file; `path` keeps the state
// of `steps` steps.
void kill_mid_save(kvsdk_context* ctx, const std::string& dir, const std::string& path,
                   size_t steps, bool named) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(p[0]);
    slow_saver(path, p[1], named);
  }
  close(p[1]);
  char go = 0;
  ASSERT_EQ(read(p[0], &go, 1), 1);
  close(p[0]);
  bool writing = false;
  for (int i = 0; i < 60000 && !(writing = writing_temp_file(pid, dir)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(writing) << "the child never wrote a temporary file";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the save finished before the kill";
  EXPECT_EQ(loadable_steps(ctx, path), steps) << "a killed save changed the snapshot";
}

TEST(CrashSafety, KilledFullSavesLeaveTheLastCompleteSnapshot) { kill_during_saves(false); }

TEST(CrashSafety, NoTemporaryFileOutlivesTheNextSaveAfterAKill) {
  TempDir dir;
  const std::string path = dir.file("crash.kvsnap");
  auto ctx = make_context();
  auto first = reference(ctx.get(), 1);
  ASSERT_EQ(kvsdk_cache_save(first.get(), path.c_str(), nullptr), KVSDK_OK);
  for (int round = 0; round < 2; ++round) kill_mid_save(ctx.get(), dir.path(), path, 1, false);
  // The next save to the same path leaves no temporary file behind, killed ones included.
  auto second = reference(ctx.get(), 2);
  ASSERT_EQ(kvsdk_cache_save(second.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(entries_starting_with(dir.path(), "crash.kvsnap.tmp-"), std::vector<std::string>{});
  EXPECT_EQ(loadable_steps(ctx.get(), path), 2u);
  struct stat mode;
  ASSERT_EQ(stat(path.c_str(), &mode), 0);
  EXPECT_EQ(mode.st_mode & 0777, 0600u);
}

TEST(CrashSafety, NamedTemporaryFilesOfKilledSavesAreRemovedByTheNextSave) {
  // Where O_TMPFILE is unavailable (or a writer dies between linking and renaming), a killed save
  // leaves its named temporary file: the next save to the same path removes it, and nothing else.
  TempDir dir;
  const std::string path = dir.file("crash.kvsnap");
  auto ctx = make_context();
  auto first = reference(ctx.get(), 1);
  ASSERT_EQ(kvsdk_cache_save(first.get(), path.c_str(), nullptr), KVSDK_OK);
  for (int round = 0; round < 2; ++round) {
    kill_mid_save(ctx.get(), dir.path(), path, 1, true);
    // The killed save left its file; the killed save of round 1 removed round 0's first.
    EXPECT_EQ(entries_starting_with(dir.path(), "crash.kvsnap.tmp-").size(), 1u);
  }
  // Look-alikes that are not this path's temporary files stay.
  const std::vector<std::string> keep = {"crash.kvsnap.tmp-abc", "crash.kvsnap.tmp-abcdefg",
                                         "crash.kvsnap.tmp-ab.def", "other.kvsnap.tmp-ABCDEF",
                                         "crash.kvsnap.tmp-DIRxyz", "crash.kvsnap.tmp-LNKxyz"};
  for (size_t i = 0; i + 2 < keep.size(); ++i) write_file(dir.file(keep[i]), {1, 2, 3});
  ASSERT_EQ(mkdir(dir.file(keep[4]).c_str(), 0700), 0);
  ASSERT_EQ(symlink(dir.file(keep[0]).c_str(), dir.file(keep[5]).c_str()), 0);
  auto second = reference(ctx.get(), 2);
  ASSERT_EQ(kvsdk_cache_save(second.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  std::vector<std::string> left = entries_starting_with(dir.path(), "crash.kvsnap.tmp-");
  std::vector<std::string> other = entries_starting_with(dir.path(), "other.kvsnap.tmp-");
  left.insert(left.end(), other.begin(), other.end());
  std::sort(left.begin(), left.end());
  std::vector<std::string> want = keep;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(left, want);
  EXPECT_EQ(loadable_steps(ctx.get(), path), 2u);
  // A save that itself goes through a named file leaves none either.
  kvsdk::format::set_unnamed_temp_files(false);
  auto third = reference(ctx.get(), 3);
  const kvsdk_status st = kvsdk_cache_save(third.get(), path.c_str(), nullptr);
  kvsdk::format::set_unnamed_temp_files(true);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(entries_starting_with(dir.path(), "crash.kvsnap.tmp-").size(), 5u);
  EXPECT_EQ(loadable_steps(ctx.get(), path), 3u);
  struct stat mode;
  ASSERT_EQ(stat(path.c_str(), &mode), 0);
  EXPECT_EQ(mode.st_mode & 0777, 0600u);
}

// A save in progress in another process (paused in the middle of writing its temporary file)
// while this process saves to the same path: its temporary file is not taken for an orphan, and
// its save completes (last rename wins).
void save_beside_a_save_in_progress(bool named) {
  TempDir dir;
  const std::string path = dir.file("busy.kvsnap");
  auto ctx = make_context();
  auto first = reference(ctx.get(), 1);
  ASSERT_EQ(kvsdk_cache_save(first.get(), path.c_str(), nullptr), KVSDK_OK);
  const std::vector<unsigned char> content(1 << 17, 0x5a);
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    close(go[1]);
    if (named) kvsdk::format::set_unnamed_temp_files(false);
    try {
      kvsdk::format::save_file_atomically(path, [&](kvsdk::format::Sink& sink) {
        sink.write(content.data(), content.size() / 2);
        char c = 1;
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) _exit(3);
        sink.write(content.data() + content.size() / 2, content.size() - content.size() / 2);
      });
    } catch (...) {
      _exit(4);
    }
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  // The child is inside its write: its temporary file is there (named) or open (unnamed).
  EXPECT_TRUE(writing_temp_file(pid, dir.path()));
  const std::vector<std::string> before = entries_starting_with(dir.path(), "busy.kvsnap.tmp-");
  struct stat tmp_before {};
  if (named) {
    ASSERT_EQ(before.size(), 1u);
    ASSERT_EQ(stat(dir.file(before[0]).c_str(), &tmp_before), 0);
  } else {
    EXPECT_EQ(before, std::vector<std::string>{});
  }
  auto second = reference(ctx.get(), 2);
  EXPECT_EQ(kvsdk_cache_save(second.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  EXPECT_EQ(loadable_steps(ctx.get(), path), 2u);
  if (named) {
    EXPECT_EQ(entries_starting_with(dir.path(), "busy.kvsnap.tmp-"), before);
    struct stat tmp_after {};
    EXPECT_EQ(stat(dir.file(before[0]).c_str(), &tmp_after), 0);
    EXPECT_EQ(tmp_after.st_ino, tmp_before.st_ino) << "the writer's temporary file was replaced";
  }
  ASSERT_EQ(write(go[1], &c, 1), 1);
  close(go[1]);
  close(ready[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the save in progress failed";
  EXPECT_TRUE(read_file(path) == content) << "the save in progress did not complete";
  EXPECT_EQ(entries_starting_with(dir.path(), "busy.kvsnap.tmp-"), std::vector<std::string>{});
}

TEST(CrashSafety, SaveInProgressInAnotherProcessKeepsItsNamedTemporaryFile) {
  save_beside_a_save_in_progress(true);
}

TEST(CrashSafety, SaveInProgressInAnotherProcessIsNotDisturbed) {
  save_beside_a_save_in_progress(false);
}

TEST(CrashSafety, KilledJournalAppendsLeaveTheLastCompleteDelta) { kill_during_saves(true); }

}  // namespace
