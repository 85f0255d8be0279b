// The exact tier in a device backend's memory (ops().device_memory: CUDA): per layer and KV head
// the f16 keys, values and positions of ExactRows, but in the context's device arena, attended
// there by the backend's attend_f16. The host never dereferences them: appends are converted on
// the host (the same rounding as ExactRows, so both hold the same bits) and copied in; reads,
// snapshots and the attention output are copied out.
//
// Arena layout (the cache's region of the context's arena, core/arena_regions.h): each layer has
// a capacity in rows per head; the k and v slices of every (layer, head) come first, then the
// positions of every (layer, head), packed without padding (head_dim 64/128/256 keep every k/v
// slice a multiple of 16 bytes, so rows stay aligned for vector loads). A layer that outgrows its
// capacity grows by half (as host stores do); when that does not fit, every layer is re-planned
// to what it holds and the growing layer to what it needs, which always fits when the budget
// admits the rows. Re-planning moves the live bytes in place (cuda::plan_repartition), so the
// arena never needs more than the budget.
//
// Eviction (the selection stage of the eviction presets, as for ExactRows): the cache scores on
// the host, reading keys through load_keys() (copied out of the arena for each selection pass,
// which evict_slack makes rare), and the kept rows are compacted in place on the device, run by
// run in order (a run moves to lower offsets in chunks no longer than its shift, so no copy
// overlaps itself).
//
// Positions are mirrored on the host (4 bytes a row): they are the per-head row counts, and the
// core's bookkeeping (selection, truncation, snapshots' row tables) reads them without a device
// round trip.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "core/context.h"
#include "core/representation.h"
#include "repr/device_queries.h"
#include "repr/keep_plan.h"
#include "device_arena_plan.h"

namespace kvsdk {

class DeviceRows final : public Representation, private ArenaOwner {
 public:
  // The store of every layer of a cache on `ctx` (a device backend), in a region of the
  // context's arena (core/arena_regions.h) while it lives. Throws KVSDK_E_UNSUPPORTED (naming
  // what does run) for a policy whose method has no device path yet (method traits' on_device)
  // or a head_dim the device kernels do not have (64, 128, 256).
  DeviceRows(const Geometry& geometry, const kvsdk_policy& policy, Context& ctx);
  ~DeviceRows() override;

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void append_host(uint32_t layer, size_t n_tokens, const void* k, const void* v,
                   const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  // One upload of every head's queries, the heads' kernels enqueued back to back, one download.
  void attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override {
    return positions_[layer][kv_head].size();
  }
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  void read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                 int32_t* positions) const override;

  // Row selection (the eviction presets), as ExactRows: see the interface.
  bool selects_rows() const override { return true; }
  const int32_t* row_positions(uint32_t layer, uint32_t kv_head) const override {
    return positions_[layer][kv_head].data();
  }
  void load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                 float* dst) const override;
  // The selection's scores on the device (the backend's column_sums_rows, the CPU's bits): the
  // query rows, the incoming rows' keys and positions go in, n_keys floats come out; the head's
  // keys stay in the arena.
  bool column_sums_here(uint32_t layer, uint32_t kv_head, const backend::QueryRows& q,
                        const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                        float* col_sums) const override;
  uint64_t plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                     const IncomingRows* incoming) override;
  // A device failure half-way (the driver's error) cannot be reported from here: the store then
  // refuses every later call with KVSDK_E_BACKEND.
  void commit_keep() noexcept override;
  void drop_keep() noexcept override;
  // Each layer's capacity becomes its cap (at least what it holds) when the whole plan fits the
  // arena: the arena is partitioned by the allocation, moving the live rows.
  void follow_allocation(const std::vector<uint64_t>& caps) noexcept override;
  uint64_t layer_token_bytes(uint64_t extra_per_row) const override;
  uint64_t layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const override;

  // Snapshots write exact rows as typed row tables: a host copy of the head, staged on its first
  // request (thread-safe: the snapshot code asks from the context's pool) and kept until
  // release_host_staging() or a change of the store, so a save holds at most one host copy of
  // the rows while it runs.
  const ExactStore* exact_rows(uint32_t layer, uint32_t kv_head) const override;
  bool device_rows(uint32_t layer, uint32_t kv_head, backend::F16Rows& rows,
                   const int32_t*& host_positions) const override;
  void release_host_staging() const noexcept override;
  void restore_exact(uint32_t layer, std::vector<ExactStore> heads) override;
  std::vector<TierRecord> save(uint32_t) const override { return {}; }
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  // Truncation removes the newest rows only (a suffix of every head, which is what appends in
  // position order give); anything else is refused.
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;

  // The arena as this store uses it: the bytes the layers' capacities cover.
  uint64_t device_reserved_bytes() const override { return layout_.reserved; }

 private:
  // attend() of heads [first_head, first_head + n_heads): q_rows and out [n_heads][n_rows][dim].
  void attend_range(uint32_t layer, uint32_t first_head, uint32_t n_heads, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const;
  enum Part : size_t { kKeys = 0, kValues = 1, kPositions = 2, kParts = 3 };
  cuda::ArenaPartition layout_for(const std::vector<uint64_t>& capacity) const;
  std::vector<uint64_t> used_bytes() const;
  uint64_t layer_rows(uint32_t layer) const;  // the most rows any head of the layer holds
  // Makes every head of `layer` able to hold `rows` rows; may re-plan the arena (the contents
  // stay). Throws KVSDK_E_BUDGET (nothing changed) when the arena cannot hold them,
  // KVSDK_E_BACKEND when the device fails.
  void reserve_rows(uint32_t layer, uint64_t rows);
  void relayout(const std::vector<uint64_t>& capacity);
  char* slice(uint32_t layer, uint32_t head, Part part) const;
  backend::F16Rows head_rows(uint32_t layer, uint32_t kv_head) const;  // (backend memory)
  // Converts row `t` of one head from k, v [n][n_kv_heads][head_dim] of `dtype` into f16 at
  // row `slot` of the host staging.
  void stage_row(kvsdk_dtype dtype, const void* k, const void* v, size_t t, uint32_t head,
                 size_t slot) const;
  void append_rows(uint32_t layer, size_t n, kvsdk_dtype dtype, const void* k, const void* v,
                   const int32_t* positions);
  // Moves `rows` rows of every part of one head from row `from` down to row `to` (to < from).
  void move_rows_down(uint32_t layer, uint32_t head, size_t to, size_t from, size_t rows);
  // Compacts one planned layer's kept rows and appends its kept incoming rows.
  void commit_layer(uint32_t layer);
  void check_usable() const;
  // Copies one head's rows to the host.
  void stage_head(uint32_t layer, uint32_t kv_head, ExactStore& into) const;

  // ArenaOwner: tight capacities for every layer (planned evictions included).
  uint64_t shrink_to_fit() override;
  std::vector<uint64_t> tight_capacity() const;
  char* base() const { return regions_.base(this); }

  Context& ctx_;
  const backend::Ops& device_;
  ArenaRegions& regions_;
  mutable DeviceQueries queries_;  // attention's queries and output on the device
  mutable DeviceScoring scoring_;  // column_sums_here()'s transfers
  cuda::ArenaPartition layout_;
  std::vector<uint64_t> capacity_;                            // [layer] rows per head
  std::vector<std::vector<std::vector<int32_t>>> positions_;  // [layer][head] host mirror
  // A layer's planned selection (plan_keep), its buffers reused from one plan to the next.
  struct Plan : KeepPlan {
    uint64_t rows_after = 0;  // the most rows a head keeps
  };
  std::vector<Plan> plans_;  // [layer]
  bool failed_ = false;      // a device copy failed inside commit_keep
  // Host staging of appends (reused) and of read() (reused), and exact_rows()'s staged heads
  // ([layer][head], present[] says which hold a copy).
  mutable std::vector<uint16_t> stage_k_, stage_v_;
  std::vector<backend::HostCopy> copies_;  // an append's transfers (to_backend_many)
  mutable ExactStore read_stage_;
  mutable std::mutex staged_lock_;
  mutable std::vector<std::vector<ExactStore>> staged_;
  mutable std::vector<std::vector<char>> present_;
  mutable std::atomic<bool> any_staged_{false};
};

}  // namespace kvsdk
