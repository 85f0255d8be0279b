// The 'kivi' policy, and the '+kiviN' overlays of the eviction presets, in a device backend's
// memory (ops().device_memory: CUDA): per layer and KV head the buffers of a KiviHeadStore (KIVI,
// docs/papers.md; backends/cpu/kivi_store.h's layout and rules), in the context's device arena,
// attended there by the backend's attend_kivi_tier (the split-K decode kernel dequantizing the
// codes as it loads them, the exact residual window in the same softmax). The host never
// dereferences them.
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
//  - Reads and snapshots copy a head out into a host KiviHeadStore and use its code: read_rows,
//    the "kivi.head" records.
//
// Eviction on top of KIVI (the '+kiviN' overlays of the eviction presets: snapkv+kivi2, ...): as
// KiviRepresentation, the selection stage scores keys read through load_keys (a head's store
// copied out once per selection pass) and plan_keep builds the kept stores on the host with the
// CPU store's own retain() and append(), which commit_keep writes back whole. So the heads of a
// layer may hold different tokens, and key blocks may be ragged (fewer than G tokens): a ragged
// head keeps the start of each key block in the arena too (4 bytes a block, what the CPU store
// counts for its block sizes), which the decode kernel searches.
//
// Arena layout (the cache's region of the context's arena, core/arena_regions.h): per (layer,
// head) capacities (quantized tokens, residual rows, key blocks, block starts), the slices of
// kParts laid out by alignment (every head's f16 rows and key scales, multiples of 16 bytes read
// with vector loads, then the 4-, 2- and 1-byte parts), so no slice needs padding and a tight
// layout is exactly the bytes the CPU store counts (the budget's). A head that outgrows a
// capacity grows it by half; when that does not fit, every head is re-planned to what it holds,
// which fits when the budget admits the bytes. Re-planning moves the live bytes in place
// (cuda::plan_repartition). Where an append's flush would need the old and the new residual
// window at once and the arena has no room for both, the windows go through the host; an
// eviction's commit re-lays the arena to the kept shapes and writes the kept heads whole.
//
// Device memory outside the arena (like attention's): the f32 rows of one block a device flush
// quantizes (2 x G x head_dim floats), and attention's queries and output.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/representation.h"
#include "device_arena_plan.h"
#include "repr/device_queries.h"
#include "repr/kivi_repr.h"
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
  // One upload of every head's queries, the heads' kernels enqueued back to back, one download.
  void attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override {
    return heads_[layer][kv_head].positions.size();
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

  // Eviction ('+kiviN' overlays only: selects_rows() is false for policy kivi).
  bool selects_rows() const override { return overlay_; }
  const int32_t* row_positions(uint32_t layer, uint32_t kv_head) const override {
    return heads_[layer][kv_head].positions.data();
  }
  void load_keys(uint32_t layer, uint32_t kv_head, size_t first, size_t count,
                 float* dst) const override;
  // The selection's scores on the device over the head's keys as attention dequantizes them
  // (the backend's column_sums_rows, the CPU's bits): an h2o observe or a selection pass copies
  // no key out (load_keys stays for the CPU's plan of the kept rows).
  bool column_sums_here(uint32_t layer, uint32_t kv_head, const backend::QueryRows& q,
                        const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                        float* col_sums) const override;
  uint64_t plan_keep(uint32_t layer, const std::vector<std::vector<uint32_t>>& keep,
                     const IncomingRows* incoming) override;
  void commit_keep() noexcept override;
  void drop_keep() noexcept override;

  // --- For a store built on this one (DeviceSpeCache: SpeCache's low-bit copy) ----------------
  // One head's quantized tier and exact residual rows in the arena, as the kernels read them:
  // device pointers, valid until the store next changes (an append, restore, truncation or
  // another cache's growth, which may move the region). Call under a Context::DeviceScope.
  struct DeviceView {
    backend::KiviTier tier;
    backend::F16Rows residual;
  };
  DeviceView device_view(uint32_t layer, uint32_t kv_head) const;
  // The host copy of one head (reads, snapshots, eviction plans). Throws KVSDK_E_BACKEND when
  // the device fails or the store has failed.
  cpu::KiviHeadStore stage_head(uint32_t layer, uint32_t kv_head) const;
  // restore() from stores already parsed and validated (one per KV head, for an empty layer).
  void restore_heads(uint32_t layer, const std::vector<cpu::KiviHeadStore>& heads);
  size_t quantized_tokens(uint32_t layer, uint32_t kv_head) const {
    return heads_[layer][kv_head].quantized;
  }
  // Throws KVSDK_E_BACKEND when a device failure lost rows (every call refuses from then on).
  void check_usable() const;

 private:
  // attend() of heads [first_head, first_head + n_heads): q_rows and out [n_heads][n_rows][dim].
  void attend_range(uint32_t layer, uint32_t first_head, uint32_t n_heads, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const;
  enum Part : size_t {
    kKeyCodes, kValueCodes, kKeyScales, kKeyZeros, kValueScales, kValueZeros, kQuantPositions,
    kBlockStarts, kResidualKeys, kResidualValues, kResidualPositions, kParts
  };
  // What one head holds (the host's mirror of its shape; the bytes are in the arena).
  struct Head {
    std::vector<int32_t> positions;     // quantized tokens, then the residual rows
    size_t quantized = 0;               // quantized tokens
    std::vector<uint32_t> block_tokens;  // tokens of each key block once ragged, else empty
    size_t residual() const { return positions.size() - quantized; }
    bool ragged() const { return !block_tokens.empty(); }
    size_t blocks(size_t group) const { return ragged() ? block_tokens.size() : quantized / group; }
  };
  // Capacities of one head's slices.
  struct Capacity {
    uint64_t quantized = 0;  // tokens
    uint64_t residual = 0;   // rows
    uint64_t blocks = 0;     // key blocks (rows of key scales and zeros)
    uint64_t starts = 0;     // block starts (0 unless ragged)
    bool covers(const Capacity& o) const {
      return quantized >= o.quantized && residual >= o.residual && blocks >= o.blocks &&
             starts >= o.starts;
    }
    Capacity max(const Capacity& o) const {
      return {std::max(quantized, o.quantized), std::max(residual, o.residual),
              std::max(blocks, o.blocks), std::max(starts, o.starts)};
    }
    bool operator==(const Capacity& o) const { return covers(o) && o.covers(*this); }
  };
  Capacity shape_of(const Head& h) const;
  Capacity shape_of(const cpu::KiviHeadStore& s) const;
  // Bytes of one part of a head of shape `c`.
  uint64_t part_bytes(Part part, const Capacity& c) const;
  cuda::ArenaPartition layout_for(const std::vector<Capacity>& capacity) const;
  // Bytes each slice holds now (`except_planned`: 0 in layers whose plan replaces them;
  // `residual_of`: 0 in that layer's residual windows, copied out by append()).
  std::vector<uint64_t> used_bytes(bool except_planned = false, int64_t residual_of = -1) const;
  size_t index(uint32_t layer, uint32_t head) const {
    return size_t(layer) * geometry_.n_kv_heads + head;
  }
  char* slice(uint32_t layer, uint32_t head, Part part) const;
  // Makes the heads of `layer` able to hold `need` [head] each; may re-plan the arena (the
  // contents stay). Throws KVSDK_E_BUDGET (nothing changed) when the arena cannot hold them,
  // KVSDK_E_BACKEND when the device fails.
  void reserve(uint32_t layer, const std::vector<Capacity>& need);
  void relayout(const std::vector<Capacity>& capacity, bool except_planned = false,
                int64_t residual_of = -1);
  // What every head holds.
  std::vector<Capacity> tight_capacity() const;
  // `capacity` with the planned layers' heads at their plans; the reserved bytes of that layout
  // (0 without a plan).
  std::vector<Capacity> with_plans(std::vector<Capacity> capacity) const;
  uint64_t bytes_after_plans() const;
  void changed() { ++version_; }  // invalidates the staged copy of load_keys
  // Writes the buffers of `store` into the head's slices (which must hold them).
  void upload_head(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& store);
  // Sets the head's mirror to `store`'s shape (no allocation where plan_keep reserved).
  void mirror_head(uint32_t layer, uint32_t kv_head, const cpu::KiviHeadStore& store);
  // One head's part of append() (staging in sk, sv; `residual_staged`: its residual window was
  // copied there and its slices re-laid empty). Without a flush its transfers join batch_,
  // which append() sends once every head is done.
  void append_head(uint32_t layer, uint32_t kv_head, size_t n, const float* k, const float* v,
                   const int32_t* positions, uint16_t* sk, uint16_t* sv, bool residual_staged);

  // ArenaOwner: tight capacities for every head.
  uint64_t shrink_to_fit() override;
  char* base() const { return regions_.base(this); }

  Context& ctx_;
  const backend::Ops& device_;
  ArenaRegions& regions_;
  mutable DeviceQueries queries_;  // attention's queries and output on the device
  mutable DeviceScoring scoring_;  // column_sums_here()'s transfers
  DeviceScratch flush_;            // the f32 rows of a block a device flush quantizes
  cpu::KiviConfig config_;
  bool overlay_;        // an eviction preset's '+kiviN' overlay
  size_t row_bytes_;    // packed code bytes per token
  size_t groups_;       // value groups per token
  cuda::ArenaPartition layout_;
  std::vector<Capacity> capacity_;        // [layer * heads + head]
  std::vector<std::vector<Head>> heads_;  // [layer][head]
  bool failed_ = false;  // a device copy failed after the store's rows began to change
  // Eviction plans: the kept stores per layer (host), their shapes, and which layers have one.
  std::vector<std::vector<cpu::KiviHeadStore>> planned_;
  std::vector<Capacity> planned_need_;  // [layer * heads + head], zero where nothing is planned
  std::vector<char> planned_active_;    // [layer]
  KiviKeepScratch keep_scratch_;  // one head's kept incoming rows
  // load_keys' copy of one head, valid while version_ has not moved.
  uint64_t version_ = 0;
  mutable std::unique_ptr<cpu::KiviHeadStore> keys_copy_;
  mutable uint32_t keys_layer_ = 0, keys_head_ = 0;
  mutable uint64_t keys_version_ = ~uint64_t(0);
  // Host staging of appends, reused: f16 rows of one head (the residual rows a flush takes,
  // then the appended rows), f32 rows of one block being quantized, its codes and scales.
  std::vector<uint16_t> stage_k_, stage_v_;  // [head][per-head rows][dim] (append)
  std::vector<backend::HostCopy> batch_;      // append()'s transfers of the heads' new rows
  std::vector<int32_t> stage_positions_;  // the residual's positions, then the appended ones
  std::vector<uint32_t> stage_starts_;     // block starts of a ragged head's new blocks
  std::vector<Capacity> need_;             // append(): what each head of the layer needs
  std::vector<float> block_k_, block_v_;
  std::vector<uint8_t> codes_k_, codes_v_;
  std::vector<uint16_t> k_scale_, k_zero_, v_scale_, v_zero_;
};

}  // namespace kvsdk
