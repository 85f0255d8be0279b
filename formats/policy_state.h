// Snapshot support for the eviction policies (src/policy): H2O accumulated scores per row, the
// observation windows of SnapKV/PyramidKV/XKV, and the cache-level allocation state (per-cache
// budget, fixed allocation, profile shares, last allocation). Written into the metadata of a
// full snapshot and into the last part of every journal delta, so resume is bit-identical.
#pragma once

#include <cstdint>
#include <vector>

#include "core/store_view.h"
#include "kvsdk_generated.h"

namespace kvsdk::format {

// H2O scores as a journal writer remembers them between saves: per layer (empty for a layer
// without scores) and KV head, the position and the score of every row, in row order.
struct HeadScoreBase {
  std::vector<int32_t> positions;
  std::vector<float> scores;
};
using ScoreBase = std::vector<std::vector<HeadScoreBase>>;

// The scores of `cache` with the positions of their rows in the layer's row store (exact rows, or
// a KIVI overlay's "positions" field), as the snapshot reader counts them.
ScoreBase score_base(const StoreView& cache);

// With `before` (a journal delta of format major 3: window_fingerprints() of the state the delta
// continues), each observation window is written as the queries it shares with the window
// before it (window_reused) plus its new queries, instead of whole. With `scores_before` and
// `scores_now` (a delta of format 3.1: score_base() of the state the delta continues and of
// `cache`), H2O scores are written as differences against the scores of the same rows before
// (HeadScores.score_base / score_diffs), instead of whole.
flatbuffers::Offset<fb::PolicyState> build_policy_state(
    flatbuffers::FlatBufferBuilder& fbb, const StoreView& cache,
    const std::vector<std::vector<uint64_t>>* before = nullptr,
    const ScoreBase* scores_before = nullptr, const ScoreBase* scores_now = nullptr);

// One fingerprint per observation-window query (position and values), per layer.
std::vector<std::vector<uint64_t>> window_fingerprints(const StoreView& cache);

// Validates `state` (nullable: no state saved) against the geometry, the policy and the row
// count of every head (`rows[l][h]`), then fills the per-layer policy state of `layers` and
// `runtime`; a window that reuses queries (window_reused) continues the window `layers` holds,
// and scores given as differences (allowed only with `score_diffs`: the journal deltas of a
// format 3.1 or later file) continue the scores `layers` holds.
// Throws KVSDK_E_CORRUPT on anything inconsistent.
void read_policy_state(const fb::PolicyState* state, const Geometry& g, const kvsdk_policy& p,
                       const std::vector<std::vector<uint64_t>>& rows,
                       std::vector<LayerState>& layers, PolicyRuntime& runtime,
                       bool score_diffs = false);

}  // namespace kvsdk::format
