#!/usr/bin/env bash
# README command 1: installs what is missing, builds the release preset and runs the main demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --workflow --preset release >/dev/null
./build/release/samples/c/kvsdk-c-sample "$@"
