#!/usr/bin/env bash
# Runs the Rust bindings' tests (unit, integration, doc tests including the README's Rust
# examples) against the library CMake built, then runs every sample in kvsdk/examples (parity.rs
# aside: run_parity.py drives it). Exit 77 (ctest: skipped) when cargo is missing.
# usage: cargo_test.sh LIB_DIR CARGO_TARGET_DIR SOURCE_DIR
set -euo pipefail
lib_dir=$1
target_dir=$2
src_dir=$3
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found on PATH: Rust binding tests SKIPPED (install Rust to run them)"
  exit 77
fi
export KVSDK_LIB_DIR=$lib_dir
export LD_LIBRARY_PATH=$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CARGO_TARGET_DIR=$target_dir
manifest=$src_dir/bindings/rust/Cargo.toml
cargo test --offline --manifest-path "$manifest" --workspace
for example in "$src_dir"/bindings/rust/kvsdk/examples/*.rs; do
  name=$(basename "$example" .rs)
  [ "$name" = parity ] && continue
  echo "+ cargo run --example $name"
  cargo run --quiet --offline --manifest-path "$manifest" --example "$name"
done
