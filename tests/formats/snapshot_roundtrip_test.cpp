// Save -> load gives back the same cache, and a resumed cache continues bit-identically.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvsdk.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

// Appends one more step to every layer and attends it; returns every output byte.
std::vector<unsigned char> continue_conversation(kvsdk_cache* c, const kvsdk_geometry& g,
                                                 int32_t pos0, uint32_t seed) {
  std::vector<unsigned char> all;
  const size_t n = 3;
  fill(c, g, n, pos0, seed);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const size_t elems = n * g.n_q_heads * g.head_dim;
    auto q = random_floats(elems, seed * 7 + l);
    auto qp = iota_positions(n, pos0);
    std::vector<float> out(elems);
    EXPECT_EQ(kvsdk_cache_attend(c, l, n, q.data(), qp.data(), elems * 4, out.data(), elems * 4),
              KVSDK_OK);
    const auto* b = reinterpret_cast<const unsigned char*>(out.data());
    all.insert(all.end(), b, b + elems * 4);
  }
  return all;
}

TEST(SnapshotRoundTrip, FileRoundTripGivesBackEveryRowAndStat) {
  TempDir dir;
  const kvsdk_geometry g = make_geometry(3, 8, 2, 32);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  fill(a.get(), g, 50, 0, 1);
  const std::string path = dir.file("a.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();

  kvsdk_cache* raw = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g, &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(raw);
  // Caches with exact rows are written as format 6.0 (byte-shuffled rows, XXH3 records).
  EXPECT_EQ(info.format_major, 6u);
  EXPECT_EQ(info.format_minor, 0u);
  EXPECT_EQ(info.journal_frames_applied, 0u);
  EXPECT_EQ(info.journal_frames_dropped, 0u);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  kvsdk_geometry gb;
  kvsdk_geometry_init(&gb);
  ASSERT_EQ(kvsdk_cache_geometry(b.get(), &gb), KVSDK_OK);
  EXPECT_EQ(gb.n_layers, g.n_layers);
  EXPECT_EQ(gb.head_dim, g.head_dim);
  // The loaded cache is charged like the original: the context now holds both.
  uint64_t used = 0;
  ASSERT_EQ(kvsdk_context_used_bytes(ctx.get(), &used), KVSDK_OK);
  EXPECT_EQ(used, 2 * dump(a.get()).stats.bytes);
}

TEST(SnapshotRoundTrip, BufferRoundTripForEveryDtype) {
  for (kvsdk_dtype dt : {KVSDK_DTYPE_F32, KVSDK_DTYPE_F16, KVSDK_DTYPE_BF16}) {
    const kvsdk_geometry g32 = make_geometry(2, 4, 4, 16);
    const kvsdk_geometry g = make_geometry(2, 4, 4, 16, dt);
    auto ctx = make_context();
    auto a = make_cache(ctx.get(), g);
    // Host data: f16 bit patterns reinterpreted per dtype (any 2-byte pattern is valid input).
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const size_t elems = 20 * g.n_kv_heads * g.head_dim;
      const size_t esz = dt == KVSDK_DTYPE_F32 ? 4 : 2;
      std::vector<unsigned char> k(elems * esz), v(elems * esz);
      auto fk = random_floats(elems, 10 + l), fv = random_floats(elems, 20 + l);
      if (dt == KVSDK_DTYPE_F32) {
        std::memcpy(k.data(), fk.data(), k.size());
        std::memcpy(v.data(), fv.data(), v.size());
      } else {
        for (size_t i = 0; i < elems; ++i) {
          const uint16_t hk = uint16_t(0x3c00 ^ (i * 37 + l)), hv = uint16_t(0x3800 ^ (i * 11));
          std::memcpy(&k[i * 2], &hk, 2);
          std::memcpy(&v[i * 2], &hv, 2);
        }
      }
      auto p = iota_positions(20);
      ASSERT_EQ(kvsdk_cache_append(a.get(), l, 20, k.data(), v.data(), p.data(), k.size()),
                KVSDK_OK);
    }
    auto buf = save_buffer(a.get());
    kvsdk_status st;
    auto b = load_buffer(ctx.get(), buf, &st);
    ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
    EXPECT_TRUE(dump(a.get()) == dump(b.get())) << "dtype " << dt;
    // Saving the loaded cache gives the same rows again (ids differ, so bytes differ).
    auto buf2 = save_buffer(b.get());
    auto c = load_buffer(ctx.get(), buf2, &st);
    ASSERT_EQ(st, KVSDK_OK);
    EXPECT_TRUE(dump(a.get()) == dump(c.get()));
    (void)g32;
  }
}

TEST(SnapshotRoundTrip, ResumedCacheContinuesBitIdentically) {
  const kvsdk_geometry g = make_geometry(2, 8, 2, 64);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  fill(a.get(), g, 37, 0, 5);
  auto buf = save_buffer(a.get());
  kvsdk_status st;
  auto b = load_buffer(ctx.get(), buf, &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  for (int step = 0; step < 4; ++step) {
    const auto out_a = continue_conversation(a.get(), g, 37 + 3 * step, 100 + step);
    const auto out_b = continue_conversation(b.get(), g, 37 + 3 * step, 100 + step);
    ASSERT_EQ(out_a.size(), out_b.size());
    EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size()), 0) << "step " << step;
  }
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST(SnapshotRoundTrip, EmptyAndUnevenCachesRoundTrip) {
  const kvsdk_geometry g = make_geometry(3, 2, 1, 8);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  auto buf = save_buffer(a.get());
  kvsdk_status st;
  auto b = load_buffer(ctx.get(), buf, &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  // Only the middle layer holds tokens.
  auto k = random_floats(5 * 8, 1), v = random_floats(5 * 8, 2);
  auto p = iota_positions(5, 100);
  ASSERT_EQ(kvsdk_cache_append(a.get(), 1, 5, k.data(), v.data(), p.data(), 5 * 8 * 4), KVSDK_OK);
  buf = save_buffer(a.get());
  b = load_buffer(ctx.get(), buf, &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
}

TEST(SnapshotRoundTrip, TinyFramesSplitLayersIntoManyFrames) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 16);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  fill(a.get(), g, 40, 0, 9);
  kvsdk_save_options o;
  ASSERT_EQ(kvsdk_save_options_init(&o), KVSDK_OK);
  EXPECT_EQ(o.zstd_level, 1);
  EXPECT_EQ(o.max_frame_bytes, 8u << 20);
  const auto big = save_buffer(a.get(), &o);
  for (uint64_t frame : {1ull, 100ull, 68ull * 3, 1000ull}) {
    o.max_frame_bytes = frame;
    const auto buf = save_buffer(a.get(), &o);
    EXPECT_GT(buf.size(), big.size()) << "more frames, more overhead";
    kvsdk_status st;
    auto b = load_buffer(ctx.get(), buf, &st);
    ASSERT_EQ(st, KVSDK_OK) << "max_frame_bytes " << frame << ": " << kvsdk_last_error();
    EXPECT_TRUE(dump(a.get()) == dump(b.get())) << "max_frame_bytes " << frame;
  }
}

TEST(SnapshotRoundTrip, GeometryMismatchIsReported) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 16);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  fill(a.get(), g, 4, 0, 1);
  const auto buf = save_buffer(a.get());
  kvsdk_geometry other = g;
  other.head_dim = 32;
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_load_from_buffer(&c, ctx.get(), buf.data(), buf.size(), &other, nullptr),
            KVSDK_E_GEOMETRY);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::strstr(kvsdk_last_error(), "geometry"), nullptr);
  other = g;
  other.rope_theta = 500000.0f;
  EXPECT_EQ(kvsdk_cache_load_from_buffer(&c, ctx.get(), buf.data(), buf.size(), &other, nullptr),
            KVSDK_E_GEOMETRY);
  // attn_scale 0 means the default, which is what the file holds.
  other = g;
  other.attn_scale = 0.0f;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&c, ctx.get(), buf.data(), buf.size(), &other, nullptr),
            KVSDK_OK);
  kvsdk_cache_destroy(c);
}

TEST(SnapshotRoundTrip, LoadIsChargedToTheBudget) {
  const kvsdk_geometry g = make_geometry(2, 4, 2, 16);
  auto big = make_context();
  auto a = make_cache(big.get(), g);
  fill(a.get(), g, 10, 0, 1);
  const auto buf = save_buffer(a.get());
  const uint64_t bytes = dump(a.get()).stats.bytes;
  auto tight = make_context(bytes - 1);
  kvsdk_status st;
  auto b = load_buffer(tight.get(), buf, &st);
  EXPECT_EQ(st, KVSDK_E_BUDGET);
  EXPECT_FALSE(b);
  uint64_t used = 1;
  ASSERT_EQ(kvsdk_context_used_bytes(tight.get(), &used), KVSDK_OK);
  EXPECT_EQ(used, 0u);
  auto exact = make_context(bytes);
  b = load_buffer(exact.get(), buf, &st);
  ASSERT_EQ(st, KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(kvsdk_context_used_bytes(exact.get(), &used), KVSDK_OK);
  EXPECT_EQ(used, bytes);
  b.reset();
  ASSERT_EQ(kvsdk_context_used_bytes(exact.get(), &used), KVSDK_OK);
  EXPECT_EQ(used, 0u);
}

TEST(SnapshotRoundTrip, BadArgumentsAreRejected) {
  const kvsdk_geometry g = make_geometry(1, 2, 1, 8);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  fill(a.get(), g, 3, 0, 1);
  size_t size = 0;
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  EXPECT_EQ(kvsdk_save_options_init(nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_save_to_buffer(nullptr, nullptr, nullptr, 0, &size), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.get(), nullptr, nullptr, 0, nullptr), KVSDK_E_INVALID_ARG);
  o.zstd_level = 99;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.get(), &o, nullptr, 0, &size), KVSDK_E_INVALID_ARG);
  kvsdk_save_options_init(&o);
  o.include_backing = 2;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.get(), &o, nullptr, 0, &size), KVSDK_E_INVALID_ARG);
  kvsdk_save_options_init(&o);
  o.max_frame_bytes = 1ull << 40;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.get(), &o, nullptr, 0, &size), KVSDK_E_INVALID_ARG);
  kvsdk_save_options_init(&o);
  o.struct_size = 4;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.get(), &o, nullptr, 0, &size), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(size, 0u) << "outputs untouched on failure";
  // Too small a buffer: INVALID_ARG, out_size untouched.
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.get(), nullptr, nullptr, 0, &size), KVSDK_OK);
  std::vector<unsigned char> buf(size - 1);
  size_t out = 7;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.get(), nullptr, buf.data(), buf.size(), &out),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(out, 7u);
  EXPECT_EQ(kvsdk_cache_save(a.get(), nullptr, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_save(a.get(), "/nonexistent-dir/x.kvsnap", nullptr), KVSDK_E_IO);
  kvsdk_cache* c = nullptr;
  EXPECT_EQ(kvsdk_cache_load(&c, ctx.get(), "/nonexistent-dir/x.kvsnap", nullptr, nullptr),
            KVSDK_E_IO);
  EXPECT_EQ(kvsdk_cache_load(&c, ctx.get(), nullptr, nullptr, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_load(nullptr, ctx.get(), "x", nullptr, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_load_from_buffer(&c, ctx.get(), nullptr, 10, nullptr, nullptr),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_load_from_buffer(&c, nullptr, buf.data(), 10, nullptr, nullptr),
            KVSDK_E_INVALID_ARG);
  kvsdk_load_info info{};
  info.struct_size = 3;
  const auto good = save_buffer(a.get());
  EXPECT_EQ(kvsdk_cache_load_from_buffer(&c, ctx.get(), good.data(), good.size(), nullptr, &info),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_H2O);
  ASSERT_EQ(kvsdk_cache_policy(a.get(), &p), KVSDK_OK);
  EXPECT_EQ(p.method, KVSDK_METHOD_FULL);
  EXPECT_EQ(kvsdk_cache_policy(nullptr, &p), KVSDK_E_INVALID_ARG);
}

TEST(SnapshotRoundTrip, SaveOverwritesAtomicallyAndLeavesNoTemporaryFiles) {
  TempDir dir;
  const kvsdk_geometry g = make_geometry(1, 2, 1, 8);
  auto ctx = make_context();
  auto a = make_cache(ctx.get(), g);
  const std::string path = dir.file("s.kvsnap");
  for (int i = 0; i < 3; ++i) {
    fill(a.get(), g, 2, 2 * i, i);
    ASSERT_EQ(kvsdk_cache_save(a.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  }
  kvsdk_cache* c = nullptr;
  ASSERT_EQ(kvsdk_cache_load(&c, ctx.get(), path.c_str(), nullptr, nullptr), KVSDK_OK);
  CachePtr b(c);
  EXPECT_TRUE(dump(a.get()) == dump(b.get()));
  const std::string ls = "test $(ls -A '" + dir.path() + "' | wc -l) -eq 1";
  EXPECT_EQ(std::system(ls.c_str()), 0) << "only the snapshot remains";
}

}  // namespace
