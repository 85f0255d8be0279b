// Host-only arena bookkeeping (runs on every machine): partition layout, budget refusal and
// data-preserving re-partitioning, executed on a host byte buffer.
#include "device_arena_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "util/error.h"

namespace kvsdk::cuda {
namespace {

kvsdk_status status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return KVSDK_OK;
}

TEST(ArenaPlan, SlicesAreAlignedLayerMajorAndInsideCapacity) {
  const ArenaPlan plan{{{1000, 0, 24}, {1, 513, 0}}};
  const ArenaPartition p = partition_arena(plan, 4096, 256);
  ASSERT_EQ(p.slices.size(), 6u);
  EXPECT_EQ(p.at(0, 0).offset, 0u);
  EXPECT_EQ(p.at(0, 1).offset, 1024u);  // a 0-byte slice takes no room
  EXPECT_EQ(p.at(0, 2).offset, 1024u);
  EXPECT_EQ(p.at(1, 0).offset, 1280u);
  EXPECT_EQ(p.at(1, 1).offset, 1536u);
  EXPECT_EQ(p.at(1, 1).bytes, 513u);
  EXPECT_EQ(p.reserved, 2304u);
  for (const ArenaSlice& s : p.slices) EXPECT_EQ(s.offset % 256, 0u);
}

TEST(ArenaPlan, PersonalisedLayerSizesFillTheBudgetExactly) {
  // XKV-style plan: every layer its own size; the whole budget may be used.
  const ArenaPlan plan{{{1024}, {2048}, {512}, {512}}};
  const ArenaPartition p = partition_arena(plan, 4096, 256);
  EXPECT_EQ(p.reserved, 4096u);
  EXPECT_EQ(p.at(3, 0).offset, 3584u);
}

TEST(ArenaPlan, OverBudgetPlansAreRefusedWithBudgetStatus) {
  EXPECT_EQ(status_of([] { partition_arena(ArenaPlan{{{4096}, {1}}}, 4096, 256); }),
            KVSDK_E_BUDGET);
  // Alignment padding counts: 3 slices of 1 byte need 513 bytes.
  EXPECT_EQ(status_of([] { partition_arena(ArenaPlan{{{1}, {1}, {1}}}, 512, 256); }),
            KVSDK_E_BUDGET);
  EXPECT_EQ(status_of([] { partition_arena(ArenaPlan{{{UINT64_MAX}}}, 4096, 256); }),
            KVSDK_E_BUDGET);
  try {
    partition_arena(ArenaPlan{{{100}, {5000}}}, 4096, 256);
    FAIL() << "expected a budget error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
}

TEST(ArenaPlan, BadPlansAreInvalidArguments) {
  EXPECT_EQ(status_of([] { partition_arena(ArenaPlan{{{1, 2}, {3}}}, 4096, 256); }),
            KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status_of([] { partition_arena(ArenaPlan{{{1}}}, 4096, 100); }), KVSDK_E_INVALID_ARG);
  const ArenaPartition a = partition_arena(ArenaPlan{{{10}, {10}}}, 4096, 256);
  const ArenaPartition b = partition_arena(ArenaPlan{{{10}}}, 4096, 256);
  EXPECT_EQ(status_of([&] { plan_repartition(a, b, {0, 0}); }), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status_of([&] { plan_repartition(a, a, {0}); }), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(status_of([&] { plan_repartition(a, a, {11, 0}); }), KVSDK_E_INVALID_ARG);
}

TEST(ArenaPlan, ShrinkingBelowLiveBytesIsABudgetError) {
  const ArenaPartition a = partition_arena(ArenaPlan{{{1000}, {1000}}}, 4096, 256);
  const ArenaPartition b = partition_arena(ArenaPlan{{{500}, {1500}}}, 4096, 256);
  EXPECT_EQ(status_of([&] { plan_repartition(a, b, {600, 0}); }), KVSDK_E_BUDGET);
  EXPECT_NO_THROW(plan_repartition(a, b, {500, 1000}));
}

// Executes the copies on a host buffer (memcpy: each op's ranges must not overlap) and checks
// every slice's live bytes arrived intact.
void check_partitions(const ArenaPartition& from, const ArenaPartition& to,
                      const std::vector<uint64_t>& used, uint64_t capacity, uint32_t seed) {
  std::vector<uint8_t> arena(capacity, 0xEE);
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> live(used.size());
  for (size_t i = 0; i < used.size(); ++i) {
    live[i].resize(used[i]);
    for (uint8_t& b : live[i]) b = uint8_t(rng());
    if (used[i] > 0) std::memcpy(arena.data() + from.slices[i].offset, live[i].data(), used[i]);
  }
  for (const ArenaCopy& op : plan_repartition(from, to, used)) {
    ASSERT_LE(op.dst + op.bytes, capacity);
    ASSERT_LE(op.src + op.bytes, capacity);
    ASSERT_TRUE(op.dst + op.bytes <= op.src || op.src + op.bytes <= op.dst) << "overlapping op";
    std::memcpy(arena.data() + op.dst, arena.data() + op.src, op.bytes);
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (used[i] == 0) continue;
    ASSERT_EQ(0, std::memcmp(arena.data() + to.slices[i].offset, live[i].data(), used[i]))
        << "slice " << i;
  }
}

void check_repartition(const ArenaPlan& from_plan, const ArenaPlan& to_plan,
                       const std::vector<uint64_t>& used, uint64_t capacity, uint32_t seed) {
  check_partitions(partition_arena(from_plan, capacity, 64), partition_arena(to_plan, capacity, 64),
                   used, capacity, seed);
}

TEST(ArenaPlan, RepartitionKeepsLiveDataWhenSlicesMoveBothWays) {
  // Layer 0 shrinks (layers 1.. move down), layer 2 grows (layer 3 moves up); used bytes make
  // slices overlap their old places, so chunked moves are exercised.
  check_repartition(ArenaPlan{{{1000}, {700}, {300}, {900}}},
                    ArenaPlan{{{400}, {800}, {1200}, {1000}}}, {350, 700, 300, 880}, 4096, 1);
  // Everything moves up by a small shift.
  check_repartition(ArenaPlan{{{64}, {1000}, {1000}}}, ArenaPlan{{{512}, {1000}, {1000}}},
                    {10, 1000, 999}, 4096, 2);
  // Two tiers per layer, random plans.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t layers = 1 + rng() % 6;
    ArenaPlan a, b;
    std::vector<uint64_t> used;
    for (size_t l = 0; l < layers; ++l) {
      a.bytes.emplace_back();
      b.bytes.emplace_back();
      for (int t = 0; t < 2; ++t) {
        const uint64_t sa = rng() % 600, sb = rng() % 600;
        a.bytes[l].push_back(sa);
        b.bytes[l].push_back(sb);
        used.push_back(std::min(sa, sb) == 0 ? 0 : rng() % (std::min(sa, sb) + 1));
      }
    }
    check_repartition(a, b, used, 16384, 100 + trial);
  }
}

// Device stores lay their slices out by kind, not by index (src/repr/device_rows.cpp: every
// layer's rows, then every layer's positions; device_kivi.cpp: by alignment): the copies follow
// the offsets. Random sizes, three tiers per layer placed tier-major (tier 2, then 0, then 1).
TEST(ArenaPlan, RepartitionKeepsLiveDataWhenSlicesLieOutOfIndexOrder) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t layers = 1 + rng() % 5, tiers = 3;
    const auto layout = [&](const std::vector<uint64_t>& bytes) {
      ArenaPartition p;
      p.tiers = tiers;
      p.slices.resize(layers * tiers);
      uint64_t offset = 0;
      for (size_t t : {2, 0, 1}) {
        for (size_t l = 0; l < layers; ++l) {
          p.slices[l * tiers + t] = {offset, bytes[l * tiers + t]};
          offset += bytes[l * tiers + t];
        }
      }
      p.reserved = offset;
      return p;
    };
    std::vector<uint64_t> a(layers * tiers), b(layers * tiers), used(layers * tiers);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = rng() % 500;
      b[i] = rng() % 500;
      const uint64_t most = std::min(a[i], b[i]);
      used[i] = most == 0 ? 0 : rng() % (most + 1);
    }
    check_partitions(layout(a), layout(b), used, 8192, 500 + uint32_t(trial));
  }
}

}  // namespace
}  // namespace kvsdk::cuda
