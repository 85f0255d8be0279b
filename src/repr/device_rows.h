// The exact tier in a device backend's memory (ops().device_memory: CUDA): per layer and KV head
// the f16 keys, values and positions of ExactRows, but in the context's device arena, attended
// there by the backend's attend_f16. The host never dereferences them: appends are converted on
// the host (the same rounding as ExactRows, so both hold the same bits) and copied in; reads,
// snapshots and the attention output are copied out.
//
// Arena layout (one allocation of exactly the context budget, core/context.h): each layer has a
// capacity in tokens; the k and v slices of every (layer, head) come first, then the positions of
// every (layer, head), packed without padding (head_dim 64/128/256 keep every k/v slice a
// multiple of 16 bytes, so rows stay aligned for vector loads). A layer that outgrows its
// capacity grows by half (as host stores do); when that does not fit, every layer is re-planned
// to what it holds and the growing layer to what it needs, which always fits when the budget
// admits the rows. Re-planning moves the live bytes in place (cuda::plan_repartition), so the
// arena never needs more than the budget.
//
// Positions are mirrored on the host (4 bytes a row) for the core's bookkeeping (truncation,
// snapshots' row tables) without a device round trip.
#pragma once

#include <mutex>
#include <vector>

#include "core/context.h"
#include "core/representation.h"
#include "device_arena_plan.h"

namespace kvsdk {

class DeviceRows final : public Representation {
 public:
  // The store of every layer of a cache on `ctx` (a device backend), which it holds the arena
  // of while it lives. Throws KVSDK_E_UNSUPPORTED (naming what does run) for a policy whose
  // method has no device path yet (method traits' on_device) or a head_dim the device kernels do
  // not have (64, 128, 256), and while another cache holds the context's arena.
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
  size_t head_tokens(uint32_t layer, uint32_t) const override { return tokens_[layer]; }
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  void read_host(uint32_t layer, uint32_t kv_head, void* k, void* v,
                 int32_t* positions) const override;
  const int32_t* row_positions(uint32_t layer, uint32_t kv_head) const override {
    return positions_[layer][kv_head].data();
  }

  // Snapshots write exact rows as typed row tables: a host copy of the head, staged on its first
  // request (thread-safe: the snapshot code asks from the context's pool) and kept until
  // release_host_staging() or a change of the store, so a save holds at most one host copy of
  // the rows while it runs.
  const ExactStore* exact_rows(uint32_t layer, uint32_t kv_head) const override;
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
  enum Part : size_t { kKeys = 0, kValues = 1, kPositions = 2, kParts = 3 };
  cuda::ArenaPartition layout_for(const std::vector<uint64_t>& capacity) const;
  std::vector<uint64_t> used_bytes() const;
  // Makes `layer` hold `rows` rows; may re-plan the arena. Throws KVSDK_E_BUDGET (nothing
  // changed) when the arena cannot hold them, KVSDK_E_BACKEND when the device fails.
  void reserve_rows(uint32_t layer, uint64_t rows);
  void relayout(const std::vector<uint64_t>& capacity);
  char* slice(uint32_t layer, uint32_t head, Part part) const;
  // Appends rows converted to f16 on the host (staging reused: no allocation once grown).
  void append_rows(uint32_t layer, size_t n, kvsdk_dtype dtype, const void* k, const void* v,
                   const int32_t* positions);

  Context& ctx_;
  const backend::Ops& device_;
  char* const arena_;
  const uint64_t arena_bytes_;
  cuda::ArenaPartition layout_;
  std::vector<uint64_t> capacity_;                   // [layer] rows per head
  std::vector<uint64_t> tokens_;                     // [layer] rows per head
  std::vector<std::vector<std::vector<int32_t>>> positions_;  // [layer][head] host mirror
  // Copies one head's rows to the host.
  void stage_head(uint32_t layer, uint32_t kv_head, ExactStore& into) const;
  // Host staging of appends (reused) and of read() (reused), and exact_rows()'s staged heads
  // ([layer][head], present[] says which hold a copy).
  mutable std::vector<uint16_t> stage_k_, stage_v_;
  mutable ExactStore read_stage_;
  mutable std::mutex staged_lock_;
  mutable std::vector<std::vector<ExactStore>> staged_;
  mutable std::vector<std::vector<char>> present_;
  // Device scratch of attention: queries, their positions and the output, grown and reused.
  struct DeviceScratch {
    const backend::Ops* ops = nullptr;
    void* buffer = nullptr;
    size_t bytes = 0;
    ~DeviceScratch() {
      if (buffer) ops->free(buffer);
    }
  };
  mutable DeviceScratch scratch_;
};

}  // namespace kvsdk
