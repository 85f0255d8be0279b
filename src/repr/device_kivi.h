// The 'kivi' policy in a device backend's memory (ops().device_memory: CUDA): per layer and KV
// head the buffers of a KiviHeadStore (KIVI, docs/papers.md; backends/cpu/kivi_store.h's layout
// and rules), in the context's device arena, attended there by the backend's attend_kivi_tier
// (the split-K decode kernel dequantizing the codes as it loads them, the exact residual window
// in the same softmax). The host never dereferences them.
//
// What runs where, and why the bits are the CPU store's:
//  - Appends are rounded to f16 on the host (as KiviHeadStore::append does) and copied in. A
//    flush (the residual reaching R + G rows) quantizes its G oldest rows: on the device when
//    they all sit in the residual window there (every flush of the decode path: the table's
//    f16_to_f32 and kivi_quantize_* kernels, which give the CPU's bits), else on the host with
//    the CPU's own kivi_quantize_keys / kivi_quantize_values (a prefill chunk's flushes take
//    appended rows, which are on the host; the residual rows among them are copied out first).
//    Then the rows that stay move down on the device. So a device cache holds exactly the CPU
//    cache's bytes, and snapshots of either load into the other.
//  - Reads and snapshots copy a head out into a host KiviHeadStore (cpu::kivi_store_from_tier)
//    and use its code: read_rows, the "kivi.head" records.
//
// The heads of a layer always hold the same tokens (no eviction: every append and truncation
// applies to all of them), so counts and positions are kept per layer on the host.
//
// Arena layout (the cache's region of the context's arena, core/arena_regions.h): per layer, a
// quantized capacity (tokens, a multiple of G) and a residual capacity (rows, at most R + G - 1);
// for each (layer, head) in order the slices of kParts below, each rounded up to 16 bytes (the
// kernels read rows with vector loads). A layer that outgrows a capacity grows it by half; when
// that does not fit, every layer is re-planned to what it holds, which always fits when the
// budget admits the bytes. Re-planning moves the live bytes in place (cuda::plan_repartition).
//
// Device memory outside the arena (like attention's): the f32 rows of one block a device flush
// quantizes (2 x G x head_dim floats), and attention's queries and output.
//
// Not on the device yet: eviction on top of KIVI (the "+kivi" overlays: ragged key blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/representation.h"
#include "device_arena_plan.h"
#include "repr/device_queries.h"
#include "kivi_store.h"

namespace kvsdk {

class DeviceKivi final : public Representation, private ArenaOwner {
 public:
  // Every layer of a 'kivi' cache on `ctx` (a device backend). Throws KVSDK_E_UNSUPPORTED for a
  // head_dim the device kernels do not have (64, 128, 256), KVSDK_E_INVALID_ARG for a bad KIVI
  // configuration (as the host store).
  DeviceKivi(const Geometry& geometry, const kvsdk_policy& policy, Context& ctx);
  ~DeviceKivi() override;

  bool covers(uint32_t) const override { return true; }
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t) const override {
    return positions_[layer].size();
  }
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;

  // The KIVI store's rule (KiviHeadStore::can_remove_from), and only the newest rows (a suffix:
  // the residual rows move on the device only as a whole).
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;

  uint64_t layer_token_bytes(uint64_t extra_per_row) const override;
  uint64_t layer_token_capacity(uint64_t bytes, uint64_t extra_per_row) const override;
  bool token_bytes_estimated() const override { return true; }
  uint64_t device_reserved_bytes() const override { return layout_.reserved; }

 private:
  enum Part : size_t {
    kKeyCodes, kValueCodes, kKeyScales, kKeyZeros, kValueScales, kValueZeros, kQuantPositions,
    kResidualKeys, kResidualValues, kResidualPositions, kParts
  };
  struct Capacity {
    uint64_t quantized = 0;  // tokens, a multiple of G
    uint64_t residual = 0;   // rows
    bool operator==(const Capacity& o) const {
      return quantized == o.quantized && residual == o.residual;
    }
  };
  // Bytes of one part of one head for `tokens` quantized tokens / `rows` residual rows.
  uint64_t part_bytes(Part part, uint64_t tokens, uint64_t rows) const;
  cuda::ArenaPartition layout_for(const std::vector<Capacity>& capacity) const;
  std::vector<uint64_t> used_bytes() const;
  size_t quantized(uint32_t layer) const { return quantized_[layer]; }
  size_t residual(uint32_t layer) const { return positions_[layer].size() - quantized_[layer]; }
  char* slice(uint32_t layer, uint32_t head, Part part) const;
  // Makes every head of `layer` able to hold `tokens` quantized tokens and `rows` residual rows;
  // may re-plan the arena (the contents stay). Throws KVSDK_E_BUDGET (nothing changed) when the
  // arena cannot hold them, KVSDK_E_BACKEND when the device fails.
  void reserve(uint32_t layer, uint64_t tokens, uint64_t rows);
  void relayout(const std::vector<Capacity>& capacity);
  std::vector<Capacity> tight_capacity() const;
  void check_usable() const;
  // The host copy of one head (reads, snapshots).
  cpu::KiviHeadStore stage_head(uint32_t layer, uint32_t kv_head) const;
  // Writes the rows of `store` (one head, nothing in the device slices yet) into the arena.
  void upload_head(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& store);

  // ArenaOwner: tight capacities for every layer.
  uint64_t shrink_to_fit() override;
  char* base() const { return regions_.base(this); }

  Context& ctx_;
  const backend::Ops& device_;
  ArenaRegions& regions_;
  mutable DeviceQueries queries_;  // attention's queries and output on the device
  DeviceScratch flush_;            // the f32 rows of a block a device flush quantizes
  cpu::KiviConfig config_;
  size_t row_bytes_;    // packed code bytes per token
  size_t groups_;       // value groups per token
  cuda::ArenaPartition layout_;
  std::vector<Capacity> capacity_;                // [layer]
  std::vector<std::vector<int32_t>> positions_;   // [layer]: quantized tokens, then the residual
  std::vector<size_t> quantized_;                 // [layer] quantized tokens of every head
  bool failed_ = false;  // a device copy failed after the store's rows began to change
  // Host staging of appends, reused: f16 rows of one head (the residual rows a flush takes,
  // then the appended rows), f32 rows of one block being quantized, its codes and scales.
  std::vector<uint16_t> stage_k_, stage_v_;
  std::vector<int32_t> stage_positions_;  // the residual's positions, then the appended ones
  std::vector<float> block_k_, block_v_;
  std::vector<uint8_t> codes_k_, codes_v_;
  std::vector<uint16_t> k_scale_, k_zero_, v_scale_, v_zero_;
};

}  // namespace kvsdk
