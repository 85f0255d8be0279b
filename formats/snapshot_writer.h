// Writes a full snapshot of a cache (container.h layout, kvsdk.fbs payloads) to a sink.
#pragma once

#include <cstdint>

#include "core/cache.h"
#include "sink.h"

namespace kvsdk::format {

struct SaveParams {
  int zstd_level = 3;
  bool include_backing = false;
  uint64_t max_frame_bytes = 8ull << 20;
};

// Validates a caller's kvsdk_save_options (NULL = defaults); throws KVSDK_E_INVALID_ARG.
SaveParams save_params_from_c(const kvsdk_save_options* options);
kvsdk_save_options save_options_defaults();

// Writes header, metadata, tier chunks, index and trailer. Returns the bytes written.
uint64_t write_snapshot(const Cache& cache, const SaveParams& params, uint64_t snapshot_id,
                        Sink& sink);

// A fresh random snapshot id (never 0).
uint64_t new_snapshot_id();

}  // namespace kvsdk::format
