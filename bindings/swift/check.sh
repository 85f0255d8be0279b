#!/usr/bin/env bash
# Builds and tests the Swift package against a CMake build of libkvsdk when a Swift toolchain is
# on the PATH; otherwise says it was skipped and exits 77 (ctest: skipped).
# usage: check.sh [LIB_DIR]   (LIB_DIR: the folder holding libkvsdk.so, default ../../build/dev)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lib_dir=$(cd "${1:-$here/../../build/dev}" && pwd)
if ! command -v swift >/dev/null 2>&1; then
  echo "swift not found on PATH: Swift package check SKIPPED (bindings/swift not built)"
  exit 77
fi
export LD_LIBRARY_PATH=$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DYLD_LIBRARY_PATH=$lib_dir${DYLD_LIBRARY_PATH:+:$DYLD_LIBRARY_PATH}
scratch=${SWIFT_SCRATCH_PATH:-$lib_dir/bindings/swift-build}
flags=(--package-path "$here" --scratch-path "$scratch" -Xlinker "-L$lib_dir")
swift build "${flags[@]}"
swift test "${flags[@]}"
swift run "${flags[@]}" kvsdk-swift-sample | tee "$scratch/sample.log"
grep -q "sample finished: OK" "$scratch/sample.log"
