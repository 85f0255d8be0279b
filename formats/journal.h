// Journal deltas (kvsdk_cache_save_delta): everything about what a delta holds, how it is built
// from a cache and how a reader applies it, in one place.
//
// A delta must stay exact whatever happened since the last save: tokens appended, and also rows
// removed from the middle of a head by eviction (and, later, rows rewritten by other tiers). The
// writer therefore does not trust any change tracking in the cache. At every save/load it keeps a
// 64-bit fingerprint of each stored row (XXH64, or XXH3-64 for a format 6 file, of position, key
// and value); a delta compares the current rows with those fingerprints and describes each changed
// head as segments in its new row order: "copy rows [b, b+n) of the previous state" or "take the
// next n new rows", plus the new rows themselves. Appending is one copy segment and one new
// segment; eviction is a few copy segments; anything else degrades gracefully to new rows (at worst
// a head rewrite).
// The cost: 8 bytes of host memory per stored row between saves, and one hash pass over the
// cache per delta (memory speed, far below the cost of compressing a full save; XXH3 for files of
// format 6). A full save also fingerprints in a pass of its own, before writing anything: the
// snapshot id, which seeds every record hash and opens the file, is derived from the fingerprints
// (snapshot_writer.h), so they cannot be taken while the rows are copied into frames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/store_view.h"
#include "policy_state.h"
#include "tier_delta.h"

namespace kvsdk {
class ThreadPool;
}

namespace kvsdk::fb {
struct JournalDelta;
}

namespace kvsdk::format {

// The state of the file a cache last saved or loaded, as kvsdk_cache_save_delta continues it.
struct JournalBase {
  uint64_t snapshot_id = 0;
  uint64_t base_end = 0;       // file offset just past the trailer
  uint64_t journal_end = 0;    // file offset past the last complete delta
  uint64_t next_sequence = 1;  // sequence number of the next delta
  // Fingerprints of every stored exact row at that point, [layer * n_kv_heads + head][row],
  // followed by n_layers entries [n_layers * n_kv_heads + layer] holding one hash of that layer's
  // compressed-store records (empty for exact layers).
  std::vector<std::vector<uint64_t>> rows;
  // Per layer, the signature of its compressed-store records (tier_delta.h; empty for exact
  // layers), and the file's format major: from 3 on, deltas describe changed records field by
  // field instead of whole.
  std::vector<LayerSignature> tiers;
  // Per layer, one fingerprint per observation-window query (policy_state.h).
  std::vector<std::vector<uint64_t>> windows;
  // H2O: the position and score of every row (policy_state.h), which deltas of format 3.1 give
  // the new scores as differences against: 8 bytes of host memory per row and KV head between
  // saves, for h2o caches only (empty otherwise).
  ScoreBase scores;
  uint16_t format_major = 1;
  uint16_t format_minor = 0;
};

// Segment.base_begin of a "new rows" segment.
constexpr uint64_t kNewRows = ~0ull;

// Matches `now` against `before` in order, as segments of `now` (copies of runs of `before`, new
// entries), appending the indices of new entries to `new_rows` (nullable): survivors of eviction
// keep their relative order, so each entry continues the previous match, jumps forward over
// removed entries, or is new.
std::vector<fb::Segment> match_in_order(const std::vector<uint64_t>& before,
                                        const std::vector<uint64_t>& now,
                                        std::vector<size_t>* new_rows);

// `xxh3`: XXH3-64 (the journal base of a format 6 file, xxhash64.h) instead of XXH64 (older
// files, and content_hash, which identifies a prefix across formats and must not change).
uint64_t row_fingerprint(int32_t position, const uint16_t* k, const uint16_t* v, size_t head_dim,
                         bool xxh3 = false);

// What a journal base remembers of a cache: fingerprints of every exact row and every layer's
// compressed stores (`rows`, as JournalBase::rows), and the signatures of those stores.
struct Fingerprints {
  std::vector<std::vector<uint64_t>> rows;
  std::vector<LayerSignature> tiers;
  std::vector<std::vector<uint64_t>> windows;
  ScoreBase scores;
};
// `xxh3`: row fingerprints as row_fingerprint(..., xxh3); a journal base of a file of format
// major M takes uses_xxh3(M).
// `pool`: where the rows are hashed, a KV head per task (nullptr: this thread); same result.
Fingerprints fingerprint(const StoreView& cache, bool xxh3 = false, ThreadPool* pool = nullptr);

// A delta ready to append: finished FlatBuffers (root Frame holding a JournalDelta), one per
// frame, and the fingerprints that become the base once the frames are safely written.
struct DeltaFrames {
  std::vector<std::vector<uint8_t>> parts;
  Fingerprints now;
};

// Builds delta number base.next_sequence; new rows are split so that no part holds more than
// `max_frame_bytes` of rows (at least one row per part).
DeltaFrames build_delta(const StoreView& cache, const JournalBase& base, uint64_t max_frame_bytes,
                        ThreadPool* pool = nullptr);

// Applies the verified parts of one complete delta (in part order) to `layers` (n_layers of
// geometry). Throws KVSDK_E_CORRUPT, leaving `layers` unspecified, when the delta does not fit
// them. The caller then discards `layers`.
// `tiers` (per layer) holds the compressed-store records before the delta and receives them
// after it (replaced whole, or rebuilt from field deltas, which only a file of `format_major` 3
// or later may hold); the caller checks their layers and heads against the policy.
void apply_delta(const Geometry& geometry, const std::vector<const fb::JournalDelta*>& parts,
                 uint16_t format_major, std::vector<LayerState>& layers,
                 std::vector<std::vector<TierRecord>>& tiers);

}  // namespace kvsdk::format
