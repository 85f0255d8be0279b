#!/usr/bin/env bash
# Packs, on a machine without a GPU, what a GPU machine that cannot build kvsdk (no FlatBuffers,
# zstd, Highway, GoogleTest or Google Benchmark development files there, as on the machines lent
# to this project) needs to run the CUDA checks: the 'cuda' preset's test and benchmark binaries
# that touch the CUDA backend, stripped, the shared libraries they need beyond glibc and the
# CUDA driver/cuBLAS (which the GPU machine has), and a run script.
#
#   scripts/gpu_pack.sh DIR        # builds the 'cuda' preset with benchmarks, fills DIR
#   (on the GPU machine, from the directory above DIR)  bash DIR/run.sh LOG_DIR
#
# The run script (below) writes every log into LOG_DIR; it needs a few minutes on an H100/H200
# (tests, benchmarks, compute-sanitizer's memcheck and racecheck, Nsight Compute on the decode
# kernels).
# scripts/gpu_check.sh remains the check for a GPU machine that can build.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$ROOT"

cmake --preset cuda -DKVSDK_BUILD_BENCHMARKS=ON >/dev/null
cmake --build --preset cuda -j"$(nproc)" --target cuda_backend_test core_test backend_ops_test \
  cuda_bench

rm -rf "$DIR/bin" "$DIR/lib"
mkdir -p "$DIR/bin" "$DIR/lib"
for t in tests/cuda_backend_test tests/core_test tests/backend_ops_test tests/bench/cuda_bench; do
  cp "build/cuda/$t" "$DIR/bin/"
done
strip "$DIR"/bin/*
# Everything ldd resolves except glibc's own libraries, the kernel's vDSO and the CUDA libraries
# that must match the GPU machine's driver (cuBLAS, taken from that machine).
ldd "$DIR"/bin/* | awk '/=> \// {print $1, $3}' | sort -u |
  grep -Ev '^(libc|libm|libdl|libpthread|librt|ld-linux[^ ]*|libcublas[^ ]*|libcuda)\.so' |
  while read -r name path; do cp -L "$path" "$DIR/lib/$name"; done

cat >"$DIR/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the packed CUDA checks on a GPU machine; logs into $1. No background jobs: a shell that
# waits for them would also wait for a logging process substitution.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LOG=$(mkdir -p "${1:?usage: run.sh LOG_DIR}" && cd "$1" && pwd)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
} | tee "$LOG/environment.txt"
# The tests name paths inside the source tree they were built in.
SRC=$(cat "$HERE/source_dir")
[[ -e "$SRC" ]] || { mkdir -p "$(dirname "$SRC")" && ln -s "$(cd "$HERE/.." && pwd)" "$SRC"; }
CUDIRS=$(find /usr/local /opt -name 'libcublas.so.1*' 2>/dev/null | xargs -r -n1 dirname |
         sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${CUDIRS}$HERE/lib"
B=$HERE/bin
status=0
for t in cuda_backend_test core_test backend_ops_test; do
  timeout 300 "$B/$t" --gtest_brief=1 >"$LOG/$t.log" 2>&1 || status=1
  echo "$t: $(grep -E '^\[  (PASSED|FAILED) ' "$LOG/$t.log" | tr '\n' ' ')"
done
grep -q "no CUDA device" "$LOG/cuda_backend_test.log" && { echo "CUDA tests skipped"; status=1; }
timeout 400 "$B/cuda_bench" --benchmark_out="$LOG/cuda_bench.json" \
  --benchmark_out_format=json >"$LOG/cuda_bench.log" 2>&1 || status=1
grep -E '^(Device|Kivi|Decode|Cache)' "$LOG/cuda_bench.log"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ -n "$CS" ]]; then
  timeout 300 "$CS" --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$B/cuda_backend_test" --gtest_brief=1 >"$LOG/memcheck.log" 2>&1 || status=1
  timeout 200 "$CS" --tool racecheck --error-exitcode 9 "$B/cuda_backend_test" --gtest_brief=1 \
    --gtest_filter='Cuda*:Shapes/CudaDecodeAttention*:Bits/CudaKiviQuant*' \
    >"$LOG/racecheck.log" 2>&1 || status=1
  grep -h "SUMMARY" "$LOG/memcheck.log" "$LOG/racecheck.log"
fi
# One launch of each decode kernel under Nsight Compute (limiter, occupancy, stall reasons), at
# 32k tokens, batch 1: what the benchmark's figures alone do not say.
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null |
      head -1)
if [[ -n "$NCU" ]]; then
  for f in DecodeFp16 DecodeKivi2; do
    timeout 120 "$NCU" -k regex:decode_split --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis "$B/cuda_bench" \
      --benchmark_filter="^$f/tokens/batch/32768/1/" >"$LOG/ncu_$f.log" 2>&1 || status=1
  done
fi
echo "run.sh: logs in $LOG (status $status)"
exit $status
EOF
chmod +x "$DIR/run.sh"
echo "$ROOT" >"$DIR/source_dir"
git rev-parse HEAD >"$DIR/commit" 2>/dev/null || true
du -sh "$DIR"
