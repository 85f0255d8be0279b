// The typed compressed-store tables of format 4.0 (formats/tier_schema.h): the registry agrees
// with the code flatc generates from kvsdk.fbs (every field id is the generated VT_* offset, every
// element type the generated accessor's), knows every kind and field that the stores of every
// preset write (and nothing they never write), and converts records to typed tables and back
// exactly. Writing what the registry does not know is KVSDK_E_INTERNAL; reading a typed table
// that lacks a field or names an unknown union member, or a typed delta that does not fit, is
// KVSDK_E_CORRUPT. And a journal delta continues a file in the file's own format.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "container.h"
#include "core/cache.h"
#include "golden_content.h"
#include "kvsdk.h"
#include "kvsdk_generated.h"
#include "test_util.h"
#include "tier_delta.h"
#include "tier_schema.h"
#include "util/error.h"
#include "zstd_frame.h"

using namespace kvsdk_test;
using namespace kvsdk_golden;
namespace fb = kvsdk::fb;
namespace fmt = kvsdk::format;
using fmt::TierElem;

namespace {

// ---- What the generated code says about each field ----

template <typename T>
constexpr TierElem elem_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return TierElem::kU8;
  else if constexpr (std::is_same_v<T, uint16_t>) return TierElem::kU16;
  else if constexpr (std::is_same_v<T, int32_t>) return TierElem::kI32;
  else if constexpr (std::is_same_v<T, uint32_t>) return TierElem::kU32;
  else if constexpr (std::is_same_v<T, float>) return TierElem::kF32;
  else {
    static_assert(std::is_same_v<T, uint64_t>, "element type outside TierElem");
    return TierElem::kU64;
  }
}

// An accessor's return type: a vector of T, or an optional (`= null`) scalar T.
template <typename R>
struct Accessor;
template <typename T>
struct Accessor<const flatbuffers::Vector<T>*> {
  static constexpr TierElem elem = elem_of<T>();
  static constexpr bool scalar = false;
};
template <typename T>
struct Accessor<flatbuffers::Optional<T>> {
  static constexpr TierElem elem = elem_of<T>();
  static constexpr bool scalar = true;
};

struct Generated {
  std::string table;   // the generated table's name
  std::string name;    // the record field it holds
  flatbuffers::voffset_t vt;
  TierElem elem;
  bool scalar;
};

#define FIELD(Table, rec, acc, VT)                                                            \
  Generated {                                                                                 \
    #Table, rec, fb::Table::VT,                                                               \
        Accessor<decltype(std::declval<const fb::Table&>().acc())>::elem,                     \
        Accessor<decltype(std::declval<const fb::Table&>().acc())>::scalar                    \
  }

// Every field of every typed table in kvsdk.fbs.
const std::vector<Generated>& generated_fields() {
  static const std::vector<Generated> all = {
  // KiviHeadTier (kivi.head)
  FIELD(KiviHeadTier, "quantized_tokens", quantized_tokens, VT_QUANTIZED_TOKENS),
  FIELD(KiviHeadTier, "block_tokens", block_tokens, VT_BLOCK_TOKENS),
  FIELD(KiviHeadTier, "positions", positions, VT_POSITIONS),
  FIELD(KiviHeadTier, "key_codes", key_codes, VT_KEY_CODES),
  FIELD(KiviHeadTier, "value_codes", value_codes, VT_VALUE_CODES),
  FIELD(KiviHeadTier, "key_scales", key_scales, VT_KEY_SCALES),
  FIELD(KiviHeadTier, "key_zeros", key_zeros, VT_KEY_ZEROS),
  FIELD(KiviHeadTier, "value_scales", value_scales, VT_VALUE_SCALES),
  FIELD(KiviHeadTier, "value_zeros", value_zeros, VT_VALUE_ZEROS),
  FIELD(KiviHeadTier, "residual_keys", residual_keys, VT_RESIDUAL_KEYS),
  FIELD(KiviHeadTier, "residual_values", residual_values, VT_RESIDUAL_VALUES),
  // SpindleKvHeadTier (spindlekv.head)
  FIELD(SpindleKvHeadTier, "keys.entries", keys_entries, VT_KEYS_ENTRIES),
  FIELD(SpindleKvHeadTier, "keys.index", keys_index, VT_KEYS_INDEX),
  FIELD(SpindleKvHeadTier, "keys.magnitude", keys_magnitude, VT_KEYS_MAGNITUDE),
  FIELD(SpindleKvHeadTier, "values.entries", values_entries, VT_VALUES_ENTRIES),
  FIELD(SpindleKvHeadTier, "values.index", values_index, VT_VALUES_INDEX),
  FIELD(SpindleKvHeadTier, "values.magnitude", values_magnitude, VT_VALUES_MAGNITUDE),
  FIELD(SpindleKvHeadTier, "positions", positions, VT_POSITIONS),
  // MiniCachePendingTier (minicache.pending)
  FIELD(MiniCachePendingTier, "pending.keys", pending_keys, VT_PENDING_KEYS),
  FIELD(MiniCachePendingTier, "pending.values", pending_values, VT_PENDING_VALUES),
  FIELD(MiniCachePendingTier, "pending.positions", pending_positions, VT_PENDING_POSITIONS),
  // MiniCachePairTier (minicache.pair)
  FIELD(MiniCachePairTier, "keys.threshold_set", keys_threshold_set, VT_KEYS_THRESHOLD_SET),
  FIELD(MiniCachePairTier, "keys.threshold", keys_threshold, VT_KEYS_THRESHOLD),
  FIELD(MiniCachePairTier, "keys.slots", keys_slots, VT_KEYS_SLOTS),
  FIELD(MiniCachePairTier, "keys.directions", keys_directions, VT_KEYS_DIRECTIONS),
  FIELD(MiniCachePairTier, "keys.magnitudes_prev", keys_magnitudes_prev, VT_KEYS_MAGNITUDES_PREV),
  FIELD(MiniCachePairTier, "keys.magnitudes_cur", keys_magnitudes_cur, VT_KEYS_MAGNITUDES_CUR),
  FIELD(MiniCachePairTier, "keys.retained_prev", keys_retained_prev, VT_KEYS_RETAINED_PREV),
  FIELD(MiniCachePairTier, "keys.retained_cur", keys_retained_cur, VT_KEYS_RETAINED_CUR),
  FIELD(MiniCachePairTier, "values.threshold_set", values_threshold_set, VT_VALUES_THRESHOLD_SET),
  FIELD(MiniCachePairTier, "values.threshold", values_threshold, VT_VALUES_THRESHOLD),
  FIELD(MiniCachePairTier, "values.slots", values_slots, VT_VALUES_SLOTS),
  FIELD(MiniCachePairTier, "values.directions", values_directions, VT_VALUES_DIRECTIONS),
  FIELD(MiniCachePairTier, "values.magnitudes_prev", values_magnitudes_prev, VT_VALUES_MAGNITUDES_PREV),
  FIELD(MiniCachePairTier, "values.magnitudes_cur", values_magnitudes_cur, VT_VALUES_MAGNITUDES_CUR),
  FIELD(MiniCachePairTier, "values.retained_prev", values_retained_prev, VT_VALUES_RETAINED_PREV),
  FIELD(MiniCachePairTier, "values.retained_cur", values_retained_cur, VT_VALUES_RETAINED_CUR),
  FIELD(MiniCachePairTier, "positions", positions, VT_POSITIONS),
  FIELD(MiniCachePairTier, "pending.keys", pending_keys, VT_PENDING_KEYS),
  FIELD(MiniCachePairTier, "pending.values", pending_values, VT_PENDING_VALUES),
  FIELD(MiniCachePairTier, "pending.positions", pending_positions, VT_PENDING_POSITIONS),
  // MiniCacheKiviPairTier (minicache_kivi.pair)
  FIELD(MiniCacheKiviPairTier, "threshold_set", threshold_set, VT_THRESHOLD_SET),
  FIELD(MiniCacheKiviPairTier, "threshold", threshold, VT_THRESHOLD),
  FIELD(MiniCacheKiviPairTier, "slots", slots, VT_SLOTS),
  FIELD(MiniCacheKiviPairTier, "positions", positions, VT_POSITIONS),
  FIELD(MiniCacheKiviPairTier, "norm_k_prev", norm_k_prev, VT_NORM_K_PREV),
  FIELD(MiniCacheKiviPairTier, "norm_k_cur", norm_k_cur, VT_NORM_K_CUR),
  FIELD(MiniCacheKiviPairTier, "norm_v_prev", norm_v_prev, VT_NORM_V_PREV),
  FIELD(MiniCacheKiviPairTier, "norm_v_cur", norm_v_cur, VT_NORM_V_CUR),
  FIELD(MiniCacheKiviPairTier, "retained_k_prev", retained_k_prev, VT_RETAINED_K_PREV),
  FIELD(MiniCacheKiviPairTier, "retained_k_cur", retained_k_cur, VT_RETAINED_K_CUR),
  FIELD(MiniCacheKiviPairTier, "retained_v_prev", retained_v_prev, VT_RETAINED_V_PREV),
  FIELD(MiniCacheKiviPairTier, "retained_v_cur", retained_v_cur, VT_RETAINED_V_CUR),
  FIELD(MiniCacheKiviPairTier, "directions.quantized_tokens", directions_quantized_tokens, VT_DIRECTIONS_QUANTIZED_TOKENS),
  FIELD(MiniCacheKiviPairTier, "directions.block_tokens", directions_block_tokens, VT_DIRECTIONS_BLOCK_TOKENS),
  FIELD(MiniCacheKiviPairTier, "directions.positions", directions_positions, VT_DIRECTIONS_POSITIONS),
  FIELD(MiniCacheKiviPairTier, "directions.key_codes", directions_key_codes, VT_DIRECTIONS_KEY_CODES),
  FIELD(MiniCacheKiviPairTier, "directions.value_codes", directions_value_codes, VT_DIRECTIONS_VALUE_CODES),
  FIELD(MiniCacheKiviPairTier, "directions.key_scales", directions_key_scales, VT_DIRECTIONS_KEY_SCALES),
  FIELD(MiniCacheKiviPairTier, "directions.key_zeros", directions_key_zeros, VT_DIRECTIONS_KEY_ZEROS),
  FIELD(MiniCacheKiviPairTier, "directions.value_scales", directions_value_scales, VT_DIRECTIONS_VALUE_SCALES),
  FIELD(MiniCacheKiviPairTier, "directions.value_zeros", directions_value_zeros, VT_DIRECTIONS_VALUE_ZEROS),
  FIELD(MiniCacheKiviPairTier, "directions.residual_keys", directions_residual_keys, VT_DIRECTIONS_RESIDUAL_KEYS),
  FIELD(MiniCacheKiviPairTier, "directions.residual_values", directions_residual_values, VT_DIRECTIONS_RESIDUAL_VALUES),
  FIELD(MiniCacheKiviPairTier, "pending.keys", pending_keys, VT_PENDING_KEYS),
  FIELD(MiniCacheKiviPairTier, "pending.values", pending_values, VT_PENDING_VALUES),
  FIELD(MiniCacheKiviPairTier, "pending.positions", pending_positions, VT_PENDING_POSITIONS),
  // SmallKvLayerTier (smallkv.layer)
  FIELD(SmallKvLayerTier, "started", started, VT_STARTED),
  FIELD(SmallKvLayerTier, "mapping", mapping, VT_MAPPING),
  FIELD(SmallKvLayerTier, "match_stats", match_stats, VT_MATCH_STATS),
  // SmallKvHeadTier (smallkv.head)
  FIELD(SmallKvHeadTier, "full_positions", full_positions, VT_FULL_POSITIONS),
  FIELD(SmallKvHeadTier, "full_keys", full_keys, VT_FULL_KEYS),
  FIELD(SmallKvHeadTier, "full_values", full_values, VT_FULL_VALUES),
  FIELD(SmallKvHeadTier, "full_scores", full_scores, VT_FULL_SCORES),
  FIELD(SmallKvHeadTier, "marginal_positions", marginal_positions, VT_MARGINAL_POSITIONS),
  FIELD(SmallKvHeadTier, "marginal_values", marginal_values, VT_MARGINAL_VALUES),
  FIELD(SmallKvHeadTier, "marginal_scores", marginal_scores, VT_MARGINAL_SCORES),
  FIELD(SmallKvHeadTier, "stats_done", stats_done, VT_STATS_DONE),
  FIELD(SmallKvHeadTier, "matched", matched, VT_MATCHED),
  FIELD(SmallKvHeadTier, "scores_from", scores_from, VT_SCORES_FROM),
  // SpeCacheHeadTier (specache.head)
  FIELD(SpeCacheHeadTier, "lowbit.quantized_tokens", lowbit_quantized_tokens, VT_LOWBIT_QUANTIZED_TOKENS),
  FIELD(SpeCacheHeadTier, "lowbit.block_tokens", lowbit_block_tokens, VT_LOWBIT_BLOCK_TOKENS),
  FIELD(SpeCacheHeadTier, "lowbit.positions", lowbit_positions, VT_LOWBIT_POSITIONS),
  FIELD(SpeCacheHeadTier, "lowbit.key_codes", lowbit_key_codes, VT_LOWBIT_KEY_CODES),
  FIELD(SpeCacheHeadTier, "lowbit.value_codes", lowbit_value_codes, VT_LOWBIT_VALUE_CODES),
  FIELD(SpeCacheHeadTier, "lowbit.key_scales", lowbit_key_scales, VT_LOWBIT_KEY_SCALES),
  FIELD(SpeCacheHeadTier, "lowbit.key_zeros", lowbit_key_zeros, VT_LOWBIT_KEY_ZEROS),
  FIELD(SpeCacheHeadTier, "lowbit.value_scales", lowbit_value_scales, VT_LOWBIT_VALUE_SCALES),
  FIELD(SpeCacheHeadTier, "lowbit.value_zeros", lowbit_value_zeros, VT_LOWBIT_VALUE_ZEROS),
  FIELD(SpeCacheHeadTier, "lowbit.residual_keys", lowbit_residual_keys, VT_LOWBIT_RESIDUAL_KEYS),
  FIELD(SpeCacheHeadTier, "lowbit.residual_values", lowbit_residual_values, VT_LOWBIT_RESIDUAL_VALUES),
  FIELD(SpeCacheHeadTier, "backing.keys", backing_keys, VT_BACKING_KEYS),
  FIELD(SpeCacheHeadTier, "backing.values", backing_values, VT_BACKING_VALUES),
  FIELD(SpeCacheHeadTier, "fetched_tokens", fetched_tokens, VT_FETCHED_TOKENS),
  FIELD(SpeCacheHeadTier, "fetched_keys", fetched_keys, VT_FETCHED_KEYS),
  FIELD(SpeCacheHeadTier, "fetched_values", fetched_values, VT_FETCHED_VALUES),
  };
  return all;
}
#undef FIELD

// The typed table of each record kind, as the generated union names it.
const std::map<std::string, std::pair<std::string, fb::StoreTier>>& generated_kinds() {
  static const std::map<std::string, std::pair<std::string, fb::StoreTier>> kinds = {
      {"kivi.head", {"KiviHeadTier", fb::StoreTier::KiviHeadTier}},
      {"spindlekv.head", {"SpindleKvHeadTier", fb::StoreTier::SpindleKvHeadTier}},
      {"minicache.pending", {"MiniCachePendingTier", fb::StoreTier::MiniCachePendingTier}},
      {"minicache.pair", {"MiniCachePairTier", fb::StoreTier::MiniCachePairTier}},
      {"minicache_kivi.pair", {"MiniCacheKiviPairTier", fb::StoreTier::MiniCacheKiviPairTier}},
      {"smallkv.layer", {"SmallKvLayerTier", fb::StoreTier::SmallKvLayerTier}},
      {"smallkv.head", {"SmallKvHeadTier", fb::StoreTier::SmallKvHeadTier}},
      {"specache.head", {"SpeCacheHeadTier", fb::StoreTier::SpeCacheHeadTier}},
  };
  return kinds;
}

TEST(TierSchema, EveryRegistryIdAndTypeIsTheGeneratedOne) {
  const auto& kinds = generated_kinds();
  ASSERT_EQ(fmt::tier_schema().size(), kinds.size());
  // One kind per union member, and the union has no other members.
  size_t members = 0;
  for (const fb::StoreTier t : fb::EnumValuesStoreTier()) {
    if (t == fb::StoreTier::NONE) continue;
    ++members;
    const fmt::TierKindSpec* spec = fmt::tier_kind(t);
    ASSERT_NE(spec, nullptr) << "union member " << fb::EnumNameStoreTier(t) << " has no kind";
    ASSERT_EQ(kinds.count(spec->kind), 1u) << spec->kind;
    EXPECT_EQ(kinds.at(spec->kind).second, t) << spec->kind;
    EXPECT_EQ(kinds.at(spec->kind).first, fb::EnumNameStoreTier(t)) << spec->kind;
  }
  EXPECT_EQ(members, kinds.size());
  std::map<std::string, size_t> per_table;
  for (const Generated& g : generated_fields()) {
    SCOPED_TRACE(g.table + "." + g.name);
    ++per_table[g.table];
    const fmt::TierKindSpec* spec = nullptr;
    for (const auto& [kind, table] : kinds) {
      if (table.first == g.table) spec = fmt::tier_kind(kind);
    }
    ASSERT_NE(spec, nullptr);
    const fmt::TierFieldSpec* f = spec->by_name(g.name);
    ASSERT_NE(f, nullptr) << "the registry lacks a field of the schema";
    EXPECT_EQ(fmt::tier_field_offset(f->id), g.vt) << "registry id " << f->id;
    EXPECT_EQ(flatbuffers::FieldIndexToOffset(f->id), g.vt);
    EXPECT_EQ(f->elem, g.elem);
    EXPECT_EQ(f->scalar, g.scalar);
    EXPECT_EQ(spec->by_id(f->id), f) << "two fields with one id";
    EXPECT_EQ(f->optional, g.name.rfind("backing.", 0) == 0);
  }
  for (const fmt::TierKindSpec& k : fmt::tier_schema()) {
    SCOPED_TRACE(k.kind);
    EXPECT_EQ(k.fields.size(), per_table[kinds.at(k.kind).first])
        << "the registry has a field the schema lacks";
    for (size_t i = 0; i < k.fields.size(); ++i) EXPECT_EQ(k.fields[i].id, i) << "ids in order";
  }
}

// ---- Records of every store ----

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

CachePtr proxy_for(const V2Case& cs, kvsdk_context* ctx, uint32_t steps) {
  if (!cs.proxy) return nullptr;
  CachePtr p = make_cache(ctx, v2_proxy_geometry());
  for (uint32_t s = 0; p && s < steps; ++s) EXPECT_EQ(v2_proxy_step(p.get(), s), KVSDK_OK);
  return p;
}

// The records of every layer of every preset of the v3 script (every store; eviction, merges,
// fetches and KIVI flushes included), after its base steps and after all its steps.
std::vector<kvsdk::TierRecord> records_of_every_store() {
  std::vector<kvsdk::TierRecord> out;
  size_t n = 0;
  const V3Case* cases = v3_cases(&n);
  for (size_t i = 0; i < n; ++i) {
    for (const uint32_t steps : {kV3BaseSteps, kV3EndSteps}) {
      auto ctx = make_context();
      CachePtr proxy = proxy_for(cases[i].script, ctx.get(), 0);
      kvsdk_cache* raw = nullptr;
      EXPECT_EQ(v3_build(cases[i], ctx.get(), proxy.get(), steps, &raw), KVSDK_OK)
          << cases[i].script.preset << ": " << kvsdk_last_error();
      if (!raw) continue;
      CachePtr c(raw);
      for (uint32_t l = 0; l < kV2Layers; ++l) {
        for (kvsdk::TierRecord& r : c->impl->tier_records(l)) out.push_back(std::move(r));
      }
    }
  }
  return out;
}

TEST(TierSchema, EveryKindAndFieldTheStoresWriteIsRegistered) {
  const std::vector<kvsdk::TierRecord> records = records_of_every_store();
  ASSERT_FALSE(records.empty());
  std::set<std::pair<std::string, std::string>> written;
  for (const kvsdk::TierRecord& r : records) {
    SCOPED_TRACE(r.kind);
    ASSERT_NE(fmt::tier_kind(r.kind), nullptr) << "a store writes a kind the registry lacks";
    EXPECT_NO_THROW(fmt::check_typed_record(r, KVSDK_E_INTERNAL));
    for (const kvsdk::TierField& f : r.fields) written.insert({r.kind, f.name});
  }
  // And the registry holds nothing the stores never write.
  for (const fmt::TierKindSpec& k : fmt::tier_schema()) {
    for (const fmt::TierFieldSpec& f : k.fields) {
      EXPECT_EQ(written.count({k.kind, f.name}), 1u) << k.kind << " " << f.name << " is never written";
    }
  }
}

bool same_record(const kvsdk::TierRecord& a, const kvsdk::TierRecord& b) {
  if (a.layer != b.layer || a.kv_head != b.kv_head || a.kind != b.kind ||
      a.fields.size() != b.fields.size()) {
    return false;
  }
  for (size_t i = 0; i < a.fields.size(); ++i) {
    const kvsdk::TierField& x = a.fields[i];
    const kvsdk::TierField& y = b.fields[i];
    if (x.name != y.name || x.u8 != y.u8 || x.u16 != y.u16 || x.i32 != y.i32 || x.u32 != y.u32 ||
        x.f32 != y.f32 || x.u64 != y.u64) {
      return false;
    }
  }
  return true;
}

// A verified Frame holding one TierChunk with `states`; its TypedTierStates.
struct TypedChunk {
  std::vector<uint8_t> buffer;
  bool verified = false;
  const flatbuffers::Vector<flatbuffers::Offset<fb::TypedTierState>>* states() const {
    return fb::GetFrame(buffer.data())->payload_as_TierChunk()->typed_tiers();
  }
};

template <typename Build>
TypedChunk chunk_of(Build build) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::TypedTierState>> states = build(b);
  const auto chunk = fb::CreateTierChunk(b, 0, 0, b.CreateVector(states));
  b.Finish(fb::CreateFrame(b, fb::Payload::TierChunk, chunk.Union()), fb::FrameIdentifier());
  TypedChunk out;
  out.buffer.assign(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  flatbuffers::Verifier v(out.buffer.data(), out.buffer.size());
  out.verified = fb::VerifyFrameBuffer(v);
  return out;
}

TEST(TierSchema, RecordsOfEveryStoreRoundTripThroughTheirTypedTables) {
  const std::vector<kvsdk::TierRecord> records = records_of_every_store();
  const TypedChunk c = chunk_of([&](flatbuffers::FlatBufferBuilder& b) {
    std::vector<flatbuffers::Offset<fb::TypedTierState>> s;
    for (const kvsdk::TierRecord& r : records) s.push_back(fmt::build_typed_tier(b, r));
    return s;
  });
  ASSERT_TRUE(c.verified);
  ASSERT_EQ(c.states()->size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE(records[i].kind);
    const fb::TypedTierState* t = c.states()->Get(uint32_t(i));
    EXPECT_EQ(t->tier_type(), fmt::tier_kind(records[i].kind)->type);
    EXPECT_TRUE(same_record(fmt::read_typed_tier(*t), records[i]));
  }
  // A record without SpeCache's backing rows (include_backing = 0) too.
  for (const kvsdk::TierRecord& r : records) {
    if (r.kind != "specache.head") continue;
    kvsdk::TierRecord lean = r;
    lean.fields.erase(std::remove_if(lean.fields.begin(), lean.fields.end(),
                                     [](const kvsdk::TierField& f) { return f.name.rfind("backing.", 0) == 0; }),
                      lean.fields.end());
    const TypedChunk lc = chunk_of([&](flatbuffers::FlatBufferBuilder& b) {
      return std::vector<flatbuffers::Offset<fb::TypedTierState>>{fmt::build_typed_tier(b, lean)};
    });
    ASSERT_TRUE(lc.verified);
    EXPECT_TRUE(same_record(fmt::read_typed_tier(*lc.states()->Get(0)), lean));
    break;
  }
}

kvsdk_status status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kvsdk::Error& e) {
    return e.status();
  }
  return KVSDK_OK;
}

kvsdk::TierRecord a_kivi_record() {
  for (const kvsdk::TierRecord& r : records_of_every_store()) {
    if (r.kind == "kivi.head") return r;
  }
  ADD_FAILURE() << "no kivi.head record";
  return {};
}

TEST(TierSchema, WritingWhatTheRegistryLacksIsInternal) {
  const kvsdk::TierRecord good = a_kivi_record();
  const auto write = [](const kvsdk::TierRecord& r) {
    return status_of([&] {
      flatbuffers::FlatBufferBuilder b;
      fmt::build_typed_tier(b, r);
    });
  };
  EXPECT_EQ(write(good), KVSDK_OK);
  kvsdk::TierRecord r = good;
  r.kind = "kivi.tail";
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "unknown kind";
  r = good;
  r.add("extra").u8 = {1};
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "unknown field";
  r = good;
  r.fields.erase(r.fields.begin() + 3);
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "missing field";
  r = good;
  r.fields.push_back(r.fields[2]);
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "field twice";
  r = good;
  r.fields[2].u32 = {7};  // positions (i32) with u32 elements
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "other element type";
  r = good;
  r.fields[0].u64 = {1, 2};  // quantized_tokens: a scalar
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "scalar of two elements";
  r = good;
  r.fields[0].u64.clear();
  EXPECT_EQ(write(r), KVSDK_E_INTERNAL) << "scalar of no element";
}

TEST(TierSchema, ReadingAMissingFieldOrAnUnknownTableIsCorrupt) {
  const auto read = [](const TypedChunk& c) {
    EXPECT_TRUE(c.verified);
    return status_of([&] { fmt::read_typed_tier(*c.states()->Get(0)); });
  };
  // A KiviHeadTier without residual_values, and one without its scalar.
  for (const bool drop_scalar : {false, true}) {
    const TypedChunk c = chunk_of([&](flatbuffers::FlatBufferBuilder& b) {
      const std::vector<uint16_t> h = {1, 2};
      const std::vector<int32_t> p = {0};
      const std::vector<uint8_t> codes;
      const std::vector<uint32_t> blocks;
      const auto t = fb::CreateKiviHeadTier(
          b, drop_scalar ? flatbuffers::nullopt : flatbuffers::Optional<uint64_t>(0),
          b.CreateVector(blocks), b.CreateVector(p), b.CreateVector(codes), b.CreateVector(codes),
          b.CreateVector(h), b.CreateVector(h), b.CreateVector(h), b.CreateVector(h),
          b.CreateVector(h), drop_scalar ? b.CreateVector(h) : 0);
      return std::vector<flatbuffers::Offset<fb::TypedTierState>>{
          fb::CreateTypedTierState(b, 0, 0, fb::StoreTier::KiviHeadTier, t.Union())};
    });
    EXPECT_EQ(read(c), KVSDK_E_CORRUPT) << (drop_scalar ? "no scalar" : "no residual_values");
  }
  // A union member this reader does not know (the Verifier lets unknown members through), and
  // none.
  for (const uint8_t type : {uint8_t(0), uint8_t(200)}) {
    const TypedChunk c = chunk_of([&](flatbuffers::FlatBufferBuilder& b) {
      const auto t = fb::CreateMiniCachePendingTier(b);
      return std::vector<flatbuffers::Offset<fb::TypedTierState>>{
          fb::CreateTypedTierState(b, 0, 0, fb::StoreTier(type), t.Union())};
    });
    EXPECT_EQ(read(c), KVSDK_E_CORRUPT) << "union type " << unsigned(type);
  }
}

// ---- Typed field deltas ----

// A delta of `now` against `before`, as build_layer_delta writes it (typed), in a finished buffer.
std::vector<uint8_t> typed_delta(const kvsdk::TierRecord& before, const kvsdk::TierRecord& now) {
  flatbuffers::FlatBufferBuilder b;
  const auto d = fmt::build_layer_delta(b, fmt::sign_layer({before}), {now}, true);
  b.Finish(d[0]);
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

TEST(TierSchema, TypedDeltasRebuildRecordsAndRefuseWhatDoesNotFit) {
  const kvsdk::TierRecord before = a_kivi_record();
  kvsdk::TierRecord now = before;
  now.fields[2].i32.push_back(1000);  // positions grew
  now.fields[9].u16.insert(now.fields[9].u16.end(), {1, 2, 3});
  const std::vector<uint8_t> buf = typed_delta(before, now);
  const auto* d = flatbuffers::GetRoot<fb::TierRecordDelta>(buf.data());
  EXPECT_EQ(d->kind(), nullptr) << "typed deltas name no kind";
  EXPECT_EQ(d->tier_type(), uint8_t(fb::StoreTier::KiviHeadTier));
  for (const fb::TierFieldDelta* f : *d->fields()) EXPECT_EQ(f->name(), nullptr);
  EXPECT_TRUE(same_record(fmt::apply_record_delta(*d, before, true), now));

  // Rebuilt by hand: the same delta with one field changed.
  const auto rebuilt = [&](int type, int id_of_field3, bool dup) {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<fb::TierFieldDelta>> fields;
    for (uint32_t i = 0; i < d->fields()->size(); ++i) {
      const fb::TierFieldDelta* f = d->fields()->Get(i);
      std::vector<fb::Segment> segs;
      for (const fb::Segment* sg : *f->segments()) segs.push_back(*sg);
      flatbuffers::Offset<fb::TierField> data = 0;
      if (f->data()) {
        const fb::TierField* x = f->data();
        const auto vec = [&](auto* v) {
          using T = typename std::remove_pointer_t<decltype(v)>::return_type;
          return v ? b.CreateVector(std::vector<T>(v->begin(), v->end())) : 0;
        };
        data = fb::CreateTierField(b, 0, vec(x->u8()), vec(x->u16()), vec(x->i32()), vec(x->u32()),
                                   vec(x->f32()), vec(x->u64()));
      }
      const uint16_t id = i == 3 && id_of_field3 >= 0 ? uint16_t(id_of_field3) : f->field_id();
      fields.push_back(fb::CreateTierFieldDelta(b, 0, f->type(), b.CreateVectorOfStructs(segs), data, id));
      if (dup && i == 3) fields.push_back(fields.back());
    }
    b.Finish(fb::CreateTierRecordDelta(b, d->layer(), d->kv_head(), 0, b.CreateVector(fields),
                                       uint8_t(type)));
    return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  };
  const auto apply = [&](const std::vector<uint8_t>& x) {
    return status_of([&] {
      fmt::apply_record_delta(*flatbuffers::GetRoot<fb::TierRecordDelta>(x.data()), before, true);
    });
  };
  EXPECT_EQ(apply(rebuilt(int(fb::StoreTier::KiviHeadTier), -1, false)), KVSDK_OK);
  EXPECT_EQ(apply(rebuilt(int(fb::StoreTier::SpeCacheHeadTier), -1, false)), KVSDK_E_CORRUPT)
      << "another table than the record before";
  EXPECT_EQ(apply(rebuilt(0, -1, false)), KVSDK_E_CORRUPT) << "no table";
  EXPECT_EQ(apply(rebuilt(int(fb::StoreTier::KiviHeadTier), 11, false)), KVSDK_E_CORRUPT)
      << "a field id the table lacks";
  EXPECT_EQ(apply(rebuilt(int(fb::StoreTier::KiviHeadTier), 2, false)), KVSDK_E_CORRUPT)
      << "positions' id for key_codes: another element type";
  EXPECT_EQ(apply(rebuilt(int(fb::StoreTier::KiviHeadTier), -1, true)), KVSDK_E_CORRUPT)
      << "a field twice";
}

// ---- Deltas continue a file in its own format ----

struct FileDeltas {
  uint16_t major = 0, minor = 0;
  size_t typed_records = 0, named_records = 0, whole_typed = 0, whole_named = 0, journal = 0;
};

// The container version of a file and what its journal deltas hold.
FileDeltas inspect(const std::vector<unsigned char>& f) {
  FileDeltas out;
  const fmt::FileHeader h = fmt::decode_file_header(f.data());
  out.major = h.major;
  out.minor = h.minor;
  fmt::ZstdDecompressor z;
  std::vector<unsigned char> raw;
  for (size_t pos = fmt::kFileHeaderBytes; pos + fmt::kFrameHeaderBytes <= f.size();) {
    fmt::FrameHeader fh;
    if (!fmt::decode_frame_header(&f[pos], h.snapshot_id, &fh, h.major)) {
      pos += fmt::kTrailerBytes;
      continue;
    }
    if (fh.kind == uint8_t(fmt::FrameKind::kJournal)) {
      ++out.journal;
      z.decompress(&f[pos + fmt::kFrameHeaderBytes], fh.payload_bytes, fh.raw_bytes, raw);
      const fb::JournalDelta* d = fb::GetFrame(raw.data())->payload_as_JournalDelta();
      if (d->tier_deltas()) {
        for (const fb::TierRecordDelta* r : *d->tier_deltas()) {
          (r->tier_type() != 0 ? out.typed_records : out.named_records) += 1;
          EXPECT_EQ(r->tier_type() != 0, r->kind() == nullptr);
        }
      }
      if (d->typed_tiers()) out.whole_typed += d->typed_tiers()->size();
      if (d->tiers()) out.whole_named += d->tiers()->size();
    }
    pos += fmt::kFrameHeaderBytes + fh.payload_bytes;
  }
  return out;
}

void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  FILE* o = std::fopen(path.c_str(), "wb");
  ASSERT_NE(o, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), o), bytes.size());
  std::fclose(o);
}

// Loads a copy of golden file `name` (a v3-script kivi case), runs two more steps, appends a
// delta; returns what the file holds then, and checks that it loads as the cache that wrote it.
FileDeltas continue_file(const std::string& golden, const std::string& path, uint32_t percent) {
  size_t n = 0;
  const V3Case& cs = v3_cases(&n)[5];  // v3_0_kivi
  EXPECT_STREQ(cs.script.preset, "kivi");
  write_file(path, read_file(std::string(KVSDK_GOLDEN_DIR) + "/" + golden));
  auto ctx = make_context();
  const kvsdk_geometry g = v2_geometry();
  kvsdk_cache* raw = nullptr;
  EXPECT_EQ(kvsdk_cache_load(&raw, ctx.get(), path.c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr c(raw);
  for (uint32_t s = kV3EndSteps; s < kV3EndSteps + 2; ++s) {
    EXPECT_EQ(v2_step(cs.script, c.get(), nullptr, s, nullptr), KVSDK_OK);
  }
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.max_journal_percent = percent;
  EXPECT_EQ(kvsdk_cache_save_delta(c.get(), path.c_str(), &o), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* back = nullptr;
  EXPECT_EQ(kvsdk_cache_load(&back, ctx.get(), path.c_str(), &g, nullptr), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr b(back);
  for (uint32_t l = 0; b && l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      uint64_t na = 0, nb = 0, da = 0, db = 0;
      EXPECT_EQ(v2_rows_digest(c.get(), l, h, &na, &da), KVSDK_OK);
      EXPECT_EQ(v2_rows_digest(b.get(), l, h, &nb, &db), KVSDK_OK);
      EXPECT_EQ(na, nb);
      EXPECT_EQ(da, db) << "layer " << l << " head " << h;
    }
  }
  const FileDeltas out = inspect(read_file(path));
  std::remove(path.c_str());
  return out;
}

TEST(TierSchema, DeltasContinueAFileInItsOwnFormat) {
  const std::string path = ::testing::TempDir() + "/tier_schema_continue.kvsnap";
  // 2.0: whole named records; 3.0: named field deltas; 4.0: typed field deltas.
  FileDeltas v2 = continue_file("v2_0_kivi.kvsnap", path, 0);
  EXPECT_EQ(v2.major, 2);
  EXPECT_GT(v2.whole_named, 0u);
  EXPECT_EQ(v2.typed_records + v2.named_records + v2.whole_typed, 0u);
  FileDeltas v3 = continue_file("v3_0_kivi.kvsnap", path, 0);
  EXPECT_EQ(v3.major, 3);
  EXPECT_EQ(v3.minor, 0);
  EXPECT_GT(v3.named_records, 0u);
  EXPECT_EQ(v3.typed_records + v3.whole_typed, 0u);
  FileDeltas v4 = continue_file("v4_0_kivi.kvsnap", path, 0);
  EXPECT_EQ(v4.major, 4);
  EXPECT_EQ(v4.minor, 0);
  EXPECT_GT(v4.typed_records, 0u);
  EXPECT_EQ(v4.named_records + v4.whole_named, 0u);
  // Compaction (the journal outgrew max_journal_percent) rewrites an old file in the newest
  // format, with no journal.
  FileDeltas compacted = continue_file("v3_0_kivi.kvsnap", path, 1);
  EXPECT_EQ(compacted.major, 4);  // (5.0 is for conversations on a shared prefix only)
  EXPECT_EQ(compacted.minor, 1);
  EXPECT_EQ(compacted.journal, 0u);
}

}  // namespace
