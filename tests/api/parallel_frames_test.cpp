// Snapshot frames are built, compressed and hashed on the context's thread pool (issue 18,
// "parallel frames"): for every preset, a cache saved from a context of 1, 2 or 4 threads gives
// the same bytes (buffer, size query and file) for several save options, including frames of a
// row or two, so that a save spans many windows of queued frames; and a snapshot loaded into any
// of those contexts gives the same cache, and the same error on damaged input.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "preset_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 4, kQ = 4, kKv = 2, kDim = 16;
constexpr uint32_t kPLayers = 2, kPQ = 2;  // SmallKV's proxy: 1 KV head
constexpr int32_t kThreads[] = {1, 2, 4};

kvsdk_save_options save_options(int32_t level, uint64_t max_frame_bytes, uint32_t backing) {
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.zstd_level = level;
  o.max_frame_bytes = max_frame_bytes;
  o.include_backing = backing;
  return o;
}

std::vector<uint8_t> to_buffer(kvsdk_cache* c, const kvsdk_save_options& opt, size_t* queried) {
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &opt, nullptr, 0, queried), KVSDK_OK)
      << kvsdk_last_error();
  std::vector<uint8_t> out(*queried);
  size_t size = 0;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(c, &opt, out.data(), out.size(), &size), KVSDK_OK)
      << kvsdk_last_error();
  out.resize(size);
  return out;
}

std::vector<uint8_t> to_file(kvsdk_cache* c, const kvsdk_save_options& opt,
                             const std::string& path) {
  EXPECT_EQ(kvsdk_cache_save(c, path.c_str(), &opt), KVSDK_OK) << kvsdk_last_error();
  std::vector<uint8_t> out;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
    std::fclose(f);
  }
  std::remove(path.c_str());
  return out;
}

// A load's outcome: its status and message, and the loaded cache's own snapshot.
struct Loaded {
  kvsdk_status status = KVSDK_OK;
  std::string error;
  std::vector<uint8_t> resaved;
};

Loaded load(kvsdk_context* ctx, const std::vector<uint8_t>& bytes) {
  Loaded r;
  kvsdk_cache* c = nullptr;
  r.status = kvsdk_cache_load_from_buffer(&c, ctx, bytes.data(), bytes.size(), nullptr, nullptr);
  if (r.status != KVSDK_OK) {
    r.error = kvsdk_last_error();
    return r;
  }
  CachePtr owned(c);
  r.resaved = snapshot(c);
  return r;
}

class ParallelFrames : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    policy = small_policy(GetParam(), 4);
    specache = policy.method == KVSDK_METHOD_SPECACHE;
    g = make_geometry(kLayers, kQ, kKv, kDim);
  }

  // The same conversation on `ctx`: 40 decode steps (append, attend, SpeCache's prefetch), the
  // eviction presets under a budget of about 24 tokens per layer.
  Chat converse(kvsdk_context* ctx) {
    const kvsdk_geometry proxy_g = make_geometry(kPLayers, kPQ, 1, kDim);
    Chat c = start_chat(ctx, g, policy, GetParam(), 24 * kLayers * exact_bytes_per_token(g),
                        proxy_g);
    std::mt19937 rng(7);
    for (int32_t pos = 0; pos < 40; ++pos) decode_step(c, g, proxy_g, specache, pos, rng);
    return c;
  }

  kvsdk_policy policy{};
  kvsdk_geometry g{};
  bool specache = false;
};

TEST_P(ParallelFrames, SavesTheSameBytesOnAnyNumberOfThreads) {
  std::vector<ContextPtr> ctx;
  std::vector<Chat> chats;
  for (int32_t n : kThreads) {
    ctx.push_back(context_with_threads(n));
    ASSERT_TRUE(ctx.back()) << kvsdk_last_error();
    chats.push_back(converse(ctx.back().get()));
    ASSERT_TRUE(chats.back().cache);
  }
  // Defaults (8 MiB frames: one frame per layer's rows), then frames of a row or two (hundreds of
  // frames: many full windows and a partial last one), without and with SpeCache's backing store.
  const kvsdk_save_options options[] = {
      save_options(0, 0, 1), save_options(1, 1, 1), save_options(-3, 300, 0),
      save_options(5, 2000, 1)};
  for (const kvsdk_save_options& opt : options) {
    SCOPED_TRACE("zstd_level " + std::to_string(opt.zstd_level) + ", max_frame_bytes " +
                 std::to_string(opt.max_frame_bytes));
    size_t size1 = 0;
    const std::vector<uint8_t> one = to_buffer(chats[0].cache.get(), opt, &size1);
    ASSERT_FALSE(one.empty());
    EXPECT_EQ(size1, one.size());
    for (size_t i = 0; i < ctx.size(); ++i) {
      SCOPED_TRACE(std::to_string(kThreads[i]) + " threads");
      size_t queried = 0;
      EXPECT_EQ(to_buffer(chats[i].cache.get(), opt, &queried), one);
      EXPECT_EQ(queried, one.size());
      // One file per process: ctest runs the presets' tests in parallel processes.
      const std::string path = ::testing::TempDir() + "kvsdk_parallel_frames_" +
                               std::to_string(::getpid()) + "_" + std::to_string(kThreads[i]) +
                               ".kvsnap";
      EXPECT_EQ(to_file(chats[i].cache.get(), opt, path), one);
    }
  }
}

TEST_P(ParallelFrames, LoadsTheSameCacheAndErrorsOnAnyNumberOfThreads) {
  std::vector<ContextPtr> ctx;
  for (int32_t n : kThreads) {
    ctx.push_back(context_with_threads(n));
    ASSERT_TRUE(ctx.back()) << kvsdk_last_error();
  }
  Chat c = converse(ctx[0].get());
  ASSERT_TRUE(c.cache);
  size_t size = 0;
  const std::vector<uint8_t> file = to_buffer(c.cache.get(), save_options(1, 1, 1), &size);
  const Loaded one = load(ctx[0].get(), file);
  ASSERT_EQ(one.status, KVSDK_OK) << one.error;
  EXPECT_EQ(one.resaved, snapshot(c.cache.get()));
  for (size_t i = 1; i < ctx.size(); ++i) {
    const Loaded other = load(ctx[i].get(), file);
    EXPECT_EQ(other.status, KVSDK_OK) << other.error;
    EXPECT_EQ(other.resaved, one.resaved) << kThreads[i] << " threads";
  }
  // Damage: flipped bytes all over the file (frame headers, payloads, index, trailer) and cuts.
  std::vector<std::vector<uint8_t>> damaged;
  const size_t step = std::max<size_t>(1, file.size() / 97);
  for (size_t at = 0; at < file.size(); at += step) {
    std::vector<uint8_t> d = file;
    d[at] ^= 0x5a;
    damaged.push_back(std::move(d));
  }
  for (size_t cut : {file.size() / 3, file.size() / 2, file.size() - 1}) {
    damaged.emplace_back(file.begin(), file.begin() + long(cut));
  }
  size_t failures = 0;
  for (size_t d = 0; d < damaged.size(); ++d) {
    const Loaded base = load(ctx[0].get(), damaged[d]);
    failures += base.status != KVSDK_OK;
    for (size_t i = 1; i < ctx.size(); ++i) {
      const Loaded other = load(ctx[i].get(), damaged[d]);
      EXPECT_EQ(other.status, base.status) << "damage " << d << ", " << kThreads[i] << " threads";
      EXPECT_EQ(other.error, base.error) << "damage " << d << ", " << kThreads[i] << " threads";
      EXPECT_EQ(other.resaved, base.resaved) << "damage " << d << ", " << kThreads[i] << " threads";
    }
  }
  EXPECT_GT(failures, damaged.size() / 2) << "most damage must be detected";
}

INSTANTIATE_TEST_SUITE_P(EveryPreset, ParallelFrames, ::testing::ValuesIn(kPresets), preset_name);

// Frames of 20 MiB: a 2-thread load batches them by bytes (at most 48 MiB of frames, so 2 at a
// time, the third starting the next batch) and gives back the larger buffers between batches;
// saves and loads still match one thread's, and so does the error for a damaged later frame.
TEST(ParallelFramesLarge, BatchesOfLargeFramesMatchOneThread) {
  const kvsdk_geometry g = make_geometry(1, 1, 1, 1024, KVSDK_DTYPE_F16);
  const size_t rows = 3 * 5120;  // 3 frames of 5120 rows (20 MiB each)
  std::vector<uint16_t> k(rows * 1024), v(rows * 1024);
  uint32_t x = 12345;
  for (size_t i = 0; i < k.size(); ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    k[i] = uint16_t(0x3000 | (x & 0x0fff));  // finite halfs in [0.125, 0.5)
    v[i] = uint16_t(0xb000 | ((x >> 16) & 0x0fff));
  }
  const std::vector<int32_t> pos = iota_positions(rows);
  std::vector<ContextPtr> ctx;
  std::vector<CachePtr> caches;
  for (int32_t n : kThreads) {
    ctx.push_back(context_with_threads(n));
    ASSERT_TRUE(ctx.back());
    caches.push_back(make_cache(ctx.back().get(), g));
    ASSERT_TRUE(caches.back());
    ASSERT_EQ(kvsdk_cache_append(caches.back().get(), 0, rows, k.data(), v.data(), pos.data(),
                                 k.size() * 2),
              KVSDK_OK)
        << kvsdk_last_error();
  }
  const kvsdk_save_options opt = save_options(-7, 20u << 20, 1);
  size_t size = 0;
  const std::vector<uint8_t> one = to_buffer(caches[0].get(), opt, &size);
  std::vector<uint8_t> late = one;  // a byte of the last frame's payload
  late[late.size() - 4096] ^= 1;
  const Loaded loaded = load(ctx[0].get(), one), damaged = load(ctx[0].get(), late);
  ASSERT_EQ(loaded.status, KVSDK_OK) << loaded.error;
  EXPECT_EQ(damaged.status, KVSDK_E_CORRUPT);
  for (size_t i = 1; i < ctx.size(); ++i) {
    SCOPED_TRACE(std::to_string(kThreads[i]) + " threads");
    EXPECT_EQ(to_buffer(caches[i].get(), opt, &size), one);
    const Loaded other = load(ctx[i].get(), one), other_damaged = load(ctx[i].get(), late);
    EXPECT_EQ(other.status, KVSDK_OK) << other.error;
    EXPECT_EQ(other.resaved, loaded.resaved);
    EXPECT_EQ(other_damaged.status, damaged.status);
    EXPECT_EQ(other_damaged.error, damaged.error);
  }
}

}  // namespace
