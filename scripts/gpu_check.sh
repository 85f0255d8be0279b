#!/usr/bin/env bash
# Runs, in one go on a machine with an NVIDIA GPU, everything the CUDA backend (issue 7) still
# needs measured: builds the 'cuda' preset (with benchmarks), runs the whole test suite (the CUDA
# tests no longer skip: every kernel against the CPU reference, and whole caches of every policy
# that runs on CUDA (full, the eviction presets and their +kiviN overlays, kivi, specache, smallkv
# with its proxy on the CPU or on the GPU) on a CUDA context
# through the C API against the CPU reference backend, snapshots resumed across the two backends
# both ways), runs
# the CUDA benchmarks (kernels, and a 'full' and a 'kivi' cache's decode step through the C API),
# and writes every log plus the GPU, driver and date into the folder given as argument.
# See docs/gpu.md for what to record afterwards.
#
#   scripts/gpu_check.sh LOG_DIR [extra cmake -D options, e.g. -DCMAKE_CUDA_ARCHITECTURES=90]
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 LOG_DIR [cmake -D options]" >&2
  exit 2
fi
LOG_DIR=$(mkdir -p "$1" && cd "$1" && pwd)
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
JOBS=${JOBS:-$(nproc)}

{
  echo "date: $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "host: $(uname -srm)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || true
  nvcc --version | tail -2 || true
} | tee "$LOG_DIR/environment.txt"

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: nvidia-smi sees no GPU; the CUDA tests would only skip" |
    tee -a "$LOG_DIR/environment.txt"
  exit 1
fi

cmake --preset cuda -DKVSDK_BUILD_BENCHMARKS=ON "$@" 2>&1 | tee "$LOG_DIR/configure.log"
cmake --build --preset cuda -j"$JOBS" 2>&1 | tee "$LOG_DIR/build.log"

status=0
# The whole suite (CPU and CUDA); then the CUDA tests alone, verbose, so skips would be visible.
ctest --preset cuda 2>&1 | tee "$LOG_DIR/ctest_all.log" || status=1
./build/cuda/tests/cuda_backend_test --gtest_brief=0 2>&1 | tee "$LOG_DIR/cuda_backend_test.log" ||
  status=1
if grep -q "no CUDA device" "$LOG_DIR/cuda_backend_test.log"; then
  echo "gpu_check: CUDA tests skipped although a GPU is listed" |
    tee -a "$LOG_DIR/cuda_backend_test.log"
  status=1
fi

./build/cuda/tests/bench/cuda_bench --benchmark_format=console \
  --benchmark_out="$LOG_DIR/cuda_bench.json" --benchmark_out_format=json 2>&1 |
  tee "$LOG_DIR/cuda_bench.log" || status=1

echo "gpu_check: logs in $LOG_DIR (status $status)"
exit $status
