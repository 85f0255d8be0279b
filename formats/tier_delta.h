// Journal deltas of compressed stores, field by field (format major 3; by typed table and field id
// from format major 4).
//
// A compressed store's record after a few appends is mostly its record before them: KIVI blocks
// flushed earlier never change and new ones are appended, codebooks, indices, merged tokens and
// SpeCache's backing rows only grow, a residual window slides by whole rows. Rewriting every
// changed layer whole (format 2.0 deltas) made a compressed conversation's journal grow with the
// square of its length. Instead, a delta describes each field of each record as segments of
// elements, in the field's new order: "copy elements [b, b + n) of the field before the delta"
// or "take the next n new elements", plus the new elements themselves.
//
// The writer keeps no copy of the records, only a signature of each field: its element count, a
// hash of its whole content and a hash of each 256-byte chunk. A field that grew by appending
// (its old content is the prefix of its new one) is one copy and one new segment, whatever its
// length; otherwise the chunks that survive in order (a window that dropped its oldest whole
// chunks, rows evicted in chunk-aligned runs) are copied and the rest is new, so the worst case
// is a rewrite of that field. Costs: 8 bytes of host memory per 256 bytes of compressed store
// between saves, and one hash pass over the stores per delta.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/store_view.h"
#include "kvsdk_generated.h"

namespace kvsdk::format {

struct FieldSignature {
  std::string name;
  uint8_t type = 0;     // TierFieldType below; 0 for a field with no elements
  uint64_t count = 0;   // elements
  uint64_t hash = 0;    // of all elements
  std::vector<uint64_t> chunks;  // of each chunk of kChunkBytes (the last one may be shorter)
};

struct RecordSignature {
  uint32_t layer = 0, kv_head = 0;
  std::string kind;
  std::vector<FieldSignature> fields;
};

// The records of one layer as the last save, delta or load left them.
using LayerSignature = std::vector<RecordSignature>;

LayerSignature sign_layer(const std::vector<TierRecord>& records);
// Removes SpeCache's "backing.*" fields, as a save without include_backing writes the records.
void drop_backing_fields(LayerSignature& layer);

// True when `now` can be written as field deltas of the records `before` describes: the same
// number of records with the same kinds, layers and heads (fields may differ).
bool can_delta(const LayerSignature& before, const std::vector<TierRecord>& now);

// Writes `now` (records of one layer) as field deltas against `before` (can_delta() holds).
// `typed` (format major 4): records by their typed table (TierRecordDelta.tier_type) and fields by
// their id in it (TierFieldDelta.field_id, formats/tier_schema.h) instead of by kind and name;
// a kind or field the registry lacks throws KVSDK_E_INTERNAL.
std::vector<flatbuffers::Offset<fb::TierRecordDelta>> build_layer_delta(
    flatbuffers::FlatBufferBuilder& fbb, const LayerSignature& before,
    const std::vector<TierRecord>& now, bool typed);

// Rebuilds one record from its delta and the record before it. Throws KVSDK_E_CORRUPT when the
// delta does not fit `before` (other kind or head, segments beyond a field, elements left over)
// and, `typed`, when it names an unknown table or field id, or rebuilds a record its typed table
// could not hold (check_typed_record).
TierRecord apply_record_delta(const fb::TierRecordDelta& delta, const TierRecord& before,
                              bool typed);

}  // namespace kvsdk::format
