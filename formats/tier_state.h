// TierRecord (src/core/tier_record.h) <-> FlatBuffers TierState (kvsdk.fbs), shared by full
// snapshots and journal deltas, and the hash that tells a delta which layers' records changed.
#pragma once

#include <cstdint>
#include <vector>

#include "core/store_view.h"
#include "kvsdk_generated.h"

namespace kvsdk::format {

flatbuffers::Offset<fb::TierState> build_tier_state(flatbuffers::FlatBufferBuilder& fbb,
                                                    const TierRecord& record);
// Serialized size estimate, for packing records into frames.
uint64_t tier_record_bytes(const TierRecord& record);
// Copies a verified TierState; throws KVSDK_E_CORRUPT when it lacks its kind, fields or names.
// Layer/head ranges are checked by the caller, which knows the geometry and policy.
TierRecord read_tier_state(const fb::TierState& state);
// XXH64 of a layer's records (kind, heads, every field), for journal deltas.
uint64_t tier_records_hash(const std::vector<TierRecord>& records);

}  // namespace kvsdk::format
