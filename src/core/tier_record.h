// The saved state of one store (one layer and KV head, or one layer pair): named, typed buffers,
// the in-memory form of a snapshot record. formats/ writes each kind as its typed FlatBuffers
// table (format 4: KiviHeadTier, SpindleKvHeadTier, ... in formats/kvsdk.fbs, every field with an
// explicit id, mapped by the registry formats/tier_schema.cpp; formats 2.0-3.1 wrote generic
// named `TierState` tables) and hands them back on load. Names make a record self-describing, so a
// reader can say exactly which buffer of which store is missing or inconsistent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/error.h"

namespace kvsdk {

// A field whose name ends in "positions" ("positions", "lowbit.positions", "full_positions",
// ...) holds token positions (i32); the snapshot reader checks every one of them against
// KVSDK_MAX_POSITION, in every record it reads.
struct TierField {
  std::string name;
  std::vector<uint8_t> u8;
  std::vector<uint16_t> u16;
  std::vector<int32_t> i32;
  std::vector<uint32_t> u32;
  std::vector<float> f32;
  std::vector<uint64_t> u64;
};

struct TierRecord {
  uint32_t layer = 0;
  uint32_t kv_head = 0;
  std::string kind;  // which store wrote it, e.g. "kivi.head"; checked by the reader
  std::vector<TierField> fields;

  TierField& add(std::string name) {
    fields.push_back(TierField{});
    fields.back().name = std::move(name);
    return fields.back();
  }
  // The field called `name`; throws KVSDK_E_CORRUPT when the record lacks it.
  const TierField& get(const std::string& name) const {
    for (const TierField& f : fields) {
      if (f.name == name) return f;
    }
    fail(KVSDK_E_CORRUPT, "snapshot tier record '", kind, "' (layer ", layer, ", KV head ",
         kv_head, ") has no field '", name, "'");
  }
  bool has(const std::string& name) const {
    for (const TierField& f : fields) {
      if (f.name == name) return true;
    }
    return false;
  }
  // A scalar stored as a one-element u64 vector; throws KVSDK_E_CORRUPT when it is not one.
  uint64_t scalar(const std::string& name) const {
    const TierField& f = get(name);
    if (f.u64.size() != 1) {
      fail(KVSDK_E_CORRUPT, "snapshot tier record '", kind, "' field '", name,
           "' is not a scalar");
    }
    return f.u64[0];
  }
  void set_scalar(std::string name, uint64_t value) { add(std::move(name)).u64 = {value}; }
};

}  // namespace kvsdk
