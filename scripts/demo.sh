#!/usr/bin/env bash
# README command 1: installs what is missing, builds the release preset and runs the main demo
# (a real model generates, suspends its KV cache to a snapshot, resumes in a new process and
# checks the continuation is identical). Arguments go to kvsdk-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --workflow --preset release >/dev/null
./build/release/samples/demo/kvsdk-demo "$@"
