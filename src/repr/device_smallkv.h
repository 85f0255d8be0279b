// The 'smallkv' policy in a device backend's memory (ops().device_memory: CUDA). SmallKV
// (docs/papers.md) §4 with its rows in the context's device arena: per layer and KV head the full
// rows (f16 keys and values with their positions) and the marginal rows (f16 values with their
// positions). Everything else is the host store's own code (src/repr/smallkv_repr.h, through its
// rows_* seam): head matching (Eqs. 1-3), the rows' accumulated proxy attention, the 2:1:2
// selection, truncation rules and snapshot records, so a device cache keeps the rows a CPU cache
// keeps and writes the same snapshots.
//
// What runs where:
//  - Attention (Eq. 6): the backend's attend_smallkv over the full rows and smallkv_add_marginal
//    over the marginal rows, on the device; the proxy's probabilities of the step go up, one
//    float per marginal row and query row. The proxy link computes them where the proxy cache's
//    rows are (src/repr/smallkv_proxy.h): a CUDA proxy's on the device, a CPU proxy's on the
//    host by the reference table (proxy_ops()); both the reference's bits.
//  - Appends: converted to f16 on the host (the host store's rounding) and copied in.
//  - An eviction copies the heads it shrinks to the host, selects and rebuilds them there with
//    the host store's code, and copies the kept rows back at the commit; the arena is re-laid
//    for the new heads at the plan (room) and at the commit (moves), never beyond the budget.
//    So an eviction moves the shrunk heads' bytes twice over the bus; evict_slack makes it rare.
//  - Reads and snapshots copy a head out; a restore copies it in.
//  - Truncation cuts the newest full rows only (a suffix of each head, what appends in position
//    order give); anything else is refused.
//
// The rows' scores and positions are also on the host (the bookkeeping the host code reads), as
// are the head mapping and matching statistics: the budget charges them as on the CPU, so the
// device bytes (the arena: rows and positions) stay below what the cache is charged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/context.h"
#include "device_arena_plan.h"
#include "repr/device_queries.h"
#include "repr/smallkv_repr.h"

namespace kvsdk {

class DeviceSmallKv final : public SmallKvRepresentation, private ArenaOwner {
 public:
  // Every layer of a 'smallkv' cache on `ctx` (a device backend). Throws KVSDK_E_UNSUPPORTED for
  // a head_dim the device kernels lack or a backend without the SmallKV entries.
  DeviceSmallKv(const Geometry& geometry, const kvsdk_policy& policy, Context& ctx);
  ~DeviceSmallKv() override;

  uint64_t device_reserved_bytes() const override { return layout_.reserved; }
  // The host store's rule, and the cut must remove the newest full rows of every head only.
  std::string truncate_refusal(uint32_t layer, int32_t position) const override;

 private:
  bool rows_in_heads() const override { return false; }
  void rows_append(uint32_t layer, size_t n, const float* k, const float* v,
                   const int32_t* positions) override;
  void rows_full_keys(uint32_t layer, uint32_t kv_head, size_t count, float* out) const override;
  // One upload of the heads' queries, their kernels back to back, one download (of each half).
  void rows_attend_full(uint32_t layer, uint32_t first, uint32_t n, const float* q_rows,
                        const int32_t* row_positions, size_t n_rows, float* out) const override;
  void rows_add_marginal(uint32_t layer, uint32_t first, uint32_t n, const float* q_rows,
                         const int32_t* row_positions, size_t n_rows, const HeadWeights* weights,
                         float* out) const override;
  const Head& host_head(uint32_t layer, uint32_t kv_head, Head& scratch) const override;
  void rows_plan(uint32_t append_layer, size_t append_tokens) override;
  // A device failure here (the driver's error) cannot be reported: the store then refuses every
  // later call with KVSDK_E_BACKEND.
  void rows_commit() noexcept override;
  void rows_drop() noexcept override { planned_ = false; }
  void rows_restore(uint32_t layer, std::vector<Head>& heads) override;
  // A proxy on the host: the reference table computes its probabilities (the bits of the CUDA
  // table's smallkv_softmax, which a device proxy's run), in this store's host workspace.
  const backend::Ops& proxy_ops() const override;
  backend::Workspace& proxy_workspace() const override;

  // --- The arena -------------------------------------------------------------------------------
  // Per (layer, KV head): full keys, full values, marginal values (f16 rows), then full and
  // marginal positions (int32), each slice sized by the head's capacity in rows of its kind.
  enum Part : size_t { kFullK, kFullV, kMargV, kFullPos, kMargPos, kParts };
  struct Capacity {
    uint64_t full = 0, marg = 0;
    bool operator==(const Capacity& o) const { return full == o.full && marg == o.marg; }
  };
  size_t index(uint32_t layer, uint32_t head) const {
    return size_t(layer) * geometry_.n_kv_heads + head;
  }
  cuda::ArenaPartition layout_for(const std::vector<Capacity>& capacity) const;
  char* slice(uint32_t layer, uint32_t head, Part part) const;
  // What each head holds now (its counts), and the capacities that hold exactly that.
  Capacity held(uint32_t layer, uint32_t head) const;
  std::vector<Capacity> tight() const;
  // Re-lays the region to `capacity`, moving what each head holds; heads marked in `fresh`
  // ([layer * heads + head], may be null) move nothing (their rows are about to be rewritten).
  // Throws KVSDK_E_BUDGET (nothing changed) when the arena cannot hold it, KVSDK_E_BACKEND.
  void relayout(const std::vector<Capacity>& capacity, const std::vector<char>* fresh);
  uint64_t shrink_to_fit() override;
  // Uploads a head's rows (its host vectors, counts as they say) into its slices.
  void upload_head(uint32_t layer, uint32_t head, const Head& h);
  void check_usable() const;

  Context& ctx_;
  const backend::Ops& device_;
  ArenaRegions& regions_;
  cuda::ArenaPartition layout_;
  std::vector<Capacity> capacity_;  // [layer * heads + head]
  // rows_plan()'s capacities for the commit (while planned_), and the heads it rewrites.
  std::vector<Capacity> planned_capacity_;
  std::vector<char> planned_fresh_;
  bool planned_ = false;
  bool failed_ = false;  // a device copy failed inside a commit or a restore
  // Transfers: appends' f16 staging, attention's queries and outputs, the proxy's weights.
  std::vector<uint16_t> stage_k_, stage_v_;
  std::vector<backend::HostCopy> copies_;
  mutable DeviceQueries queries_;
  mutable DeviceScratch marginal_;  // smallkv_add_marginal's weights and output
  mutable std::vector<float> weights_;  // the heads' weights packed (one row per query row)
  mutable std::mutex copy_out_;  // host_head() may run on the context's pool (snapshots)
  mutable backend::WorkspaceHandle proxy_ws_;  // (the reference table's, made on first use)
};

}  // namespace kvsdk
