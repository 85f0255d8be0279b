// The host execution shim's scheduler: runs a CUDA grid on the calling CPU thread, its blocks one
// after another and the threads of a block as cooperatively scheduled fibers, so that
// __syncthreads, __syncthreads_or and warp shuffles wait for the other threads exactly as on a
// GPU (a thread runs until it reaches a barrier, then the next one runs).
//
// What this shows and what it cannot (docs/gpu.md): kernel bodies execute with real indices,
// shared memory, barriers and shuffles, so index arithmetic, bounds (under ASan), barrier
// divergence (reported as an error) and the numerics are checked. Races between blocks or between
// threads that do not synchronise, memory-model effects, timing and occupancy are not: every
// schedule here is one legal interleaving among many.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda_host {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The running thread's coordinates (valid inside a kernel only).
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();

// Runs body(arg) once per thread of every block. Returns false (and sets *error) for an invalid
// configuration (empty grid, more than 1024 threads per block) or when a block cannot make
// progress (threads waiting at different barriers: divergence); nothing is run for the former.
bool run_grid(Dim3 grid, Dim3 block, void (*body)(void*), void* arg, const char** error);

// Barriers, called from kernel code through the cuda_runtime.h shim.
// __syncthreads_or: every live thread of the block arrives; returns the OR of their predicates.
int block_barrier(int predicate);
// A warp shuffle: deposits `value` for this lane, waits for the warp's other live lanes, returns
// the value deposited by lane `src_lane` of the same warp (own value if that lane has exited or
// is outside the warp).
uint64_t warp_exchange(uint64_t value, unsigned src_lane);
// Lane of the running thread within its warp.
unsigned lane_id();

}  // namespace kvsdk::cuda_host
