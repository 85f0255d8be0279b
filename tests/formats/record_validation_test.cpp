// A load (and `kvsdk verify`, which loads) validates every record it reads, whether or not the
// record survives to the loaded cache: compressed-store records of the base that a journal delta
// replaces, and journal records that a later delta replaces, used to be skipped, so a file with
// an invalid record was "sound" as long as a delta replaced it. And every position a snapshot
// holds lies in 0..KVSDK_MAX_POSITION, in exact rows, compressed-store records and observation
// windows alike. The files are "mutated snapshots with valid checksums" (snapshot_mutation.h).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "snapshot_mutation.h"
#include "snapshot_test_util.h"
#include "test_util.h"

using namespace kvsdk_test;
namespace fb = kvsdk::fb;

namespace {

kvsdk_geometry geometry() { return make_geometry(4, 8, 2, 32); }

kvsdk_policy preset(const std::string& spec) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec.c_str()), KVSDK_OK) << kvsdk_last_error();
  p.quant_group = 8;  // a few dozen tokens already fill quantized KIVI blocks
  p.quant_residual = 16;
  return p;
}

// Appends `n` tokens at positions pos0.. to one layer.
void append(kvsdk_cache* c, const kvsdk_geometry& g, uint32_t layer, size_t n, int32_t pos0,
            uint32_t seed) {
  const size_t elems = n * g.n_kv_heads * g.head_dim;
  const auto k = random_floats(elems, seed * 131 + layer * 2);
  const auto v = random_floats(elems, seed * 131 + layer * 2 + 1);
  const auto p = iota_positions(n, pos0);
  ASSERT_EQ(kvsdk_cache_append(c, layer, n, k.data(), v.data(), p.data(), elems * 4), KVSDK_OK)
      << kvsdk_last_error();
}

// Loads and destroys; the status. The context must be charged nothing by a failed load.
kvsdk_status load_bytes(const std::vector<unsigned char>& bytes, kvsdk_load_info* info = nullptr) {
  auto ctx = make_context();
  kvsdk_status st = KVSDK_OK;
  CachePtr c = load_buffer(ctx.get(), bytes, &st, info);
  if (st != KVSDK_OK) {
    uint64_t used = 1;
    EXPECT_EQ(kvsdk_context_used_bytes(ctx.get(), &used), KVSDK_OK);
    EXPECT_EQ(used, 0u) << "a failed load left bytes charged";
  }
  return st;
}

kvsdk_status load_path(const std::string& path) {
  auto ctx = make_context();
  kvsdk_cache* c = nullptr;
  const kvsdk_status st = kvsdk_cache_load(&c, ctx.get(), path.c_str(), nullptr, nullptr);
  kvsdk_cache_destroy(c);
  return st;
}

// `kvsdk verify FILE --json` must exit 1 with KVSDK_E_CORRUPT (the CLI built with these tests;
// cross builds, which cannot start it from here, check only the loader).
void expect_verify_rejects(const std::string& path) {
#ifdef KVSDK_CLI
  const std::string out = path + ".verify";
  const std::string cmd = std::string("'") + KVSDK_CLI + "' verify '" + path + "' --json >'" +
                          out + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::vector<unsigned char> text = read_file(out);
  const std::string s(text.begin(), text.end());
  ASSERT_TRUE(WIFEXITED(rc)) << "kvsdk verify died: " << s;
  EXPECT_EQ(WEXITSTATUS(rc), 1) << "kvsdk verify accepted " << path << ": " << s;
  EXPECT_NE(s.find("KVSDK_E_CORRUPT"), std::string::npos) << s;
#else
  (void)path;
#endif
}

void expect_corrupt(const std::vector<unsigned char>& bytes, TempDir& dir, const std::string& name) {
  EXPECT_EQ(load_bytes(bytes), KVSDK_E_CORRUPT) << name << ": " << kvsdk_last_error();
  const std::string path = dir.file(name + ".kvsnap");
  write_file(path, bytes);
  EXPECT_EQ(load_path(path), KVSDK_E_CORRUPT) << name << ": " << kvsdk_last_error();
  expect_verify_rejects(path);
}

// Keeps the base and the first `deltas` journal frames (each delta here is one frame).
std::function<bool(MutableFrame&)> keep(size_t deltas) {
  return [deltas](MutableFrame& f) { return !f.journal || f.index < deltas; };
}

// ---------------------------------------------------------------------------------------------
// Records replaced by a later delta.

// One invalid value in the record of layer 0, KV head 1 of a preset's snapshot.
struct Mutation {
  const char* preset;
  const char* field;
  std::function<void(kvsdk::TierField&)> apply;
  const char* what;
};

std::ostream& operator<<(std::ostream& os, const Mutation& m) {
  return os << m.preset << " " << m.field << " (" << m.what << ")";
}

const Mutation kMutations[] = {
    {"spindlekv", "keys.index", [](kvsdk::TierField& f) { f.u32.at(0) = 0xFFFFFFFFu; },
     "codebook index 0xFFFFFFFF"},
    {"spindlekv", "values.magnitude", [](kvsdk::TierField& f) { f.f32.pop_back(); },
     "one magnitude short of the indices"},
    {"kivi", "quantized_tokens", [](kvsdk::TierField& f) { f.u64.at(0) += 1; },
     "quantized-token count that no block layout holds"},
    {"kivi", "key_codes", [](kvsdk::TierField& f) { f.u8.pop_back(); },
     "key codes one byte short of the quantized tokens"},
    {"kivi", "block_tokens", [](kvsdk::TierField& f) { f.u32 = {9, 9, 9, 5}; },
     "block counts over the group size"},
    {"snapkv+kivi2", "quantized_tokens", [](kvsdk::TierField& f) { f.u64.at(0) += 1; },
     "KIVI overlay: quantized-token count that no block layout holds"},
    {"specache", "fetched_tokens", [](kvsdk::TierField& f) { f.u32.at(0) = 1u << 30; },
     "fetched token beyond the held tokens"},
    {"minicache", "pending.positions", [](kvsdk::TierField& f) { f.i32.push_back(3); },
     "a pending position without its rows"},
    {"smallkv", "full_scores", [](kvsdk::TierField& f) { f.f32.pop_back(); },
     "one score short of the full rows"},
};

// The layer the mutations hit: the first one the preset holds compressed (minicache merges from
// its boundary layer, the middle, on).
uint32_t target_layer(const std::string& spec) { return spec == "minicache" ? 2 : 0; }

// Applies `m` to the record of (layer, KV head 1); whether it was that record.
bool apply_to(const Mutation& m, uint32_t layer, kvsdk::TierRecord& r) {
  if (r.layer != layer || r.kv_head != 1 || !r.has(m.field)) return false;
  for (kvsdk::TierField& f : r.fields) {
    if (f.name == m.field) m.apply(f);
  }
  return true;
}

// A preset's cache with 50 tokens in every layer (SpeCache: fetched rows in every record).
std::vector<unsigned char> base_snapshot(const std::string& spec) {
  auto ctx = make_context();
  const kvsdk_geometry g = geometry();
  const kvsdk_policy p = preset(spec);
  auto c = make_cache(ctx.get(), g, &p);
  EXPECT_TRUE(c) << kvsdk_last_error();
  if (!c) return {};
  for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 50, 0, 1);
  if (spec == "specache") {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const auto q = random_floats(g.n_q_heads * g.head_dim, 5 + l);
      EXPECT_EQ(kvsdk_cache_prefetch(c.get(), l, 1, q.data(), nullptr, q.size() * 4), KVSDK_OK)
          << kvsdk_last_error();
    }
  }
  return save_buffer(c.get());
}

// Every preset: a base and two journal deltas, each of which replaces the target layer's records
// whole (with the base's own records, so that the file is sound unless a record is mutated).
class ReplacedRecords : public ::testing::TestWithParam<Mutation> {
 protected:
  void SetUp() override {
    layer_ = target_layer(GetParam().preset);
    base_ = base_snapshot(GetParam().preset);
    ASSERT_FALSE(base_.empty());
    layer_state_ = base_layer(base_, layer_);
    ASSERT_FALSE(layer_state_.records.empty());
    // Controls: the file is sound as built, and both deltas apply.
    kvsdk_load_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(load_bytes(build(false, false, false), &info), KVSDK_OK) << kvsdk_last_error();
    ASSERT_EQ(info.journal_frames_applied, 2u);
  }
  // The base (mutated or not), then `deltas` deltas; `bad1`/`bad2`: delta 1/2 carries the
  // mutated record.
  std::vector<unsigned char> build(bool bad_base, bool bad1, bool bad2, int deltas = 2) {
    const Mutation& m = GetParam();
    std::vector<kvsdk::TierRecord> bad = layer_state_.records;
    size_t hits = 0;
    for (kvsdk::TierRecord& r : bad) hits += apply_to(m, layer_, r);
    EXPECT_EQ(hits, 1u) << "no record of layer " << layer_ << " KV head 1 has field " << m.field;
    std::vector<std::vector<uint8_t>> journal;
    if (deltas >= 1) {
      journal.push_back(whole_layer_delta(1, layer_, bad1 ? bad : layer_state_.records,
                                          layer_state_.appended, layer_state_.typed));
    }
    if (deltas >= 2) {
      journal.push_back(whole_layer_delta(2, layer_, bad2 ? bad : layer_state_.records,
                                          layer_state_.appended, layer_state_.typed));
    }
    size_t changed = 0;
    auto out = rewrite_snapshot(
        base_,
        [&](MutableFrame& f) {
          if (bad_base) {
            changed += change_records(f, [&](kvsdk::TierRecord& r) { return apply_to(m, layer_, r); });
          }
          return !f.journal;
        },
        journal);
    if (bad_base) EXPECT_EQ(changed, 1u);
    return out;
  }
  uint32_t layer_ = 0;
  std::vector<unsigned char> base_;
  BaseLayer layer_state_;
  TempDir dir_;
};

TEST_P(ReplacedRecords, BaseRecordsThatADeltaReplacesAreValidated) {
  // Without the journal the mutated record is the one a load restores: rejected.
  expect_corrupt(build(true, false, false, 0), dir_, "base_only");
  // With deltas that replace it, the file holds the same invalid record: rejected all the same.
  expect_corrupt(build(true, false, false, 1), dir_, "base_and_one_delta");
  expect_corrupt(build(true, false, false, 2), dir_, "base_and_two_deltas");
}

TEST_P(ReplacedRecords, JournalRecordsThatALaterDeltaReplacesAreValidated) {
  // The last delta's records are the ones a load restores: rejected.
  expect_corrupt(build(false, true, false, 1), dir_, "last_delta");
  expect_corrupt(build(false, false, true, 2), dir_, "second_delta");
  // The second delta replaces the first one's: rejected all the same.
  expect_corrupt(build(false, true, false, 2), dir_, "replaced_delta");
}

INSTANTIATE_TEST_SUITE_P(Presets, ReplacedRecords, ::testing::ValuesIn(kMutations),
                         [](const ::testing::TestParamInfo<Mutation>& i) {
                           std::string s = std::string(i.param.preset) + "_" + i.param.field;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// The defect as found: a spindlekv cache saved, a real delta (kvsdk_cache_save_delta) that
// replaces layer 0 after more tokens, and the base's codebook index patched to 0xFFFFFFFF.
TEST(ReplacedRecordsAsFound, SpindleKvCodebookIndexBehindARealDelta) {
  TempDir dir;
  auto ctx = make_context();
  const kvsdk_geometry g = geometry();
  const kvsdk_policy p = preset("spindlekv");
  auto c = make_cache(ctx.get(), g, &p);
  ASSERT_TRUE(c) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 50, 0, 1);
  const std::string path = dir.file("spindle.kvsnap");
  ASSERT_EQ(kvsdk_cache_save(c.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  append(c.get(), g, 0, 4, 50, 2);
  ASSERT_EQ(kvsdk_cache_save_delta(c.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  const std::vector<unsigned char> file = read_file(path);
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(load_bytes(file, &info), KVSDK_OK) << kvsdk_last_error();
  ASSERT_EQ(info.journal_frames_applied, 1u);
  size_t changed = 0;
  const auto patch = [&](MutableFrame& f) {
    changed += change_records(f, [](kvsdk::TierRecord& r) {
      if (r.layer != 0 || r.kv_head != 0) return false;
      for (kvsdk::TierField& field : r.fields) {
        if (field.name == "keys.index") field.u32.at(0) = 0xFFFFFFFFu;
      }
      return true;
    });
    return true;
  };
  const std::vector<unsigned char> bad = rewrite_snapshot(file, patch);
  ASSERT_EQ(changed, 1u);
  expect_corrupt(rewrite_snapshot(bad, base_only()), dir, "spindle_base_only");
  expect_corrupt(bad, dir, "spindle_with_delta");
}

// ---------------------------------------------------------------------------------------------
// Positions outside 0..KVSDK_MAX_POSITION.

// A snapshot of `spec` with 30 tokens in every layer (an observed window for window methods),
// then one delta appending 3 tokens to every layer; positions 0...
std::vector<unsigned char> small_journaled(const std::string& spec, TempDir& dir) {
  auto ctx = make_context();
  const kvsdk_geometry g = geometry();
  const kvsdk_policy p = preset(spec);
  auto c = make_cache(ctx.get(), g, &p);
  EXPECT_TRUE(c) << kvsdk_last_error();
  if (!c) return {};
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    append(c.get(), g, l, 30, 0, 1);
    const auto q = random_floats(2 * g.n_q_heads * g.head_dim, 9 + l);
    const auto qp = iota_positions(2, 28);
    EXPECT_EQ(kvsdk_cache_observe(c.get(), l, 2, q.data(), qp.data(), q.size() * 4), KVSDK_OK)
        << kvsdk_last_error();
  }
  const std::string path = dir.file(spec + "-positions.kvsnap");
  EXPECT_EQ(kvsdk_cache_save(c.get(), path.c_str(), nullptr), KVSDK_OK) << kvsdk_last_error();
  for (uint32_t l = 0; l < g.n_layers; ++l) append(c.get(), g, l, 3, 30, 2);
  EXPECT_EQ(kvsdk_cache_save_delta(c.get(), path.c_str(), nullptr), KVSDK_OK)
      << kvsdk_last_error();
  return read_file(path);
}

// Where a position is changed: base exact rows, delta exact rows, the observation window (in
// place, in the file with its delta), a base record (base alone: the delta would replace it), a
// record of a hand-built delta that replaces layer 0 (after the real delta).
enum class Where { kBaseRows, kDeltaRows, kWindow, kRecord, kDeltaRecord };

struct PositionCase {
  const char* preset;
  Where where;
  const char* field;  // records: the i32 field of layer 0, KV head 1
  int32_t value;
};

std::string describe(const PositionCase& pc) {
  static const char* const names[] = {"base rows", "delta rows", "the observation window",
                                      "a base record", "a delta record"};
  return std::string(pc.preset) + ": position " + std::to_string(pc.value) + " in " +
         names[int(pc.where)] + " " + pc.field;
}

// Sets element 1 of the place in a frame, for the in-place cases; how many places it changed.
size_t set_position_in_place(const PositionCase& pc, MutableFrame& f) {
  const fb::Frame* root = f.root();
  if (pc.where == Where::kBaseRows) {
    const fb::TierChunk* c = f.journal ? nullptr : root->payload_as_TierChunk();
    if (!c || !c->heads()) return 0;
    for (const fb::HeadRows* hr : *c->heads()) {
      if (hr->layer() == 0 && hr->kv_head() == 1 && hr->row_begin() == 0) {
        mutable_data(hr->exact()->positions())[1] = pc.value;
        return 1;
      }
    }
  } else if (pc.where == Where::kDeltaRows) {
    const fb::JournalDelta* d = f.journal ? root->payload_as_JournalDelta() : nullptr;
    if (!d || !d->heads()) return 0;
    for (const fb::HeadDelta* hd : *d->heads()) {
      if (hd->layer() == 0 && hd->kv_head() == 1) {
        mutable_data(hd->new_rows()->positions())[1] = pc.value;
        return 1;
      }
    }
  } else if (pc.where == Where::kWindow) {
    const fb::Metadata* m = f.journal ? nullptr : root->payload_as_Metadata();
    if (!m || !m->policy_state()) return 0;
    const fb::LayerPolicyState* ls = m->policy_state()->layers()->Get(0);
    if (!ls->window_positions()) return 0;
    mutable_data(ls->window_positions())[1] = pc.value;
    return 1;
  }
  return 0;
}

bool set_record_position(const PositionCase& pc, kvsdk::TierRecord& r) {
  if (r.layer != 0 || r.kv_head != 1 || !r.has(pc.field)) return false;
  for (kvsdk::TierField& f : r.fields) {
    if (f.name == pc.field) f.i32.at(1) = pc.value;
  }
  return true;
}

// The file of small_journaled() with one position set to pc.value.
std::vector<unsigned char> with_position(const std::vector<unsigned char>& file,
                                         const PositionCase& pc) {
  size_t found = 0;
  std::vector<unsigned char> out;
  if (pc.where == Where::kRecord) {
    out = rewrite_snapshot(file, [&](MutableFrame& f) {
      found += change_records(f, [&](kvsdk::TierRecord& r) { return set_record_position(pc, r); });
      return !f.journal;
    });
  } else if (pc.where == Where::kDeltaRecord) {
    BaseLayer layer = base_layer(file, 0);
    for (kvsdk::TierRecord& r : layer.records) found += set_record_position(pc, r);
    out = rewrite_snapshot(file, keep_all(),
                           {whole_layer_delta(2, 0, layer.records, layer.appended, layer.typed)});
  } else {
    out = rewrite_snapshot(file, [&](MutableFrame& f) {
      found += set_position_in_place(pc, f);
      return true;
    });
  }
  EXPECT_EQ(found, 1u) << describe(pc) << ": the place was not found";
  return out;
}

const PositionCase kPositionCases[] = {
    {"full", Where::kBaseRows, "", INT32_MAX},
    {"full", Where::kBaseRows, "", -1},
    {"full", Where::kDeltaRows, "", INT32_MAX},
    {"full", Where::kDeltaRows, "", INT32_MIN},
    {"snapkv", Where::kWindow, "", -7},
    {"spindlekv", Where::kRecord, "positions", INT32_MAX},
    {"spindlekv", Where::kDeltaRecord, "positions", INT32_MAX},
    {"kivi", Where::kRecord, "positions", -1},
    {"kivi", Where::kRecord, "positions", INT32_MAX},
    {"kivi", Where::kDeltaRecord, "positions", INT32_MAX},
    {"snapkv+kivi2", Where::kRecord, "positions", INT32_MAX},
    {"specache", Where::kRecord, "lowbit.positions", INT32_MAX},
    {"smallkv", Where::kRecord, "full_positions", INT32_MAX},
};

TEST(SnapshotPositions, PositionsOutsideTheContractAreCorrupt) {
  TempDir dir;
  for (const PositionCase& pc : kPositionCases) {
    SCOPED_TRACE(describe(pc));
    const std::vector<unsigned char> file = small_journaled(pc.preset, dir);
    ASSERT_FALSE(file.empty());
    ASSERT_EQ(load_bytes(file), KVSDK_OK) << kvsdk_last_error();
    expect_corrupt(with_position(file, pc), dir, std::string(pc.preset) + "_position");
  }
}

TEST(SnapshotPositions, TheTopOfTheRangeIsAValidPosition) {
  TempDir dir;
  // The same places at KVSDK_MAX_POSITION load (the check is not off by one).
  for (PositionCase pc : kPositionCases) {
    pc.value = KVSDK_MAX_POSITION;
    SCOPED_TRACE(describe(pc));
    const std::vector<unsigned char> file = small_journaled(pc.preset, dir);
    ASSERT_FALSE(file.empty());
    EXPECT_EQ(load_bytes(with_position(file, pc)), KVSDK_OK) << kvsdk_last_error();
  }
}

}  // namespace
