// The 'minicache' policy in a device backend's memory (ops().device_memory: CUDA). MiniCache
// (docs/papers.md) with its arrays in the context's device arena, per (layer pair, KV head): each
// tensor's (keys', values') slots (u32 per token), shared f16 directions and the two layers' f32
// magnitudes (per merged token), the two layers' retained f16 rows, and the positions; the rows
// of a pair's leading layer that wait for its partner are an exact slice (f16 rows and positions),
// as MiniCacheRepresentation (src/repr/minicache_repr.h) keeps them. Its rules, bytes and
// snapshot records are that store's: a device cache holds a CPU cache's bits and writes its
// snapshots. 'minicache+kivi4' (KIVI-quantized directions) has no device path yet: refused.
//
// What runs where:
//  - Appends: cpu::MergedLayerPair::append reads only the new rows and the retention threshold
//    (and whether it is set), so it runs on the host on a pair reset to that state and empty
//    (MergedLayerPair::reset: no host copy of the stored tokens); what it appended goes up, its
//    slots offset by the device's merged and retained counts. The leading layer's pending rows
//    that the partner's append merges are copied out first (one decode token a head per step).
//  - Attention: the backend's attend_minicache_tier (the split-K kernel restoring each row in
//    registers as the CPU's reconstruct does), with the pending rows in the same softmax.
//  - Reads and snapshots copy a head out into a cpu::MiniCacheHeadPair and use its code; a
//    restore copies it in.
//  - Truncation changes counts only: the host knows which tokens each tensor retained.
//
// The host keeps per pair the merged tokens' positions and the pending ones (4 bytes a token, as
// DeviceRows mirrors positions: validation and truncation read them without a device round
// trip), and per (pair, head, tensor) the counts, the retention threshold, how many tokens fixed
// it (truncation's rule) and the indices of the retained tokens (γ of them). The arena holds the
// rest; laid out tight, it holds no more than the budget charges (the thresholds are charged but
// host-side).
//
// Arena layout (the cache's region, core/arena_regions.h): per (pair, head) capacities; the f16
// parts of every (pair, head) first (head_dim 64/128/256: multiples of 16 bytes, read with vector
// loads), then the 4-byte parts, without padding (the arena starts every region on 16 bytes).
// A head that outgrows a capacity grows it by half; when that does not fit, every head is
// re-planned to what it holds. Re-planning moves the live bytes in place (plan_repartition).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/representation.h"
#include "device_arena_plan.h"
#include "minicache_merge.h"
#include "repr/device_queries.h"

namespace kvsdk {

class DeviceMiniCache final : public Representation, private ArenaOwner {
 public:
  // The layer pairs of a 'minicache' cache on `ctx` (a device backend). Throws
  // KVSDK_E_UNSUPPORTED for '+kivi' or a head_dim the device kernels lack, KVSDK_E_INVALID_ARG
  // for a bad MiniCache configuration (as the host store).
  DeviceMiniCache(const Geometry& geometry, const kvsdk_policy& policy, Context& ctx);
  ~DeviceMiniCache() override;

  bool covers(uint32_t layer) const override;
  void add_bytes(uint32_t layer, uint64_t by_tier[KVSDK_TIER_SLOTS]) const override;
  uint64_t append_bound(uint32_t layer, size_t n_tokens) const override;
  void append(uint32_t layer, size_t n_tokens, const float* k, const float* v,
              const int32_t* positions) override;
  void attend(uint32_t layer, uint32_t kv_head, const float* q_rows, const int32_t* row_positions,
              size_t n_rows, float* out) const override;
  // One upload of every head's queries, the heads' kernels enqueued back to back, one download.
  void attend_heads(uint32_t layer, uint32_t n_kv, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const override;
  size_t head_tokens(uint32_t layer, uint32_t kv_head) const override;
  void read(uint32_t layer, uint32_t kv_head, float* k, float* v,
            int32_t* positions) const override;
  // MiniCacheRepresentation's rule (its statuses and messages).
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;
  void truncate(uint32_t layer, int32_t position) noexcept override;
  std::vector<TierRecord> save(uint32_t layer) const override;
  void restore(uint32_t layer, const std::vector<TierRecord>& records) override;
  uint64_t device_reserved_bytes() const override { return layout_.reserved; }

 private:
  // One tensor (0 keys, 1 values) of one head of a pair, as the host knows it.
  struct Tensor {
    size_t merged = 0;
    std::vector<uint32_t> retained;  // the tokens it retained (ascending indices)
    bool threshold_set = false;
    float threshold = 2.0f;
    size_t threshold_tokens = 0;  // MergedLayerPair's: the tokens that fixed the threshold
  };
  struct Pair {
    std::vector<int32_t> positions;  // the merged tokens' (every head holds them)
    std::vector<int32_t> pending;    // the leading layer's waiting rows' positions
    int pending_side = 0;            // meaningful when pending is not empty
    std::vector<Tensor> tensors;     // [head * 2 + tensor]
  };
  // Per (pair, head): the f16 parts, then the 4-byte parts (kRowParts of them first).
  enum Part : size_t {
    kKDir, kKRetPrev, kKRetCur, kVDir, kVRetPrev, kVRetCur, kPendK, kPendV, kRowParts,
    kKSlots = kRowParts, kKMagPrev, kKMagCur, kVSlots, kVMagPrev, kVMagCur, kPositions, kPendPos,
    kParts
  };
  // Rows (tokens) each part of a head has room for, or holds.
  struct Capacity {
    uint64_t tokens = 0, merged[2] = {0, 0}, retained[2] = {0, 0}, pending = 0;
    uint64_t rows(Part part) const;
    bool covers(const Capacity& o) const;
    Capacity max(const Capacity& o) const;
    bool operator==(const Capacity& o) const { return covers(o) && o.covers(*this); }
  };

  size_t pair_of(uint32_t layer) const { return (layer - boundary_) / 2; }
  int side_of(uint32_t layer) const { return int((layer - boundary_) % 2); }
  size_t pending_of(const Pair& p, int side) const {
    return p.pending_side == side ? p.pending.size() : 0;
  }
  size_t index(size_t pair, uint32_t head) const { return pair * geometry_.n_kv_heads + head; }
  Capacity held(size_t pair, uint32_t head) const;
  std::vector<Capacity> tight() const;
  cuda::ArenaPartition layout_for(const std::vector<Capacity>& capacity) const;
  char* slice(size_t pair, uint32_t head, Part part) const;
  // Makes the heads of `pair` able to hold `need` [head]; may re-plan the arena (the contents
  // stay). Throws KVSDK_E_BUDGET (nothing changed), KVSDK_E_BACKEND.
  void reserve(size_t pair, const std::vector<Capacity>& need);
  void relayout(const std::vector<Capacity>& capacity);
  uint64_t shrink_to_fit() override;
  void check_usable() const;

  // attend() of heads [first_head, first_head + n_heads): q_rows and out [n_heads][n_rows][dim].
  void attend_range(uint32_t layer, uint32_t first_head, uint32_t n_heads, const float* q_rows,
                    const int32_t* row_positions, size_t n_rows, float* out) const;
  // One layer's merged tier of a head, in the arena (call under a DeviceScope).
  backend::MiniCacheTier tier(size_t pair, int side, uint32_t head) const;
  // A host copy of one head's merged store (reads, snapshots).
  cpu::MiniCacheHeadPair host_head(size_t pair, uint32_t head) const;
  // A host copy of `n` pending f16 rows of one head from row `first`.
  void pending_rows(size_t pair, uint32_t head, size_t first, size_t n, uint16_t* k,
                    uint16_t* v) const;
  // `bytes` of staging for one head's part from row `first_row` (valid until the next call).
  char* stage(uint32_t head, Part part, size_t first_row, size_t bytes);
  // Stages one head's appended tokens (the pair `added` holds them) for `pair`.
  void stage_merged(size_t pair, uint32_t head, int tensor, const cpu::MergedLayerPair& added);

  Context& ctx_;
  const backend::Ops& device_;
  ArenaRegions& regions_;
  uint32_t boundary_;
  cpu::MiniCacheConfig merge_;
  std::vector<Pair> pairs_;
  cuda::ArenaPartition layout_;
  std::vector<Capacity> capacity_;  // [pair * heads + head]
  bool failed_ = false;  // a device copy failed after the store began to change
  mutable DeviceQueries queries_;
  mutable std::mutex copy_out_;  // host_head() may run on the context's pool (snapshots)
  // append()'s working memory, reused (one thread per cache): the pairs it appends to (keys,
  // values), their scratch, both layers' f32 rows of one head, the pending rows copied out, and
  // the staged uploads (bytes, and where each goes: head, part, first row).
  cpu::MergedLayerPair added_[2];
  cpu::MiniCacheScratch scratch_;
  std::vector<float> kp_, vp_, kc_, vc_;
  std::vector<uint16_t> pend_k_, pend_v_;
  struct Staged {
    uint32_t head;
    Part part;
    size_t first_row;
    size_t offset, bytes;  // in stage_
  };
  std::vector<char> stage_;
  std::vector<Staged> staged_;
  std::vector<backend::HostCopy> copies_;
  std::vector<Capacity> need_;
  struct Merge {  // what one head's tensor appended
    size_t merged = 0, retained = 0;
    float threshold = 2.0f;
  };
  std::vector<Merge> merges_;  // [head * 2 + tensor]
};

}  // namespace kvsdk
