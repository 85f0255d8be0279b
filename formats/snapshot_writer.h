// Writes a full snapshot of a cache (container.h layout, kvsdk.fbs payloads) to a sink.
#pragma once

#include <cstdint>
#include <vector>

#include "core/store_view.h"
#include "sink.h"
#include "zstd_frame.h"

namespace kvsdk {
class ThreadPool;
}

namespace kvsdk::format {

struct SaveParams {
  int zstd_level = kDefaultZstdLevel;
  bool include_backing = false;
  uint64_t max_frame_bytes = 8ull << 20;
  uint32_t max_journal_percent = 0;  // save_delta compacts past this share of the base; 0: never
  bool embed_prefix = false;         // a conversation's snapshot embeds its shared prefix
};

// Validates a caller's kvsdk_save_options (NULL = defaults); throws KVSDK_E_INVALID_ARG.
SaveParams save_params_from_c(const kvsdk_save_options* options);
kvsdk_save_options save_options_defaults();

// Writes header, metadata, tier chunks, index and trailer. Returns the bytes written. Frames are
// built and compressed on `pool` (the cache's context's; nullptr: this thread alone), the bytes
// are the same for any pool (frame_writer.h). `cache` must not change until this returns.
uint64_t write_snapshot(const StoreView& cache, const SaveParams& params, uint64_t snapshot_id,
                        Sink& sink, ThreadPool* pool);

// The snapshot id of the cache's current state (never 0): a hash of everything a snapshot holds
// (geometry, policy and its state, every row through its fingerprint `rows`, from
// fingerprint_rows). Deterministic, so that equal caches give byte-identical snapshots (bindings
// in different languages are compared byte for byte), while a journal delta still only continues
// a file whose base holds exactly the state it was computed from.
// The format major a full save writes: 3 for caches whose later deltas may use format-3
// encodings (compressed stores field by field, sliding observation windows), so that older
// readers refuse them; 1 otherwise, which readers that know only major 1 keep loading.
// 6 (container.h) for every cache that holds exact rows, which may go into shuffled frames.
uint16_t format_major_for(const StoreView& cache, bool any_tier);
// Whether the cache holds exact rows (then format_major_for gives 6, whose journal base takes
// XXH3 row fingerprints: fingerprint(cache, has_exact_rows(cache))).
bool has_exact_rows(const StoreView& cache);
// The minor version a file of that major is written with.
uint16_t format_minor_for(uint16_t major);

uint64_t snapshot_id_of(const StoreView& cache, const std::vector<std::vector<uint64_t>>& rows);
// The content hash a conversation's snapshot references its shared prefix by: the snapshot id of
// the prefix's state.
uint64_t content_hash(const StoreView& cache);

}  // namespace kvsdk::format
