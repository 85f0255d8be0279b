// Reads and validates a snapshot from memory: container records, FlatBuffers (Verifier with
// limits), sizes against the geometry, every checksum, then the journal. Nothing is trusted
// before it is checked; every failure is a kvsdk::Error with a precise status and message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/store_view.h"
#include "frame_writer.h"

namespace kvsdk {
class ThreadPool;
}

namespace kvsdk::format {

struct ReadOptions {
  const Geometry* expected = nullptr;  // KVSDK_E_GEOMETRY when the file's differs
  // Bytes the destination context has free: a snapshot whose declared size exceeds it fails with
  // KVSDK_E_BUDGET before its rows are decoded (the exact charge happens at Cache::restore).
  uint64_t available_bytes = UINT64_MAX;
  // Check that the policy is implemented by this build (loading into a cache); tools that only
  // inspect a file turn it off.
  bool require_implemented = true;
  // Where frames are hash-checked, decompressed and verified (the destination context's pool;
  // nullptr: the calling thread alone). The result and every error are the same for any pool.
  ThreadPool* pool = nullptr;
};

struct Snapshot {
  uint16_t format_major = 0, format_minor = 0;
  uint64_t snapshot_id = 0;
  Geometry geometry;
  kvsdk_policy policy{};
  uint64_t budget_bytes = 0;        // the writer's context budget
  bool includes_backing = false;
  std::string writer_version;
  std::vector<LayerState> layers;   // after the journal
  // Compressed-store records per layer (format major 2), for Cache::restore, and the rows each
  // KV head declares (to check the restored representation against).
  std::vector<std::vector<TierRecord>> tiers;
  std::vector<std::vector<uint64_t>> declared_rows;
  std::shared_ptr<StoreLayout> layout;  // which store holds each layer (the policy's)
  std::vector<bool> covered;        // layers the policy's representation holds
  PolicyRuntime runtime;            // allocation-stage state of the policy, after the journal
  uint64_t base_end = 0;            // offset just past the trailer
  uint64_t journal_end = 0;         // offset past the last complete delta
  uint64_t next_sequence = 1;
  // Format 5: the cache continues a shared prefix of this content hash (snapshot_writer.h,
  // content_hash), whose whole snapshot file the save may have embedded (empty: referenced only).
  bool has_prefix = false;
  uint64_t prefix_hash = 0;
  std::vector<uint8_t> prefix_snapshot;
  uint32_t journal_frames_applied = 0;
  uint32_t journal_frames_dropped = 0;
  std::vector<FrameRecord> frames;  // every frame of the full snapshot, index included
  std::vector<FrameRecord> journal_frames;  // applied journal frames
};

Snapshot read_snapshot(const unsigned char* data, size_t size, const ReadOptions& options);

}  // namespace kvsdk::format
