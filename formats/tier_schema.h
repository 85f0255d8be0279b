// The typed compressed-store tables of format major 4 (formats/kvsdk.fbs: KiviHeadTier, ...,
// union StoreTier, TypedTierState): the one registry that says, per record kind a store writes
// (kvsdk::TierRecord::kind), which typed table holds it and, per field name, the field's id in
// that table and its element type. Stores keep saving and restoring TierRecords (named fields);
// this registry converts them to and from the typed tables, so src/repr never sees FlatBuffers.
//
// tests/formats/tier_schema_test.cpp checks every id and element type here against the code flatc
// generates from kvsdk.fbs (the VT_* offsets and accessor types) and that every kind and field
// that a store of every preset writes is here, so the registry cannot drift from the schema or
// the stores. A change to a store's fields therefore means: a new field in its table (the next
// free id, never a renumbered or removed one) and a line here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/store_view.h"
#include "kvsdk_generated.h"

namespace kvsdk::format {

// Element types, numbered as TierFieldDelta.type (kvsdk.fbs).
enum class TierElem : uint8_t { kU8 = 1, kU16 = 2, kI32 = 3, kU32 = 4, kF32 = 5, kU64 = 6 };

struct TierFieldSpec {
  std::string name;    // the record's field name, e.g. "lowbit.key_codes"
  uint16_t id = 0;     // its id in the kind's typed table
  TierElem elem = TierElem::kU8;
  bool scalar = false;    // exactly one element, a `= null` scalar in the table
  bool optional = false;  // may be absent (SpeCache's backing rows, include_backing = 0)
};

struct TierKindSpec {
  std::string kind;                   // e.g. "kivi.head"
  fb::StoreTier type = fb::StoreTier::NONE;  // its typed table
  std::vector<TierFieldSpec> fields;  // in id order, which is the order the store adds them
  const TierFieldSpec* by_name(const std::string& name) const;
  const TierFieldSpec* by_id(uint16_t id) const;
};

// Every record kind of every store.
const std::vector<TierKindSpec>& tier_schema();
// The kind's entry, or nullptr when the registry does not know it.
const TierKindSpec* tier_kind(const std::string& kind);
const TierKindSpec* tier_kind(fb::StoreTier type);

// Vtable offset of the field with id `id` (what flatc names VT_*).
constexpr flatbuffers::voffset_t tier_field_offset(uint16_t id) {
  return flatbuffers::voffset_t(4 + 2 * id);
}

// Checks a record against the registry: a known kind, known fields each once, every element in
// the vector of its field's type, scalars with one element, every field that is not optional
// present. Throws `status` (KVSDK_E_INTERNAL for a record about to be written, KVSDK_E_CORRUPT
// for one read or rebuilt from a file) naming the kind and field.
void check_typed_record(const TierRecord& record, kvsdk_status status);

// Writes a record as its typed table; throws KVSDK_E_INTERNAL when check_typed_record fails.
flatbuffers::Offset<fb::TypedTierState> build_typed_tier(flatbuffers::FlatBufferBuilder& fbb,
                                                         const TierRecord& record);
// Reads a verified typed table back into a record (fields in id order); throws KVSDK_E_CORRUPT
// for an unknown or empty union, or a missing field. Layer/head ranges are checked by the caller.
TierRecord read_typed_tier(const fb::TypedTierState& state);

}  // namespace kvsdk::format
