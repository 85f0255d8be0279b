#include "device_arena.h"

#include "cuda_check.h"

namespace kvsdk::cuda {

DeviceArena::DeviceArena(int device, uint64_t budget_bytes, cudaStream_t stream)
    : device_(device), capacity_(budget_bytes), stream_(stream) {
  KVSDK_REQUIRE(budget_bytes > 0, "device arena budget must be > 0 bytes");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  const cudaError_t err = cudaMalloc(&base_, budget_bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation error is not sticky; clear it
    base_ = nullptr;
    fail(KVSDK_E_BACKEND, "cudaMalloc of the ", budget_bytes, "-byte device budget on device ",
         device, " failed: ", cudaGetErrorString(err));
  }
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);  // errors here cannot be reported; the context is going away
}

void DeviceArena::apply_plan(const ArenaPlan& plan) {
  ArenaPartition next = partition_arena(plan, capacity_);
  if (!partitioned_) {
    part_ = std::move(next);
    used_.assign(part_.slices.size(), 0);
    partitioned_ = true;
    return;
  }
  const std::vector<ArenaCopy> ops = plan_repartition(part_, next, used_);
  auto* bytes = static_cast<unsigned char*>(base_);
  for (const ArenaCopy& op : ops) {
    check_cuda(cudaMemcpyAsync(bytes + op.dst, bytes + op.src, op.bytes, cudaMemcpyDeviceToDevice,
                               stream_),
               "cudaMemcpyAsync (arena compaction)");
  }
  // Slice pointers change: callers may use them from any stream right after, so wait here
  // (re-partitioning is a planning step, not part of the decode hot path).
  if (!ops.empty()) check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  part_ = std::move(next);
}

size_t DeviceArena::index(size_t layer, size_t tier) const {
  if (!partitioned_) fail(KVSDK_E_STATE, "the device arena has no allocation plan yet");
  if (tier >= part_.tiers || layer * part_.tiers + tier >= part_.slices.size()) {
    fail(KVSDK_E_OUT_OF_RANGE, "arena slice (layer ", layer, ", tier ", tier,
         ") is outside the plan");
  }
  return layer * part_.tiers + tier;
}

void* DeviceArena::slice(size_t layer, size_t tier) const {
  return static_cast<unsigned char*>(base_) + part_.slices[index(layer, tier)].offset;
}
uint64_t DeviceArena::slice_bytes(size_t layer, size_t tier) const {
  return part_.slices[index(layer, tier)].bytes;
}

void DeviceArena::set_used(size_t layer, size_t tier, uint64_t bytes) {
  const size_t i = index(layer, tier);
  KVSDK_REQUIRE(bytes <= part_.slices[i].bytes, "slice (layer ", layer, ", tier ", tier,
                ") holds ", part_.slices[i].bytes, " bytes, not ", bytes);
  used_[i] = bytes;
}
uint64_t DeviceArena::used(size_t layer, size_t tier) const { return used_[index(layer, tier)]; }

ArenaStats DeviceArena::stats() const {
  ArenaStats s;
  s.capacity = capacity_;
  s.reserved = partitioned_ ? part_.reserved : 0;
  for (uint64_t u : used_) s.used += u;
  return s;
}

}  // namespace kvsdk::cuda
